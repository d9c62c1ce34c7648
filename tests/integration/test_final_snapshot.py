"""Every way a run ends writes metrics.json, status.json and metrics.prom from one final snapshot (issue 25,
items 4-6): after a run with checkpoints and faults, after ``--max-failed-saves`` failed it, after a SIGTERM,
``--in-process`` (and its resume: per-run counts), and in-graph (the final loss is the last step's).

Real ``psflow train`` runs on a9a; every process started is ended by pid (the helpers of
test_checkpoint_safety.py and test_launcher_signals.py).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support import A9A, A9A_T, REPO, run_cli, wait_until
from test_checkpoint_safety import background_run, read_only, wait_for

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: The figures every file of a run's end shares: metrics.json key -> status.json key.
SHARED = ("global_step", "examples", "examples_this_run", "examples_per_sec", "loss", "last_step_loss", "eval",
          "checkpoints", "faults", "restarts", "hangs")
#: metrics.json key -> the Prometheus sample of metrics.prom that says the same.
PROM = {"global_step": "psflow_global_step", "examples": "psflow_examples_total",
        "examples_this_run": "psflow_examples_this_run", "examples_per_sec": "psflow_examples_per_second",
        "loss": "psflow_loss", "last_step_loss": "psflow_last_step_loss"}


def parse_prom(text: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples if not s.labels}


def run_files(out: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
    metrics = json.loads((out / "metrics.json").read_text())
    status = json.loads((out / "status.json").read_text())
    return metrics, status, parse_prom((out / "metrics.prom").read_text())


def assert_one_snapshot(out: Path, phase: str) -> dict[str, Any]:
    """The three files agree on every shared figure; returns metrics.json."""
    pytest.importorskip("prometheus_client")
    metrics, status, prom = run_files(out)
    assert metrics["phase"] == status["run"]["phase"] == phase, (metrics.get("phase"), status["run"])
    for key in SHARED:
        assert status.get(key) == metrics.get(key), (key, status.get(key), metrics.get(key))
    for key, sample in PROM.items():
        if metrics.get(key) is None:
            assert sample not in prom, (key, prom.get(sample))
        else:
            assert prom[sample] == pytest.approx(metrics[key]), (key, prom[sample], metrics[key])
    ledger = metrics.get("checkpoints")
    if ledger is not None:
        assert prom["psflow_checkpoints_saved_total"] == ledger["saved"] == metrics["checkpoints_saved"]
        assert prom["psflow_checkpoints_failed_total"] == ledger["failed"] == metrics["checkpoints_failed"]
        if ledger["last_saved_step"] is not None:
            assert prom["psflow_checkpoint_last_saved_step"] == ledger["last_saved_step"]
    assert prom["psflow_faults_total"] == len(metrics.get("faults", []))
    if isinstance(metrics.get("eval"), dict):
        assert prom["psflow_eval_auc"] == pytest.approx(metrics["eval"]["auc"])
    # The run is over: no task shows as running (issue 30, item 6; the ps tasks used to show "up").
    states = {t["task"]: t["state"] for t in status["tasks"]}
    assert not set(states.values()) & {"up", "starting", "unresponsive", "unknown", "unreachable"}, states
    return metrics


def test_a_run_with_checkpoints_and_faults_reports_one_snapshot(tmp_path: Path) -> None:
    """The issue's repro of item 5 (status.json: 3 saves, an older newest checkpoint; metrics.json: 7) and of the
    demo's ``loss n/a``: a worker and ps task 0 (which holds the ledger) killed and restarted mid-run."""
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--optimizer", "ftrl",
                "--ps", "2", "--workers", "2", "--epochs", "3", "--batch-size", "64", "--checkpoint-dir", str(ckpt),
                "--save-checkpoints-steps", "100", "--restart-policy", "on-failure",
                "--chaos", "kill:worker:1@step=200", "--chaos", "kill:ps:0@step=600", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = assert_one_snapshot(out, "finished")
    assert len(metrics["faults"]) == 2 and len(metrics["restarts"]) == 2, (metrics["faults"], metrics["restarts"])
    # The restore's generation reads as the time of the restore (issue 30, item 6), within the run.
    status = json.loads((out / "status.json").read_text())
    for row in status["ps"]:
        assert row["generation"] > 0 and status["run"]["started"] <= row["restored_at"] <= status["time"], row
    ledger = metrics["checkpoints"]
    newest = latest_checkpoint(str(ckpt))
    assert ledger["last_saved_path"] == newest and ledger["last_saved_step"] <= metrics["global_step"], (ledger, newest)
    # The ledger on ps task 0 restarted with it from its file (state/ps-0/checkpoint_ledger.json), and a save's
    # report the dead task missed was sent again with the next: the count is every save the chiefs logged
    # (before, the saves between the launcher's last reading of the ledger, every 2 s, and the kill were missed).
    # (The chief's duties may move to the other worker meanwhile: every worker's log is read.)
    logs = "".join(p.read_text() for p in (out / "logs").glob("worker-*.log"))
    saves = [int(step) for step in re.findall(r": saved checkpoint \S+ at step (\d+)", logs)]
    assert ledger["saved"] == len(saves), (ledger, saves)
    assert metrics["examples"] == metrics["examples_this_run"] == 3 * 32_561
    # The last line: this run's figures, the last step's loss (never n/a), the eval's log-loss named so.
    done = [line for line in r.stderr.splitlines() if line.startswith("psflow: done:")]
    assert done == [f"psflow: done: global_step {metrics['global_step']} | {metrics['examples']:,} examples in "
                    f"{metrics['wall_seconds']:.1f} s | {metrics['examples_per_sec']:,.0f} examples/s | last step's "
                    f"loss {metrics['last_step_loss']:.4f} | eval logloss {metrics['eval']['logloss']:.4f}, "
                    f"AUC {metrics['eval']['auc']:.4f}"], r.stderr[-3000:]
    assert not re.search(r"-[\d,]+ examples/s", r.stderr), r.stderr[-3000:]  # no negative rate across the restore


