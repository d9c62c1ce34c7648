"""Every ps task dying at once is never a silent fresh start (issue 25/30 follow-up): real processes.

The state-loss guard (:mod:`psflow.train.state_loss`) compares a restarted, empty ps task with the
trained ones beside it; when every ps task dies together (both of ``--ps 2`` at one step, or the only
one of ``--ps 1``) nothing trained is left to compare with, and a chief joining such a cluster sees a
new one. What keeps the run honest then:

* ``psflow train --restart-policy on-failure`` (no ``--checkpoint-dir``): its checkpoints go to
  ``<output>/checkpoints``, saved when training starts, so the cluster is restored from the newest one
  (every record trained exactly once in the final model's history), never initialized again;
* a cluster run by hand without ``--checkpoint-dir`` whose workers elect a chief: every worker stops
  with one line saying that every variable of the model is lost and that --checkpoint-dir is needed.
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
EPOCHS = 2


def train(out: Path, num_ps: int, *chaos: str) -> subprocess.CompletedProcess[str]:
    """``psflow train`` on a9a (2 epochs, ~2,036 steps), 2 workers, on-failure, no --checkpoint-dir."""
    faults = [arg for spec in chaos for arg in ("--chaos", spec)]
    return run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", str(num_ps), "--workers", "2",
                   "--batch-size", "32", "--epochs", str(EPOCHS), "--log-every", "10", "--quiet", "--output", str(out),
                   "--lease-ttl", "2", "--restart-policy", "on-failure", *faults, timeout=150)


@pytest.mark.parametrize("num_ps", [1, 2])
def test_every_ps_task_killed_at_once_is_restored_from_the_run_directorys_checkpoint(tmp_path: Path,
                                                                                     num_ps: int) -> None:
    out = tmp_path / "run"
    r = train(out, num_ps, *(f"kill:ps:{i}@step=600" for i in range(num_ps)))
    assert r.returncode == 0, r.stderr[-3000:]
    checkpoints = out / "checkpoints"
    metrics = json.loads((out / "metrics.json").read_text())
    assert sorted(f["task"] for f in metrics["faults"]) == [f"/job:ps/task:{i}" for i in range(num_ps)]
    logs = "".join(p.read_text() for p in sorted((out / "logs").glob("worker-*.log")))
    assert re.search(rf"restored checkpoint {re.escape(str(checkpoints))}/ckpt-\d+ \(step \d+\) onto every ps task", logs)
    # Initialized once, at the start; every new ps process was restored into, never initialized on its own.
    assert logs.count("initialized the variables") == 1 and "StateLostError" not in logs
    assert [p["init_count"] for p in metrics["ps"]] == [1] * num_ps
    # Every record trained exactly once in the final model's history; no step value handed out twice.
    assert metrics["examples"] == EPOCHS * A9A_RECORDS == metrics["ps"][0]["examples"], metrics["ps"]
    steps = re.findall(r"\bstep=(\d+)", logs)
    assert steps and len(steps) == len(set(steps))


def _step(channel: TaskChannel) -> int | None:
    try:
        return int(channel.call("Stats").meta["global_step"])
    except RpcError:
        return None


def test_every_ps_task_of_a_cluster_run_by_hand_lost_without_checkpoint_dir_stops_the_workers(
        local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = TrainConfig.flat(train=(str(A9A),), num_features=124, num_ps=2, num_workers=2, batch_size=32, epochs=5,
                              log_every=50, connect_timeout=60, summary_dir=str(tmp_path / "summaries"))
    cfg = tmp_path / "config.json"
    cfg.write_text(config.to_json())
    handle = local_cluster(2, 2)
    errors = {i: tmp_path / f"error-{i}.json" for i in range(2)}
    for i in range(2):
        handle.start("worker", i, "--config", str(cfg), "--error-file", str(errors[i]))
    ps0 = TaskChannel("/job:ps/task:0", handle.cluster.task_address("ps", 0), PARAMETER_SERVICE, ConnectConfig(token=TOKEN))
    try:
        wait_until(lambda: (_step(ps0) or 0) >= 200, "training reached step 200")
        for i in range(2):
            handle.kill("ps", i)
        for i in range(2):
            handle.start("ps", i)   # back, empty, at its address
            handle.wait_serving(i)
        codes = {i: handle.procs[("worker", i)].wait(timeout=120) for i in range(2)}
        assert codes == {0: STATE_LOST_EXIT_CODE, 1: STATE_LOST_EXIT_CODE}, handle.logs()
        # A worker asking while one task is still down names the empty ones it saw; the loss is the whole model's.
        line = (r"/job:ps/task:\d(, /job:ps/task:\d)? restarted with no checkpoint to restore from \(the run has no "
                r"--checkpoint-dir\): every variable of the model \((bias, weights|weights, bias)\) is lost; rerun "
                r"with --checkpoint-dir")
        for i in range(2):
            message = json.loads(errors[i].read_text())["message"]
            assert re.fullmatch(line, message), message
    finally:
        ps0.close()
