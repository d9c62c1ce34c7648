"""A run whose final checkpoint cannot be written fails, naming the directory and the cause (issue 28).

Real processes: one ps task and two workers electing their chief (the embedded lease on ps task 0). Worker 1
is slowed (a sleep per step, so the end of its data is seconds away, on any machine) and ends last: it writes
the final checkpoint. Once it trains, the checkpoint directory moves outside the ps task's ``--checkpoint-root``
and a symlink takes its place: the directory still reads and takes the chief's own files, but the ps task refuses
to write its shard there (what a store refusing a put, or a full disk on the ps side, looks like to the chief; on
any machine, root included, where chmod stops nothing). Before, the failed final save was only logged and the
worker exited 0, with the initial checkpoint as the newest in the directory a restore or ``psflow export`` reads.

Under ``psflow train --restart-policy on-failure`` the launcher restarts the worker whose final save failed; its
new process finds its data ended and saves the final checkpoint again. There the ps task's checkpoint root is the
checkpoint directory itself, so the final save is made to fail on the chief's side: a dangling symlink named as
the final checkpoint (``ckpt-<last step>``: nothing else is saved, and every batch is one step) makes its
``makedirs`` fail. A failure that clears is retried by the restart (the run ends 0, its examples counted once); one
that stays ends the run at ``--max-failed-saves`` failures in a row, as the launcher's line says (before, every
restart tried again, up to ``--max-restarts``: with the defaults 4 saves failed where the line said the run stops
after 3).
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from support import A9A, ClusterHandle, run_cli, wait_until

from psflow.checkpoint.manifest import read_manifest
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


def _launched_run_whose_final_save_fails(tmp_path: Path, *extra: str,
                                         clears: bool = False) -> tuple[int, str, Path, Path]:
    """``psflow train``, 1 ps + 2 workers of 10 batches each, ``--restart-policy on-failure``: the final save (at
    global_step 20) fails while ``ckpt/ckpt-000000020`` is a dangling symlink; ``clears``: it is removed once a
    worker logged the failure. Returns the exit status, stderr, the run and the checkpoint directory."""
    lines = A9A.read_text().splitlines(keepends=True)
    files = [tmp_path / "a_part", tmp_path / "b_part"]
    for i, f in enumerate(files):
        f.write_text("".join(lines[320 * i:320 * (i + 1)]))
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    ckpt.mkdir()
    trap = ckpt / "ckpt-000000020"
    trap.symlink_to(tmp_path / "nowhere", target_is_directory=True)
    done = threading.Event()

    def clear() -> None:  # the failure clears: a restarted worker's save goes through
        while not done.wait(0.05):
            logs = [p.read_text(errors="replace") for p in (out / "logs").glob("worker-*.log")] if out.exists() else []
            if any("could not be written" in log for log in logs):
                trap.unlink()
                return
    watcher = threading.Thread(target=clear, daemon=True)
    if clears:
        watcher.start()
    try:
        r = run_cli("train", *(a for f in files for a in ("--train", str(f))), "--num-features", "124", "--ps", "1",
                    "--workers", "2", "--batch-size", "32", "--log-every", "10", "--quiet", "--output", str(out),
                    "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "100000",
                    "--restart-policy", "on-failure", *extra, timeout=150)
    finally:
        done.set()
    return r.returncode, r.stderr, out, ckpt


def test_a_final_save_that_keeps_failing_ends_a_restarted_run_at_max_failed_saves(tmp_path: Path) -> None:
    code, stderr, out, _ = _launched_run_whose_final_save_fails(tmp_path, "--max-failed-saves", "2")
    assert code == 1, stderr[-3000:]
    failures = [line for line in stderr.splitlines() if line.startswith("psflow: checkpoint at global_step 20 FAILED")]
    assert len(failures) == 2, stderr[-4000:]  # one restart retried it; the second failure ends the run
    assert "2 checkpoint saves failed in a row (--max-failed-saves 2): not restarted" in stderr, stderr[-3000:]
    assert "the final checkpoint (global_step 20) could not be written into" in stderr, stderr[-3000:]
    restarts = json.loads((out / "metrics.json").read_text())["restarts"]
    assert [e["restarted"] for e in restarts] == [True, False], restarts


def test_a_final_save_that_failed_once_is_written_by_the_restarted_worker(tmp_path: Path) -> None:
    code, stderr, out, ckpt = _launched_run_whose_final_save_fails(tmp_path, clears=True)
    assert code == 0, stderr[-3000:]
    assert "psflow: checkpoint at global_step 20 FAILED" in stderr, stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["examples"] == 640 and metrics["global_step"] == 20, metrics  # each record once
    assert metrics["restarts"] and all(e["restarted"] for e in metrics["restarts"]), metrics["restarts"]
    final = read_manifest(latest_checkpoint(str(ckpt)) or "")
    assert final.final and final.global_step == 20, final