def listed_checkpoints(ckpt: Path) -> list[str]:
    """The checkpoints the directory's pointer lists (none while it is missing or being replaced)."""
    try:
        return list(json.loads((ckpt / "checkpoint").read_text())["all"])
    except (OSError, ValueError, KeyError):
        return []


def test_a_run_failed_by_max_failed_saves_writes_its_snapshot(tmp_path: Path) -> None:
    """The issue's repro of item 4: ``--max-failed-saves`` ended the run and no metrics.json or metrics.prom was
    written, though docs/checkpoints.md promises ``checkpoints_failed`` there.

    The directory is made read-only once the pointer lists the initial checkpoint: that save has written its
    last file then (and is reported to the ledger before the next save starts), so it is counted as saved and
    every later save fails. (Waiting for :func:`latest_checkpoint` raced it: that is true as soon as
    ckpt-000000000's manifest is in, before the pointer's switch, and the initial save then failed too.)"""
    ckpt, out = tmp_path / "ckpt", tmp_path / "run"
    ckpt.mkdir()
    with background_run(out, "--epochs", "500", "--batch-size", "32", "--checkpoint-dir", str(ckpt),
                        "--save-checkpoints-steps", "20", "--max-failed-saves", "2") as run:
        wait_for("the initial checkpoint in the pointer", lambda: bool(listed_checkpoints(ckpt)), run)
        with read_only(ckpt):
            _, stderr = run.communicate(timeout=250)
    assert run.returncode == 1, stderr[-3000:]
    assert "(--max-failed-saves 2): stopping" in stderr, stderr[-3000:]
    metrics = assert_one_snapshot(out, "failed")
    assert metrics["checkpoints_failed"] >= 2 and metrics["checkpoints"]["failed_in_a_row"] >= 2, metrics["checkpoints"]
    assert metrics["checkpoints_saved"] >= 1 and metrics["checkpoints"]["last_saved_path"], metrics["checkpoints"]
    assert isinstance(metrics["global_step"], int) and metrics["global_step"] > 0
    assert "max-failed-saves" in metrics["error"] and metrics["exit_code"] == 1
    assert {t["task"] for t in metrics["tasks"]} == {"/job:ps/task:0", "/job:ps/task:1", "/job:worker/task:0",
                                                     "/job:worker/task:1"}


