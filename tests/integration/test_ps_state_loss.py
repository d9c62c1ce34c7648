"""A ps task's death is never silent (issue 25, item 2): real processes.

Before: with ``--restart-policy on-failure`` and no ``--checkpoint-dir``, a killed ps task 1 was restarted
empty, the workers died with a RecoveryError and were restarted, the chief initialized ps task 1 from
scratch beside the trained ps task 0, and the run exited 0 with a model half fresh.

Now ``psflow train`` with a restart policy keeps checkpoints in ``<output>/checkpoints`` and restores from
them; and where no checkpoint exists (a cluster run by hand without ``--checkpoint-dir``; a ps task not
restarted) the run stops with one line naming the task, never going on with fresh and trained variables.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from support import A9A, TOKEN, run_cli, wait_until

from psflow.launch.supervisor import STATE_LOST_EXIT_CODE
from psflow.rpc.api import PARAMETER_SERVICE, ConnectConfig, RpcError
from psflow.rpc.grpc_client import TaskChannel
from psflow.train.config import TrainConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(200)]

A9A_RECORDS = 32561
EPOCHS = 3


def train(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """``psflow train`` on a9a, 3 epochs (~3,050 steps), 2 ps, 2 workers, no --checkpoint-dir."""
    return run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "2", "--workers", "2",
                   "--batch-size", "32", "--epochs", str(EPOCHS), "--log-every", "10", "--quiet", "--output", str(out),
                   "--lease-ttl", "2", *extra, timeout=150)


def test_a_ps_task_killed_in_a_run_without_checkpoint_dir_is_restored_from_the_run_directory(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = train(out, "--restart-policy", "on-failure", "--chaos", "kill:ps:1@step=900")
    assert r.returncode == 0, r.stderr[-3000:]
    checkpoints = out / "checkpoints"
    assert (f"psflow: --restart-policy on-failure without --checkpoint-dir: checkpoints go to {checkpoints}, so a ps "
            "task that dies is restored from the newest") in r.stderr
    assert json.loads((out / "config.json").read_text())["checkpoint"]["dir"] == str(checkpoints)
    metrics = json.loads((out / "metrics.json").read_text())
    (fault,) = metrics["faults"]
    assert fault["task"] == "/job:ps/task:1" and fault["recovery_seconds"] is not None, fault
    logs = "".join(p.read_text() for p in sorted((out / "logs").glob("worker-*.log")))
    assert re.search(rf"restored checkpoint {re.escape(str(checkpoints))}/ckpt-\d+ \(step \d+\) onto every ps task", logs)
    # Every record trained exactly once in the surviving model's history, and no step value logged twice.
    assert metrics["examples"] == EPOCHS * A9A_RECORDS == metrics["ps"][0]["examples"], metrics["ps"]
    steps = re.findall(r"\bstep=(\d+)", logs)
    assert steps and len(steps) == len(set(steps))
    # ps task 1's new process was restored into, never initialized on its own beside ps task 0.
    assert "StateLostError" not in logs and "initialized the variables" in logs
    assert [p["init_count"] for p in metrics["ps"]] == [1, 1]


def test_a_ps_task_that_is_not_restarted_fails_the_run_naming_it(tmp_path: Path) -> None:
    r = train(tmp_path / "run", "--chaos", "kill:ps:1@step=900")   # --restart-policy never (the default)
    assert r.returncode == 1, r.stderr[-3000:]
    assert ("/job:ps/task:1 (pid ") in r.stderr and ("was killed by signal SIGKILL: restart policy is 'never'; the "
            "variables it held are lost, so the run stops (--restart-policy on-failure restores them from a "
            "checkpoint)") in r.stderr, r.stderr[-3000:]
    assert not (tmp_path / "run" / "metrics.json").exists() or "eval" not in (tmp_path / "run" / "metrics.json").read_text()


def _step(channel: TaskChannel) -> int | None:
    try:
        return int(channel.call("Stats").meta["global_step"])
    except RpcError:
        return None


def _registered(channel: TaskChannel) -> bool:
    return bool(channel.call("Stats").meta["registered"])


@pytest.mark.parametrize("duties", ["summaries", "none"])
def test_a_cluster_run_by_hand_without_checkpoint_dir_stops_when_a_ps_task_comes_back_empty(
        local_cluster, tmp_path: Path, duties: str) -> None:  # type: ignore[no-untyped-def]
    """As ``psflow server`` runs it (one process per task, restarted by whoever runs them, e.g. Kubernetes).

    ``summaries``: the workers elect a chief (it has duties), and every worker stops at once with the one line.
    ``none``: nothing to elect; the workers fail on the dead ps task, and the chief's process, restarted,
    refuses to initialize ps task 1 beside ps task 0 with the same line. Either way ps task 1 stays empty.
    """
    config = TrainConfig.flat(train=(str(A9A),), num_features=124, num_ps=2, num_workers=2, batch_size=32, epochs=5,
                              log_every=50, connect_timeout=60, summary_dir=str(tmp_path / "summaries") if duties != "none" else None)
    cfg = tmp_path / "config.json"
    cfg.write_text(config.to_json())
    handle = local_cluster(2, 2)
    errors = {i: tmp_path / f"error-{i}.json" for i in range(2)}
    for i in range(2):
        handle.start("worker", i, "--config", str(cfg), "--error-file", str(errors[i]))
    ps0 = TaskChannel("/job:ps/task:0", handle.cluster.task_address("ps", 0), PARAMETER_SERVICE, ConnectConfig(token=TOKEN))
    ps1 = TaskChannel("/job:ps/task:1", handle.cluster.task_address("ps", 1), PARAMETER_SERVICE,
                      ConnectConfig(token=TOKEN, connect_timeout=30))
    try:
        wait_until(lambda: (_step(ps0) or 0) >= 200, "training reached step 200")
        handle.kill("ps", 1)
        handle.start("ps", 1)   # back, empty, at its address
        handle.wait_serving(1)
        line = ("/job:ps/task:1 restarted with no checkpoint to restore from (the run has no --checkpoint-dir): its "
                "variables (bias) would be fresh beside trained ones on /job:ps/task:0; rerun with --checkpoint-dir")
        codes = {i: handle.procs[("worker", i)].wait(timeout=120) for i in range(2)}
        if duties != "none":
            assert codes == {0: STATE_LOST_EXIT_CODE, 1: STATE_LOST_EXIT_CODE}, handle.logs()
            for i in range(2):
                assert json.loads(errors[i].read_text())["message"] == line
        else:
            assert all(code not in (0, None) for code in codes.values()), handle.logs()
            assert not _registered(ps1)
            chief = handle.start("worker", 0, "--config", str(cfg), "--error-file", str(errors[0]))  # restarted
            assert chief.wait(timeout=120) == STATE_LOST_EXIT_CODE, handle.logs()
            assert json.loads(errors[0].read_text())["message"] == line
        assert not _registered(ps1), "ps task 1 was initialized beside a trained ps task 0"
    finally:
        ps0.close()
        ps1.close()
