"""A run whose final checkpoint cannot be written fails, naming the directory and the cause (issue 28).

Real processes: one ps task and two workers electing their chief (the embedded lease on ps task 0). Worker 1
is slowed (a sleep per step, so the end of its data is seconds away, on any machine) and ends last: it writes
the final checkpoint. Once it trains, the checkpoint directory moves outside the ps task's ``--checkpoint-root``
and a symlink takes its place: the directory still reads and takes the chief's own files, but the ps task refuses
to write its shard there (what a store refusing a put, or a full disk on the ps side, looks like to the chief; on
any machine, root included, where chmod stops nothing). Before, the failed final save was only logged and the
worker exited 0, with the initial checkpoint as the newest in the directory a restore or ``psflow export`` reads.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from support import A9A, ClusterHandle, wait_until

from psflow.checkpoint.pointer import latest_checkpoint
from psflow.train.config import TrainConfig
from psflow.train.faults import FaultInjection, task_config_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(200)]

SLOW_STEPS = 150  # worker 1's batches, 0.05 s each: its data ends 7.5 s after it starts at the earliest


def test_a_final_checkpoint_that_cannot_be_written_fails_the_worker_naming_the_directory(
        local_cluster: Callable[..., ClusterHandle], tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    lines = A9A.read_text().splitlines(keepends=True)
    files = [tmp_path / "a_part", tmp_path / "b_part"]  # worker i reads files[i] (sorted names)
    files[0].write_text("".join(lines[:320]))
    files[1].write_text("".join(lines[320:320 + 32 * SLOW_STEPS]))
    ckpt = tmp_path / "ckpt"
    config = TrainConfig.flat(train=tuple(str(f) for f in files), num_features=124, batch_size=32, num_ps=1,
                              num_workers=2, log_every=10, connect_timeout=30.0, checkpoint_dir=str(ckpt),
                              save_checkpoints_steps=100_000)  # the initial and the final checkpoint only
    cfg = tmp_path / "config.json"
    cfg.write_text(task_config_json(config, FaultInjection(step_delay={1: 0.05})))
    handle = local_cluster(1, 2)
    for i in range(2):
        handle.start("worker", i, "--config", str(cfg), "--error-file", str(tmp_path / f"error-{i}.json"))
    wait_until(lambda: latest_checkpoint(str(ckpt)), "the initial checkpoint")
    # Worker 1 trains (it has joined: its lock of the directory is taken, its steps are counted).
    wait_until(lambda: "step=" in handle.log("worker", 1), "worker 1's first logged step")
    moved = tmp_path_factory.mktemp("outside_the_ps_root") / "ckpt"
    os.rename(ckpt, moved)
    ckpt.symlink_to(moved, target_is_directory=True)
    worker = handle.procs[("worker", 1)]
    assert worker.wait(timeout=150) == 1, handle.logs()
    error = json.loads((tmp_path / "error-1.json").read_text())
    assert error["type"] == "FinalCheckpointError", error
    assert error["message"].startswith("/job:worker/task:1: the final checkpoint (global_step "), error
    assert f"could not be written into {ckpt}: " in error["message"], error
    assert "/job:ps/task:0" in error["message"] and "outside this task's checkpoint root" in error["message"], error
    assert error["message"] in handle.log("worker", 1)
    # Nothing newer than the initial checkpoint was made meanwhile: the run's newest is not its final one.
    newest = latest_checkpoint(str(moved))
    assert newest is not None and newest.endswith("ckpt-000000000"), newest
