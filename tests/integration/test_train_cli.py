"""`psflow train` end to end: real processes, real gRPC, bundled a9a data."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from support import A9A, A9A_T, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def logged_steps(run_dir: Path) -> list[int]:
    steps: list[int] = []
    for log in sorted((run_dir / "logs").glob("worker-*.log")):
        steps += [int(s) for s in re.findall(r"\bstep=(\d+)", log.read_text())]
    return steps


def leftover_processes(marker: str) -> list[int]:
    """Pids of live processes whose command line mentions ``marker``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace")
            except OSError:
                continue
            if marker in cmdline:
                pids.append(int(entry))
    return pids


def test_a9a_ftrl_two_ps_two_workers(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--optimizer", "ftrl",
                "--ps", "2", "--workers", "2", "--epochs", "3", "--log-every", "10", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["eval"]["auc"] >= 0.895, metrics["eval"]
    assert metrics["eval"]["examples"] == 16281
    assert metrics["examples"] == 3 * 32561
    for key in ("global_step", "examples", "wall_seconds", "examples_per_sec"):
        assert metrics[key] > 0
    final = metrics["global_step"]
    # 32561 examples split over 2 workers, 3 epochs, batch 512 -> 3 * (32 + 32) steps.
    assert final == 3 * (-(-16281 // 512) + -(-16280 // 512))
    steps = logged_steps(out)
    assert sorted(steps) == list(range(10, final + 1, 10)), "each multiple of --log-every logged exactly once"
    for name in ("ps-0", "ps-1", "worker-0", "worker-1"):
        assert (out / "logs" / f"{name}.log").exists()
    assert "examples/s" in r.stderr  # progress lines
    assert json.loads(r.stdout)["eval"]["auc"] == metrics["eval"]["auc"]
    assert leftover_processes(str(out)) == []


def test_partitioned_greedy_three_workers(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--optimizer", "adagrad",
                "--ps", "2", "--workers", "3", "--partitions", "3", "--placement", "greedy", "--epochs", "2",
                "--log-every", "7", "--output", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["eval"]["auc"] >= 0.89
    steps = logged_steps(out)
    assert sorted(steps) == list(range(7, metrics["global_step"] + 1, 7))
    partitions = {k for ps in metrics["ps"] for k in ps["partitions"]}
    assert {"weights/part_0", "weights/part_1", "weights/part_2"} <= partitions
    assert "examples/s" not in r.stderr


def test_max_steps_stops_training(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "2",
                "--epochs", "5", "--max-steps", "40", "--log-every", "5", "--output", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    final = json.loads((out / "metrics.json").read_text())["global_step"]
    assert 40 <= final <= 41  # pushes in flight on the other worker may land (documented)
    assert sorted(s for s in logged_steps(out) if s <= 40) == list(range(5, 41, 5))


def test_bad_line_fails_naming_file_line_and_task(tmp_path: Path) -> None:
    """A small input is read whole before any task starts (a bad line further on, found by a worker,
    is reported by the worker's one line: tests/integration/test_cli_errors.py)."""
    bad = tmp_path / "bad.libsvm"
    lines = A9A.read_text().splitlines(keepends=True)[:3000]
    lines[2500] = "+1 3:1 oops 9:1\n"
    bad.write_text("".join(lines))
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(bad), "--num-features", "124", "--ps", "1", "--workers", "1",
                "--output", str(out), "--quiet", timeout=120)
    assert r.returncode == 1
    assert f"psflow train: error: --train: {bad}:2501: " in r.stderr, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert not (out / "logs").exists() or not list((out / "logs").glob("*.log")), "a task was started"
    assert leftover_processes(str(out)) == []


def test_unknown_optimizer_and_missing_train_are_clear_errors(tmp_path: Path) -> None:
    r = run_cli("train", "--num-features", "124", "--output", str(tmp_path))
    assert r.returncode == 1 and "--train is required" in r.stderr
    r = run_cli("train", "--train", str(A9A), "--learning-rate", "-1", "--output", str(tmp_path))
    assert r.returncode == 1 and "learning_rate" in r.stderr


@pytest.mark.parametrize("flags, message", [
    (("--hidden", "256,x"), "--hidden '256,x': want layer sizes like 256,128"),
    (("--hidden", "0"), "--hidden '0': want layer sizes >= 1"),
    (("--wide-optimizer", "ftrl:lr"), "--wide-optimizer: optimizer 'ftrl:lr': 'lr' is not KEY=VALUE"),
    (("--deep-optimizer", "adagrad:rho=1"), "--deep-optimizer: optimizer 'adagrad': unknown hyperparameter 'rho'"),
])
def test_deep_model_flags_fail_before_any_task_starts(tmp_path: Path, flags: tuple[str, ...], message: str) -> None:
    """A bad --hidden or optimizer is one line from the launcher (the model is built before any process starts)."""
    pytest.importorskip("torch")
    r = run_cli("train", "--train", str(A9A), "--model", "dnn", *flags, "--output", str(tmp_path / "run"))
    assert r.returncode == 1 and message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "run" / "logs").exists()


@pytest.mark.parametrize(
    "mode_args, driver_logs",
    [
        (["--mode", "sync"], "worker-*.log"),
        (["--mode", "ssp", "--staleness", "2"], "worker-*.log"),
        (["--replication", "in-graph"], "client-0.log"),
        (["--replication", "in-graph", "--mode", "sync"], "client-0.log"),
        (["--mode", "sync", "--transport", "tcp"], "worker-*.log"),
        (["--mode", "ssp", "--transport", "tcp"], "worker-*.log"),
    ],
)
def test_a9a_every_mode_and_replication(tmp_path: Path, mode_args: list[str], driver_logs: str) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--ps", "2",
                "--workers", "2", "--epochs", "3", "--log-every", "5", "--output", str(out), "--quiet", *mode_args)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["eval"]["auc"] >= 0.895, metrics["eval"]
    assert metrics["examples"] == 3 * 32561
    steps = []
    for log in (out / "logs").glob(driver_logs):
        steps += [int(s) for s in re.findall(r"\bstep=(\d+)", log.read_text())]
    assert sorted(steps) == list(range(5, metrics["global_step"] + 1, 5))
    if "sync" in mode_args:
        assert metrics["global_step"] == 96  # each step aggregates both workers' batches
    assert leftover_processes(str(out)) == []


def test_in_process_fast_path_trains_like_the_cluster(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--in-process", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--ps", "2",
                "--partitions", "3", "--epochs", "3", "--log-every", "20", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["eval"]["auc"] >= 0.895 and metrics["examples"] == 3 * 32561
    assert metrics["global_step"] == 3 * -(-32561 // 512)
    assert {"weights/part_0", "weights/part_1", "weights/part_2"} <= {k for ps in metrics["ps"] for k in ps["partitions"]}
    r = run_cli("train", "--in-process", "--workers", "2", "--train", str(A9A), "--output", str(tmp_path / "x"))
    assert r.returncode == 1 and "--in-process runs one worker" in r.stderr


def test_in_process_takes_the_ssp_flags_the_user_typed(tmp_path: Path) -> None:
    """``--in-process --mode ssp --staleness 3`` was refused '--staleness 3 is for --mode ssp (this run: --mode
    async ...)', after the in-process banner: with one worker the fast path runs ssp as async (no worker to wait for)
    and the mode check of d6dfe2f then refused the ssp flags the user typed with --mode ssp."""
    out = tmp_path / "run"
    r = run_cli("train", "--in-process", "--train", str(A9A), "--num-features", "124", "--mode", "ssp",
                "--staleness", "3", "--sync-timeout", "5", "--on-timeout", "proceed", "--max-steps", "7",
                "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["global_step"] == 7
    # What the user asked for, and that one worker made it run as async: metrics.json said "mode": "async".
    assert (metrics["mode"], metrics["staleness"], metrics["ran_as"]) == ("ssp", 3, "async")
    status = json.loads((out / "status.json").read_text())["run"]
    assert (status["mode"], status["staleness"], status["ran_as"]) == ("ssp", 3, "async")
    assert "--mode ssp --staleness 3 (runs as async: one worker)" in r.stderr  # the banner
    log = (out / "logs" / "worker-0.log").read_text()
    assert log.count("--mode ssp with one worker runs as async") == 1, log[-3000:]
    # psflow status of the run directory, the text of status.json: it said "(ssp, in-process, ...)", nothing of
    # the staleness nor of what ran, which status.json has.
    shown = run_cli("status", str(out))
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "(ssp --staleness 3, ran as async, in-process, model logistic)" in shown.stdout, shown.stdout


def test_a_cluster_ssp_run_reports_its_staleness(tmp_path: Path) -> None:
    """A cluster ``--mode ssp --staleness 3`` run's metrics.json and status.json had "mode": "ssp" and no staleness,
    which an --in-process one reports (7c451d6): both now take it from one source, SyncSettings.reported."""
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "2", "--mode", "ssp",
                "--staleness", "3", "--max-steps", "7", "--quiet", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["mode"], metrics["staleness"]) == ("ssp", 3) and "ran_as" not in metrics, metrics
    status = json.loads((out / "status.json").read_text())["run"]
    assert (status["mode"], status["staleness"]) == ("ssp", 3) and "ran_as" not in status, status
    shown = run_cli("status", str(out))
    assert "(ssp --staleness 3, between-graph, model logistic)" in shown.stdout, shown.stdout


def test_in_process_sync_reports_sync(tmp_path: Path) -> None:
    """One in-process worker in sync mode runs sync (each step aggregates its one gradient): nothing renamed."""
    out = tmp_path / "run"
    r = run_cli("train", "--in-process", "--train", str(A9A), "--num-features", "124", "--mode", "sync",
                "--max-steps", "7", "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["mode"] == "sync" and "ran_as" not in metrics and "staleness" not in metrics
    assert {ps["mode"] for ps in metrics["ps"]} == {"sync"}
    assert json.loads((out / "status.json").read_text())["run"]["mode"] == "sync"
    assert "--mode sync," in r.stderr and "runs as" not in r.stderr