def test_an_interrupted_run_writes_its_snapshot(tmp_path: Path) -> None:
    ckpt, out = tmp_path / "ckpt", tmp_path / "run"
    with background_run(out, "--epochs", "500", "--batch-size", "32", "--checkpoint-dir", str(ckpt),
                        "--save-checkpoints-steps", "20") as run:
        # Two checkpoints listed: the chief reports a save to the ledger after its pointer names it, and reports
        # it before it starts the next save; so the first save is counted however slowly the machine runs.
        wait_for("two checkpoints", lambda: len(listed_checkpoints(ckpt)) >= 2, run)
        os.kill(run.pid, signal.SIGTERM)
        _, stderr = run.communicate(timeout=120)
    assert run.returncode == 143, stderr[-3000:]
    metrics = assert_one_snapshot(out, "interrupted")
    assert metrics["interrupted"] == "SIGTERM" and metrics["exit_code"] == 143
    assert f"interrupted by SIGTERM at global_step {metrics['global_step']} " in stderr, stderr[-3000:]
    assert metrics["checkpoints"]["saved"] >= 1 and metrics["checkpoints"]["last_saved_path"]


def test_in_process_runs_write_their_snapshot_and_a_resume_reports_this_runs_counts(tmp_path: Path) -> None:
    """The issue's repro: after a resume, the last line's examples/s counted the examples the earlier run trained."""
    ckpt = tmp_path / "ckpt"
    common = ("train", "--in-process", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124",
              "--checkpoint-dir", str(ckpt), "--batch-size", "256")
    first = run_cli(*common, "--epochs", "1", "--output", str(tmp_path / "first"))
    assert first.returncode == 0, first.stderr[-3000:]
    before = assert_one_snapshot(tmp_path / "first", "finished")
    assert before["examples"] == before["examples_this_run"] == 32_561 and before["resumed_from"] is None
    second = run_cli(*common, "--epochs", "2", "--output", str(tmp_path / "second"))
    assert second.returncode == 0, second.stderr[-3000:]
    after = assert_one_snapshot(tmp_path / "second", "finished")
    assert after["resumed_from"]["path"] == before["checkpoints"]["last_saved_path"]
    assert (after["examples"], after["examples_at_start"], after["examples_this_run"]) == (2 * 32_561, 32_561, 32_561)
    assert after["examples_per_sec"] == pytest.approx(32_561 / after["workers"][0]["wall_seconds"])
    name = os.path.basename(after["resumed_from"]["path"])
    assert (f"| 32,561 examples in {after['wall_seconds']:.1f} s (this run; the model's 65,122 include 32,561 from "
            f"{name}) | {after['examples_per_sec']:,.0f} examples/s |") in second.stderr, second.stderr[-3000:]


