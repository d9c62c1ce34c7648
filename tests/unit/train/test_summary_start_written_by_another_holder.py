"""A summary hook told of a restore whose SessionLog START another worker's writer wrote already writes its next
points after that START, not in its own older file.

Seen in a real run (psflow train --ps 2 --workers 2 --restart-policy on-failure --chaos kill:ps:0@step=40,
--summary-dir, embedded election): ps task 0's restart lost its lease table, so worker 1 won a new lease while
worker 0 still held its old one (not renewed yet): both held the chief duties for a second. Worker 1 restored the
checkpoint of step 23 and wrote the restore's START in a new file; worker 0, told of the same restore
(after_restore), found the START written ("written already") and wrote its next points 61..83 (the restored model's,
its final point included) on in its own file, whose name sorts first (the same second, a lower pid). TensorBoard
reads the files in name order, so the START, read after them, dropped them: train/loss ended at worker 1's 60.

Real in-process ps services (tests/two_ps_in_process.py) restored by ClusterRecovery; the real SummarySaverHook
behind LeaderOnlyHook, the lease held by both workers at once; read back with TensorBoard's EventAccumulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from summary_holders import lease_of, loss_steps, summary_holders, worker_session
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.save import CheckpointManager
from psflow.coord import Lease
from psflow.train.hook_api import RunContext, RunValues
from psflow.train.hooks import SummarySaverHook
from psflow.train.recovery import ClusterRecovery
from psflow.train.session import MonitoredTrainingSession
from psflow.train.summary import SummaryWriter

pytestmark = pytest.mark.timeout(60)


class _Leadership:
    def __init__(self, name: str, holders: set[str]) -> None:
        self.candidate, self.holders = name, holders

    def lease(self) -> Lease | None:
        return lease_of(self.candidate) if self.candidate in self.holders else None


def test_points_after_a_start_another_holder_wrote_are_read_after_it(tmp_path: Path) -> None:
    client, services = two_ps_cluster()
    with MonitoredTrainingSession(client, SGD, is_chief=True):  # the cluster initialized and ready
        pass
    ckpt, logdir = str(tmp_path / "ckpt"), tmp_path / "summaries"
    holders = {"a"}
    writers, hooks, sessions = summary_holders(client, logdir, ("a", "b"), lambda name: _Leadership(name, holders),
                                               checkpoint_dir=ckpt)
    for name in ("a", "b"):
        hooks[name].after_create_session(sessions[name])

    def step(name: str) -> None:
        train_a_step(client)
        sessions[name].global_step = client.global_step()
        context = RunContext(session=sessions[name], local_step=0)  # type: ignore[arg-type]
        hooks[name].before_run(context)
        hooks[name].after_run(context, RunValues(step=sessions[name].global_step, loss=0.5, examples=1))

    for _ in range(2):
        step("a")
    CheckpointManager(ckpt).save(client)
    for _ in range(3):
        step("a")  # 3..5: lost with ps task 1
    holders.add("b")  # b wins a lease while a still holds its own (not renewed yet)
    restart_ps(client, services, 1)

    def told(checkpoint: str | None, at: int | None) -> None:
        for name in ("b", "a"):  # b's START first (a file of its own, sorting last), then a hears of it
            hooks[name].after_restore(sessions[name], checkpoint, at)

    recovery = ClusterRecovery(client, SGD, checkpoint_dir=ckpt, leader=lambda: lease_of("b"), timeout=30.0,
                               generation=0, on_restored=told)
    assert recovery.wait()[0]
    for _ in range(2):
        step("a")  # 6, 7: the restored model (global_step kept by ps task 0)
    hooks["a"].end(sessions["a"])
    for writer in writers.values():
        writer.close()
    # before: [1, 2] (a's 6 and 7 in its own file, read before b's START, which dropped them)
    assert loss_steps(logdir) == [1, 2, 6, 7]


def test_a_start_this_writer_wrote_keeps_its_file(tmp_path: Path) -> None:
    """Unchanged: told of a restore whose START its own writer wrote, a hook writes on in the same file."""
    client, services = two_ps_cluster()
    with MonitoredTrainingSession(client, SGD, is_chief=True):
        pass
    ckpt, logdir = str(tmp_path / "ckpt"), tmp_path / "summaries"
    writer = SummaryWriter(str(logdir))
    hook = SummarySaverHook(writer, save_steps=1)
    session: Any = worker_session(client, ckpt)
    hook.after_create_session(session)
    train_a_step(client)
    CheckpointManager(ckpt).save(client)
    restart_ps(client, services, 1)
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=ckpt, leader=lambda: lease_of("a"), timeout=30.0,
                               generation=0, on_restored=lambda c, s: [hook.after_restore(session, c, s)] * 2)
    assert recovery.wait()[0]
    path = writer.path
    train_a_step(client)
    hook.after_run(RunContext(session=session, local_step=0), RunValues(step=client.global_step(), loss=0.5,
                                                                          examples=1))
    writer.close()
    assert writer.path == path and len(list(logdir.iterdir())) == 1
