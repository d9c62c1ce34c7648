"""A chief killed for good (no supervisor restarts it) under ``psflow server``: a worker whose data ended takes the
chief duties over and ends its part of the run with the final checkpoint and one final evaluation.

Before: the finished worker lingered (:meth:`psflow.train.recovery.ClusterRecovery.linger`) until global_step had
not moved for ``connect_timeout`` (60 s), then left without the lease: no final checkpoint (the newest was the last
periodic one, the model trained since lost) and no final evaluation.

Real ``psflow server`` processes (gRPC on 127.0.0.1, the embedded leases on ps task 0), as test_server_run_end
starts them; worker 0 (the chief) is killed with SIGKILL and never started again. Asserted on the workers' log
lines and the checkpoint's manifest, never on time.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import test_server_run_end
from support import A9A, A9A_T, wait_until
from test_server_run_end import _SAFETY, _channel, _cluster, _global_step, _Tasks, _wait_for_step

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.cluster import ClusterSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

tasks = test_server_run_end.tasks  # the fixture: its psflow server processes are killed by pid after the test


def _files(tmp_path: Path, lines: list[int | None]) -> list[str]:
    """``--train`` flags, one a9a file per worker in the order the workers read them: ``lines[i]`` lines (None: all)."""
    text = A9A.read_text().splitlines(keepends=True)
    flags = []
    for i, size in enumerate(lines):
        path = tmp_path / f"{'ab'[i]}_part"
        path.write_text("".join(text[:size]))
        flags += ["--train", str(path)]
    return flags


def _start(cluster: _Tasks, tmp_path: Path, worker_lines: list[int | None], *, lease_ttl: float = 2) -> Path:
    """ps task 0 and the workers, with checkpoints every 50 steps, ``--eval`` and a ``lease_ttl`` s lease; the
    checkpoint dir."""
    ckpt = tmp_path / "ckpt"
    train = [*_files(tmp_path, worker_lines), "--num-features", "124", "--epochs", "3", "--batch-size", "32",
             "--no-status", "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "50", "--log-every", "50",
             "--eval", str(A9A_T), "--lease-ttl", str(lease_ttl)]
    cluster.start("ps", 0, "--checkpoint-dir", str(ckpt))
    for i in range(2):
        cluster.start("worker", i, *train)
    return ckpt


def _check_end(cluster: _Tasks, ckpt: Path, *, took_over: bool = True) -> None:
    """Worker 1 exited 0 (after it took the duties over from the workers still training, where ``took_over``),
    with a final checkpoint at the last step and one final evaluation of it; it never waited the linger timeout
    out."""
    assert cluster.exit_code("worker-1") == 0, cluster.log("worker-1")[-3000:]
    log = cluster.log("worker-1")
    assert "global_step stayed at" not in log, log[-3000:]
    assert not took_over or re.search(
        r"worker 1: took the chief duties over from the workers still training \(/job:worker/task:0\)", log), log[-3000:]
    ps0 = _channel(cluster, "ps", 0)
    try:
        step = _global_step(ps0)
    finally:
        ps0.close()
    final = latest_checkpoint(str(ckpt))
    assert final is not None and read_manifest(final).final, final
    assert read_manifest(final).global_step == step, (final, step)
    evals = re.findall(r"eval step=(\d+)", log + cluster.log("worker-0"))
    assert evals == [str(step)], evals
    assert cluster.procs["ps-0"].poll() is None  # worker 0 never sent Done: the ps task serves until stopped


def _kill_chief(cluster: _Tasks) -> None:
    os.kill(cluster.procs["worker-0"].pid, signal.SIGKILL)
    cluster.procs["worker-0"].wait(timeout=_SAFETY)


def test_a_finished_worker_takes_the_duties_of_a_chief_killed_after_it_finished(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path) -> None:
    """Worker 1 (300 lines: ~30 steps) finishes and lingers; worker 0, the chief (all of a9a, 3 epochs: ~3,000
    steps), is killed once worker 1 waits for it."""
    cluster = tasks(_cluster(1, 2))
    ckpt = _start(cluster, tmp_path, [None, 300])
    wait_until(lambda: "finished its data" in cluster.log("worker-1"), "worker 1 finished its data", limit=_SAFETY)
    assert cluster.procs["worker-0"].poll() is None, cluster.log("worker-0")[-3000:]
    _kill_chief(cluster)
    _check_end(cluster, ckpt)


def test_a_worker_that_took_the_duties_while_training_takes_them_back_at_its_end(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path) -> None:
    """Worker 0, the chief, is killed at step 60 while worker 1 (20,000 lines, 3 epochs: ~1,900 steps) still
    trains: worker 1 is elected while it trains (the lease lapses within 2 s), resigns when its data ends (worker
    0 has not finished: the duties go to a worker that trains), and takes them back once nobody trains."""
    cluster = tasks(_cluster(1, 2))
    ckpt = _start(cluster, tmp_path, [None, 20000])
    _wait_for_step(cluster, 60)
    assert "finished its data" not in cluster.log("worker-1")  # it still trains
    _kill_chief(cluster)
    _check_end(cluster, ckpt)
    lines = [line for line in cluster.log("worker-1").splitlines()
             if re.search(r"elected chief|finished its data|resigned as chief|took the chief duties over", line)]
    assert [re.sub(r".*(elected|finished|resigned|took).*", r"\1", line) for line in lines] == [
        "elected", "finished", "resigned", "elected", "took"], lines


def test_a_finished_worker_takes_the_duties_of_the_last_to_finish_killed_before_its_final_save(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path) -> None:
    """Worker 0, the chief, is the last to finish: it sends ``Leave`` and then writes the final checkpoint. Killed
    as its ``Leave`` shows on ps task 0 (stopped there at once, then killed), before its final save ends: worker 1,
    which had handed the duties on, saw every worker finished and left at once, with the newest checkpoint the
    last periodic one (in the reproduction ckpt-000000300 at global_step 312) and no final evaluation. Now it waits
    for the holder's end (its ``Done``, or the final checkpoint) and, nobody holding the lease for the lease's ttl,
    takes the duties over."""
    cluster = tasks(_cluster(1, 2))
    ckpt = _start(cluster, tmp_path, [3000, 300])
    ps0 = _channel(cluster, "ps", 0)
    try:
        wait_until(lambda: "finished its data" in cluster.log("worker-1"), "worker 1 finished its data",
                   limit=_SAFETY)
        deadline = time.monotonic() + _SAFETY
        while "/job:worker/task:0" not in (ps0.call("Stats").meta.get("finished") or ()):  # no pause: its final
            assert time.monotonic() < deadline, cluster.log("worker-0")[-3000:]  # save takes milliseconds
        os.kill(cluster.procs["worker-0"].pid, signal.SIGSTOP)
    finally:
        ps0.close()
    newest = latest_checkpoint(str(ckpt))
    if newest is not None and read_manifest(newest).final:
        _kill_chief(cluster)
        pytest.skip("worker 0's final save ended before it was stopped (this test's poll lost the race)")
    _kill_chief(cluster)
    assert cluster.exit_code("worker-1") == 0, cluster.log("worker-1")[-3000:]
    log = cluster.log("worker-1")
    assert "worker 1: took the chief duties over from the last to finish (/job:worker/task:0), whose session " \
           "never ended" in log, log[-3000:]
    _check_end(cluster, ckpt, took_over=False)  # its own line, asserted above
