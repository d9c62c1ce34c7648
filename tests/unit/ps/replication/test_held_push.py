"""A replicated primary's sync push held while the chief saves (psflow.ps.save_hold): answered held, recorded
nowhere until its step is applied, and answered from the step's record when sent again. In process
(tests/replica_shard.py), a real --sync-timeout of 2 s.

Before, the held answer was recorded as the push's dedup reply: every resend got it back at once (the client
spun on it), the step's own record never replaced it, and the shard's backups took the push as answered.

Also: a backup ends a dead chief's save when its new process shows in the primary's entries, as the primary did at
that process's Register, so a backup promoted later does not name the dead save."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.ps.protocol import PushReply, PushRequest, SaveNoticeRequest, StepTag, WorkerTag
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import FailedPreconditionError

pytestmark = pytest.mark.timeout(60)

CKPT = "gs://bucket/ckpt"


def _push(worker: str, incarnation: int = 1, step: int = 0) -> PushRequest:
    """``worker``'s (its process ``incarnation``) gradient for sync step ``step``."""
    grad = np.ones((2, 4), np.float32)
    return PushRequest([("w/part_0", grad, np.array([1, 2], np.int64))],
                       WorkerTag(worker, incarnation, push_id=step + 1, acked=step),
                       StepTag(read_step=step, sync_tag=step), step=True, examples=8)


def _sync_shard(make_shard: Callable[..., InProcessShard]) -> InProcessShard:
    """A started shard (a primary and its backup), its workers registered in sync mode, --sync-timeout 2 s."""
    shard = make_shard()
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig("sync", 2, 2, timeout=2.0)))
    return shard


def _notice(shard: InProcessShard, notice: SaveNoticeRequest) -> None:
    """``notice`` to every member of the shard, as a chief sends it."""
    for member in (PRIMARY, backup(0)):
        shard.call(member, SaveNoticeRequest.METHOD, notice.to_frame())


def test_a_held_sync_push_is_recorded_with_its_step_and_a_resend_gets_that_record(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = _sync_shard(make_shard)
    chief, other = WORKERS
    saving, stop = threading.Event(), threading.Event()

    def notices() -> None:  # the chief's save, renewed every quarter of the timeout, to every member
        while not stop.is_set():
            _notice(shard, SaveNoticeRequest(chief, CKPT, 0, True))
            saving.set()
            stop.wait(0.25)
        _notice(shard, SaveNoticeRequest(chief, CKPT, 0, False))

    thread = threading.Thread(target=notices, daemon=True)
    thread.start()
    try:
        assert saving.wait(10)
        first = shard.push(PRIMARY, _push(other))  # waits its 2 s, then held: before its caller's deadline
        assert first.held and not first.completed, first
        again = shard.push(PRIMARY, _push(other))  # the resend waits on (before: the held answer, at once)
        assert again.held, again
    finally:
        stop.set()
        thread.join(10)
    out: dict[str, PushReply] = {}
    resend = threading.Thread(target=lambda: out.setdefault("reply", shard.push(PRIMARY, _push(other))), daemon=True)
    resend.start()
    shard.wait(lambda: shard.services[PRIMARY].mode.stats()["sync_contributed"] == [other], "the resend waiting")
    assert shard.push(PRIMARY, _push(chief)).completed
    resend.join(20)
    assert out["reply"] == PushReply(1, True, False, aggregated=True), out  # the step's record, not held
    assert shard.push(PRIMARY, _push(other)) == out["reply"]  # a later resend: the same record, applied once
    held = shard.services[backup(0)].clock.global_step
    shard.wait(lambda: held is not None and held.value == 1, "the backup at step 1")


def test_a_backup_promoted_after_the_chief_restarted_names_no_save_of_its_dead_process(
        make_shard: Callable[..., InProcessShard]) -> None:
    """The chief died saving and its new process registered and trained: the primary ended that save at the
    Register (1d44067), but nothing told the backups, so a backup promoted later named the dead process's save in
    a later step's timeout ('was saving a checkpoint ... the chief died or hung while saving?'), a save nobody was
    doing. The new process's push, replicated with its incarnation, ends it on the backups too."""
    shard = _sync_shard(make_shard)
    chief, other = WORKERS
    _notice(shard, SaveNoticeRequest(chief, CKPT, 0, True, 600.0, 1))  # the chief's save, then its process dies
    shard.register(layout(SyncConfig("sync", 2, 2, timeout=2.0)))  # its new process registers (the primary only)
    out: dict[str, PushReply] = {}
    waiting = threading.Thread(target=lambda: out.setdefault("other", shard.push(PRIMARY, _push(other, 1, 0))),
                               daemon=True)
    waiting.start()
    shard.wait(lambda: shard.services[PRIMARY].mode.stats()["sync_contributed"] == [other], "the other's push")
    assert shard.push(PRIMARY, _push(chief, 2, 0)).completed  # the new process trains step 1 with the other
    waiting.join(20)
    assert out["other"].step == 1, out
    shard.wait(lambda: shard.services[backup(0)].workers.incarnation_of(chief) == 2, "the backup at step 1")
    shard.cut.add(PRIMARY)
    shard.promote(backup(0), 1)
    with pytest.raises(FailedPreconditionError, match="sync step 1 timed out") as timed_out:  # the chief missing
        shard.push(backup(0), _push(other, 1, 1))
    assert "saving" not in str(timed_out.value) and CKPT not in str(timed_out.value), timed_out.value
