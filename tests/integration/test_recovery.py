"""Recovery acceptance (issue 6), lean: kill -9 one task of a 3-epoch a9a run with frequent
checkpoints and --restart-policy on-failure; the run must end as an undisturbed one would.

One random point per role here (non-chief worker, ps task 1, ps task 0, chief); all of the issue
(5 per role) run in ``benchmarks/drill_recovery.py``, results in benchmarks/results/recovery_drill.md.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from support import A9A, A9A_T, REPO, TOKEN, run_cli

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.variables import read_variables
from psflow.errors import CheckpointError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(200)]

A9A_RECORDS = 32561
EPOCHS = 3
#: (--chaos target, the steps a fault may be placed at); a run has ~3,050 steps.
ROLES = {"worker": "worker:1", "ps": "ps:1", "ps0": "ps:0", "chief": "chief"}


def train(out: Path, *extra: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    """``psflow train`` on a9a: 2 ps, 2 workers, batch 32, 3 epochs, checkpoints every 250 steps."""
    args = ["train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--ps", "2",
            "--workers", "2", "--batch-size", "32", "--epochs", str(EPOCHS), "--log-every", "10", "--quiet",
            "--output", str(out), "--checkpoint-dir", str(out / "ckpt"), "--save-checkpoints-steps", "250",
            "--lease-ttl", "2", *extra]
    return run_cli(*args, timeout=timeout)


def check_run(out: Path, baseline_auc: float, *, logs: str = "worker-*.log", epochs: int = EPOCHS) -> dict[str, Any]:
    """The acceptance checks every disturbed run of ``epochs`` epochs must pass; returns its metrics.
    ``logs``: the logs that name the steps (an in-graph run's: ``client-*.log``)."""
    metrics: dict[str, Any] = json.loads((out / "metrics.json").read_text())
    assert abs(metrics["eval"]["auc"] - baseline_auc) <= 0.005, (metrics["eval"], baseline_auc)
    steps = [int(s) for log in sorted((out / "logs").glob(logs))
             for s in re.findall(r"\bstep=(\d+)", log.read_text())]
    assert steps and len(steps) == len(set(steps)), "a step was logged twice"
    # Every record trained exactly once per epoch in the surviving model's history: the example
    # count travels with the reader positions through checkpoints and restores.
    assert metrics["ps"][0]["examples"] == epochs * A9A_RECORDS, metrics["ps"][0]
    names = json.loads((out / "ckpt" / "checkpoint").read_text())["all"]
    assert names
    for name in names:  # no checkpoint left unreadable
        read_variables(str(out / "ckpt" / name), slots=True)
    return metrics


@pytest.fixture(scope="module")
def baseline_auc(tmp_path_factory: pytest.TempPathFactory) -> float:
    out = tmp_path_factory.mktemp("baseline")
    r = train(out)
    assert r.returncode == 0, r.stderr[-3000:]
    return float(json.loads((out / "metrics.json").read_text())["eval"]["auc"])


@pytest.mark.parametrize("role", sorted(ROLES))
def test_kill_at_a_random_point_recovers(role: str, tmp_path: Path, baseline_auc: float) -> None:
    step = random.Random(f"recovery-{role}").randrange(400, 2200)
    out = tmp_path / "run"
    r = train(out, "--restart-policy", "on-failure", "--chaos", f"kill:{ROLES[role]}@step={step}")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = check_run(out, baseline_auc)
    (fault,) = metrics["faults"]
    assert fault["signal"] == "SIGKILL" and fault["recovery_seconds"] is not None, fault
    assert [e["task"] for e in metrics["restarts"]] == [fault["task"]]
    assert [p["init_count"] for p in metrics["ps"]] == [1, 1]  # per process: nothing initialized twice
    logs = {p.stem: p.read_text() for p in (out / "logs").glob("*.log")}
    if role.startswith("ps"):
        assert re.search(r"restored checkpoint \S+ \(step \d+\) onto every ps task", logs["worker-0"] + logs["worker-1"])
        for w in ("worker-0", "worker-1"):
            assert "resuming data at the checkpoint's position" in logs[w], logs[w][-2000:]
    else:
        victim = "worker-1" if role == "worker" else "worker-0"
        lives = logs[victim].split("serving at")
        assert len(lives) == 3, logs[victim][-2000:]  # started twice
        if "step=" in lives[1]:  # it had pushed before it died, so a reader position was recorded for it
            assert "resuming data at epoch" in lives[2], lives[2][:2000]
    if role == "ps0":
        # global_step (on the killed task) went on past every value handed out before the kill,
        # from the bound its journal recorded, not back to the checkpoint's step.
        bound = json.loads((out / "state" / "ps-0" / "global_step.json").read_text())["bound"]
        assert metrics["global_step"] <= bound
        restored = re.search(r"restored checkpoint \S+ \(step (\d+)\) onto every ps task; generation \d+, global_step (\d+)",
                             logs["worker-0"] + logs["worker-1"])
        assert restored and int(restored.group(2)) >= fault["at_step"] > int(restored.group(1)), restored
    if role == "chief":
        # The duties moved by election (to worker 1, or to worker 0's new process, whichever
        # campaigned first once the dead chief's lease expired), and checkpoints went on.
        assert "elected chief" in logs["worker-1"] + logs["worker-0"].split("serving at")[-1]
        final = read_manifest(latest_checkpoint(str(out / "ckpt")) or "").global_step
        assert final > fault["at_step"] + 250


def test_dead_ps_recovers_over_the_tcp_carrier(tmp_path: Path, baseline_auc: float) -> None:
    """The restarted ps task listens on a new carrier port; the clients find it through gRPC."""
    out = tmp_path / "run"
    r = train(out, "--restart-policy", "on-failure", "--chaos", "kill:ps:1@step=900", "--transport", "tcp")
    assert r.returncode == 0, r.stderr[-3000:]
    (fault,) = check_run(out, baseline_auc)["faults"]
    assert fault["task"] == "/job:ps/task:1" and fault["recovery_seconds"] is not None


def test_a_deposed_chiefs_checkpoint_is_refused(local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from psflow.ps.client import ParameterClient
    from psflow.rpc.api import ConnectConfig
    from psflow.train.build import build_model
    from psflow.train.chief import join_cluster
    from psflow.train.config import TrainConfig

    config = TrainConfig.flat(train=(str(A9A),), num_features=124, num_ps=2)
    handle = local_cluster(2)
    _, variables = build_model(config, handle.cluster)
    client = ParameterClient(handle.cluster, variables.placements(), client_name="/job:worker/task:0",
                             config=ConnectConfig(connect_timeout=30, token=TOKEN))
    client.connect()
    join_cluster(client, config.optimizer_spec(), chief=True)
    manager = CheckpointManager(str(tmp_path / "ckpt"))
    old = manager.save(client, epoch=5, holder="old chief")
    new = manager.save(client, epoch=7, holder="new chief")   # the successor's epoch is now the highest
    with pytest.raises(CheckpointError, match="epoch 5 refused"):
        manager.save(client, epoch=5, holder="old chief")      # the deposed chief wakes up
    assert latest_checkpoint(str(tmp_path / "ckpt")) == new.path != old.path
    assert read_manifest(new.path).global_step == 0
    client.close()


def test_a_worker_that_finished_its_data_is_rewound_by_a_later_restore(tmp_path: Path) -> None:
    """Worker 1 reads a small file and finishes long before worker 0; a ps task dies after that.
    The restore sets every worker back to the checkpoint, so worker 1 (still waiting for the
    others, not exited) must train its records since then again: the example count is exact."""
    full, small = tmp_path / "a_full", tmp_path / "b_small"  # sorted: worker 0 reads a_full, worker 1 b_small
    lines = A9A.read_text().splitlines(keepends=True)
    full.write_text("".join(lines))
    small.write_text("".join(lines[:3000]))
    out = tmp_path / "run"
    args = ["train", "--train", str(full), "--train", str(small), "--eval", str(A9A_T), "--num-features", "124",
            "--ps", "2", "--workers", "2", "--batch-size", "32", "--epochs", str(EPOCHS), "--log-every", "10",
            "--quiet", "--output", str(out), "--checkpoint-dir", str(out / "ckpt"), "--save-checkpoints-steps", "400",
            "--lease-ttl", "2", "--restart-policy", "on-failure"]
    proc = subprocess.Popen([sys.executable, "-m", "psflow", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=str(REPO), stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        worker1 = out / "logs" / "worker-1.log"
        while not (worker1.exists() and "finished its data" in worker1.read_text()):
            assert proc.poll() is None and time.monotonic() < deadline, "worker 1 never finished its data"
            time.sleep(0.02)
        pid = int(re.findall(r"serving at \S+ \(pid (\d+)\)", (out / "logs" / "ps-1.log").read_text())[-1])
        os.kill(pid, signal.SIGKILL)  # a task of the run this test started
        _, stderr = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    log1 = worker1.read_text()
    after = log1[log1.index("finished its data"):]
    assert "cluster restored" in after, log1[-3000:]  # it waited, and went through the restore
    assert metrics["ps"][0]["examples"] == EPOCHS * (A9A_RECORDS + 3000), metrics["ps"][0]
    steps = [int(s) for log in sorted((out / "logs").glob("worker-*.log")) for s in re.findall(r"\bstep=(\d+)", log.read_text())]
    assert len(steps) == len(set(steps))


def test_a_sync_run_recovers_from_a_dead_ps_task_0(tmp_path: Path) -> None:
    """Sync mode: the restore abandons the step being collected, every ps task's sync step
    starts over at the restored global_step (past every value handed out), and the run ends
    with the model an undisturbed sync run gives."""
    base = tmp_path / "base"
    r = train(base, "--mode", "sync")
    assert r.returncode == 0, r.stderr[-3000:]
    sync_auc = float(json.loads((base / "metrics.json").read_text())["eval"]["auc"])
    out = tmp_path / "run"
    r = train(out, "--mode", "sync", "--restart-policy", "on-failure", "--chaos", "kill:ps:0@step=700")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = check_run(out, sync_auc)
    assert abs(metrics["eval"]["auc"] - sync_auc) <= 0.001, (metrics["eval"], sync_auc)
    (fault,) = metrics["faults"]
    assert fault["task"] == "/job:ps/task:0" and fault["recovery_seconds"] is not None, fault


def test_a_ps_task_dying_before_the_first_periodic_checkpoint_restores_the_initial_one(tmp_path: Path,
                                                                                       baseline_auc: float) -> None:
    """The chief saves the initial state before any worker trains (as TF's saver does at step 0),
    so a ps task that dies before the first periodic checkpoint is restored too, from step 0."""
    out = tmp_path / "run"
    # Periodic checkpoints every 2,000 steps (the later flag wins), so the kill lands before the
    # first one even when a loaded machine delays it by hundreds of steps.
    r = train(out, "--restart-policy", "on-failure", "--chaos", "kill:ps:1@step=100", "--save-checkpoints-steps", "2000")
    assert r.returncode == 0, r.stderr[-3000:]
    check_run(out, baseline_auc)
    logs = (out / "logs" / "worker-0.log").read_text() + (out / "logs" / "worker-1.log").read_text()
    restored = re.search(r"restored checkpoint \S+ \(step (\d+)\) onto every ps task", logs)
    assert restored, logs[-3000:]
    assert int(restored.group(1)) == 0  # the initial one: written before the ps tasks were made ready
    (fault,) = json.loads((out / "metrics.json").read_text())["faults"]
    assert fault["at_step"] < 2000, fault