def test_an_interrupted_in_process_run_writes_its_snapshot(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "psflow", "train", "--in-process", "--train", str(A9A),
                             "--num-features", "124", "--epochs", "500", "--log-every", "10", "--output", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        log = out / "logs" / "worker-0.log"
        wait_until(lambda: proc.poll() is not None or (log.exists() and "step=" in log.read_text()), "training")
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        os.kill(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
    assert proc.returncode == 143, stderr[-3000:]
    metrics = assert_one_snapshot(out, "interrupted")
    assert metrics["interrupted"] == "SIGTERM" and metrics["global_step"] > 0
    assert f"interrupted by SIGTERM at global_step {metrics['global_step']} " in stderr, stderr[-3000:]


def test_in_graph_runs_report_the_last_steps_loss(tmp_path: Path) -> None:
    """The issue's repro: an in-graph run's last line said 0.5840 while its client logged ~0.35. In sync in-graph
    the client pushes each step with the mean of the towers' losses and logs it (--log-every 1)."""
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--replication", "in-graph", "--mode", "sync",
                "--ps", "1", "--workers", "2", "--epochs", "1", "--log-every", "1", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = assert_one_snapshot(out, "finished")
    logged = re.findall(r"in-graph client: step=(\d+) loss=([\d.]+)", (out / "logs" / "client-0.log").read_text())
    step, loss = logged[-1]
    assert int(step) == metrics["global_step"]
    assert f"{metrics['last_step_loss']:.4f}" == loss and math.isfinite(metrics["loss"])
    assert f"| last step's loss {loss} |" in r.stderr or r.stderr.rstrip().endswith(f"last step's loss {loss}"), \
        r.stderr[-2000:]


def test_psflow_status_of_a_finished_run_shows_the_final_figures(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "1", "--epochs", "1",
                "--no-status", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "psflow: status http" not in r.stderr  # --no-status serves nothing, yet leaves the files
    metrics = assert_one_snapshot(out, "finished")
    shown = run_cli("status", str(out))
    assert shown.returncode == 0, shown.stderr
    assert f"global_step {metrics['global_step']:,} | examples {metrics['examples']:,}" in shown.stdout, shown.stdout
    assert "finished" in shown.stdout


def test_a_run_resumed_at_its_final_step_names_the_checkpoint_it_restored(tmp_path: Path) -> None:
    """A run resumed with nothing left to train saves nothing: its metrics said ``last_saved_path: null`` (no
    checkpoint) while the directory held the one it restored. The newest is that one, marked as restored:
    ``last_saved_by_this_run`` false, and ``saved`` still counts this run's saves (none)."""
    ckpt = tmp_path / "ckpt"
    common = ("train", "--train", str(A9A), "--num-features", "124", "--checkpoint-dir", str(ckpt),
              "--batch-size", "512", "--epochs", "1")
    first = run_cli(*common, "--in-process", "--output", str(tmp_path / "first"))
    assert first.returncode == 0, first.stderr[-3000:]
    saved = assert_one_snapshot(tmp_path / "first", "finished")["checkpoints"]
    assert saved["last_saved_by_this_run"] is True and saved["last_saved_path"] == latest_checkpoint(str(ckpt))
    for how, extra in (("cluster", ("--ps", "1", "--workers", "1")), ("in-process", ("--in-process",))):
        again = run_cli(*common, *extra, "--output", str(tmp_path / how))
        assert again.returncode == 0, (how, again.stderr[-3000:])
        metrics = assert_one_snapshot(tmp_path / how, "finished")
        assert metrics["resumed_from"]["path"] == saved["last_saved_path"], how
        assert metrics["checkpoints"] == {"saved": 0, "failed": 0, "failed_in_a_row": 0,
                                          "last_saved_step": saved["last_saved_step"],
                                          "last_saved_path": saved["last_saved_path"],
                                          "last_saved_by_this_run": False}, how
    shown = run_cli("status", str(tmp_path / how))
    assert (f"checkpoints: 0 saved, 0 failed; newest at step {saved['last_saved_step']}: {saved['last_saved_path']} "
            "(restored at the start, saved by an earlier run)") in shown.stdout, shown.stdout + shown.stderr


def test_a_run_whose_chief_died_as_its_save_completed_names_that_checkpoint_not_the_restored_one(
        tmp_path: Path) -> None:
    """A resumed run's chief exits once its first save is current, before the ledger counts it (the run fails):
    the directory's newest is that save, but the snapshot named the checkpoint restored at the start as the
    newest, 'saved by an earlier run'."""
    ckpt = tmp_path / "ckpt"
    common = ("train", "--train", str(A9A), "--num-features", "124", "--checkpoint-dir", str(ckpt), "--ps", "1",
              "--workers", "1", "--batch-size", "512", "--save-checkpoints-steps", "20")
    first = run_cli(*common, "--max-steps", "30", "--output", str(tmp_path / "first"))
    assert first.returncode == 0, first.stderr[-3000:]
    restored = latest_checkpoint(str(ckpt))
    again = run_cli(*common, "--max-steps", "90", "--fault-point", "pointer_switched", "--output", str(tmp_path / "again"))
    assert again.returncode == 1, again.stderr[-3000:]
    newest = latest_checkpoint(str(ckpt))
    assert newest is not None and newest != restored
    metrics = assert_one_snapshot(tmp_path / "again", "failed")
    assert metrics["resumed_from"]["path"] == restored
    checkpoints = metrics["checkpoints"]
    assert (checkpoints["last_saved_path"], checkpoints["last_saved_by_this_run"]) == (newest, True), checkpoints
    assert checkpoints["last_saved_step"] == read_manifest(newest).global_step
