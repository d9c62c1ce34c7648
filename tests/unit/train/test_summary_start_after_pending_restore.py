"""A chief whose join left the restore within the run to the lease holder (``JoinResult.restore_pending``: its join
returns restored None and global_step 0, before any restore) then waits for it (``ClusterRecovery.await_restore``)
and trains on the restored model: its summaries get the SessionLog START at the restored step, as a chief whose own
join restored writes one (SummarySaverHook), so TensorBoard drops the events the lost run wrote past that step. It
wrote none. Real ps services in this process (tests/two_ps_in_process.py), a real SummaryWriter, read back with
TensorBoard's own event loader."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.save import CheckpointManager
from psflow.coord import Lease
from psflow.train.chief import JoinResult, join_cluster
from psflow.train.hook_api import RunContext, RunValues
from psflow.train.hooks import SessionRunHook, SummarySaverHook
from psflow.train.leader_hooks import LeaderOnlyHook
from psflow.train.recovery import ClusterRecovery
from psflow.train.summary import SummaryWriter

pytestmark = pytest.mark.timeout(60)

_LEASE = Lease("chief", "/job:worker/task:1", "/job:worker/task:1#1", 7, 10.0, float("inf"))


def _events(logdir: Path) -> list[Any]:
    loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")
    return [e for path in sorted(logdir.iterdir()) for e in loader.EventFileLoader(str(path)).Load()]


class _Leadership:
    """The chief lease as LeaderOnlyHook asks it: held (``lease``) or not."""

    candidate = "/job:worker/task:0"

    def __init__(self) -> None:
        self.held: Lease | None = _LEASE

    def lease(self) -> Lease | None:
        return self.held


def _wrapped(writer: SummaryWriter, leadership: _Leadership) -> SessionRunHook:
    """The hook as every run with a chief election gets it (psflow/train/duties.py: make_session)."""
    return LeaderOnlyHook(SummarySaverHook(writer, save_steps=100), leadership)  # type: ignore[arg-type]


@pytest.mark.parametrize("election", [False, True], ids=["bare", "leader_only"])
def test_a_chief_that_waited_for_another_workers_restore_writes_a_start_at_the_restored_step(
        tmp_path: Path, election: bool) -> None:
    """Also as the hook runs in a real run: every run with --checkpoint-dir or summaries elects its chief, and
    make_session wraps the hook in LeaderOnlyHook, which must pass the START's before_run on."""
    client, services = two_ps_cluster()
    ckpt = str(tmp_path / "ckpt")
    join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt)
    for _ in range(3):
        train_a_step(client)
    saved = CheckpointManager(ckpt).save(client)  # the newest checkpoint: global_step 3
    for _ in range(2):
        train_a_step(client)
    for index in (0, 1):  # every ps task lost its state: the run restores the checkpoint at a new generation
        restart_ps(client, services, index)

    writer = SummaryWriter(str(tmp_path / "summaries"))
    hook = _wrapped(writer, _Leadership()) if election else SummarySaverHook(writer, save_steps=100)
    joined = JoinResult(False, None, 0, None, {}, generation=None, restore_pending=True)
    session = SimpleNamespace(client=client, global_step=0, join_result=joined, checkpoint_dir=ckpt)
    hook.after_create_session(session)  # type: ignore[arg-type]
    # The holder (here: this process, with another worker's lease) restores; this chief waits for it.
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=ckpt, generation=None, leader=lambda: _LEASE,
                               timeout=60.0)
    recovery.await_restore(None)
    assert client.global_step() == 3
    context = RunContext(session, 0)  # type: ignore[arg-type]
    hook.before_run(context)
    train_a_step(client)
    hook.after_run(context, RunValues(step=4, loss=0.5, examples=1))
    hook.end(session)  # type: ignore[arg-type]
    writer.close()

    starts = [e for e in _events(tmp_path / "summaries") if e.HasField("session_log")]
    assert [(e.step, e.session_log.status, e.session_log.checkpoint_path) for e in starts] == [(4, 1, saved.path)], starts


def test_a_chief_elected_later_writes_no_start(tmp_path: Path) -> None:
    """The chief whose join waited did not hold the lease at its first step (the holder wrote the summaries on):
    gaining the lease later (LeaderOnlyHook runs after_create_session then, steps on) is no restore, so no START,
    which would make TensorBoard drop the holder's summaries past the checkpoint's step."""
    client, services = two_ps_cluster()
    ckpt = str(tmp_path / "ckpt")
    join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt)
    train_a_step(client)
    CheckpointManager(ckpt).save(client)
    writer = SummaryWriter(str(tmp_path / "summaries"))
    leadership = _Leadership()
    leadership.held = None  # another worker holds the lease: this chief's duties wait
    hook = _wrapped(writer, leadership)
    joined = JoinResult(False, None, 0, None, {}, generation=None, restore_pending=True)
    session = SimpleNamespace(client=client, global_step=0, join_result=joined, checkpoint_dir=ckpt)
    hook.after_create_session(session)  # type: ignore[arg-type]
    context = RunContext(session, 0)  # type: ignore[arg-type]
    for step in (2, 3):
        hook.before_run(context)
        train_a_step(client)
        session.global_step = step
        hook.after_run(context, RunValues(step=step, loss=0.5, examples=1))
        leadership.held = _LEASE  # elected after its first step
    hook.end(session)  # type: ignore[arg-type]
    writer.close()
    assert not [e for e in _events(tmp_path / "summaries") if e.HasField("session_log")]
