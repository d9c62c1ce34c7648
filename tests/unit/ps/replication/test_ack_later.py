"""An async PushPull to a replicated primary that replies with its rows first (``PushPullAckLater``) and the
worker's ``Acked`` call that collects the acknowledgement later (issue 28: the backup's round trip overlaps the
worker's next compute instead of adding to its step).

What must hold: the rows come back before the backup acknowledged the push, read after the push was applied,
and marked ``ack_pending`` with the push's entry; the Acked reply comes only once the backup acknowledged that
entry (the backup held on an Event), and is the push's reply as recorded; an Acked for a push that is not the
last recorded one is refused, naming it; ssp keeps today's path (the reply after the ack, nothing pending).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.ps.protocol import (
    AckedRequest,
    PullRequest,
    PushPullAckLater,
    PushPullReply,
    PushReply,
    PushRequest,
    ReplicateRequest,
    StepTag,
    WorkerTag,
    ack_pending,
)
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import FailedPreconditionError
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)

BACKUP = backup(0)
_WAIT = 30.0  # seconds: generous, the machine is shared


def _shard(make_shard: Callable[..., InProcessShard], sync: SyncConfig) -> InProcessShard:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(layout(sync))
    return shard


def _push_pull(push_id: int) -> PushPullAckLater:
    rows = np.array([1, 3], np.int64)
    push = PushRequest([("w/part_0", np.full((2, 4), 0.5, np.float32), rows)],
                       WorkerTag(WORKERS[0], 1, push_id=push_id, acked=push_id - 1), StepTag(clock=push_id), step=True,
                       examples=1)
    return PushPullAckLater(push, PullRequest([("w/part_0", rows)]))


def _in_thread(call: Callable[[], Frame]) -> tuple[threading.Thread, list[Frame], list[Exception]]:
    replies: list[Frame] = []
    errors: list[Exception] = []

    def run() -> None:
        try:
            replies.append(call())
        except Exception as e:
            errors.append(e)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, replies, errors


def _held_backup(shard: InProcessShard) -> threading.Event:
    """Every Replicate call to the backup waits for the event returned before it is served."""
    release = threading.Event()
    shard.held_requests[(BACKUP, ReplicateRequest.METHOD)] = release
    return release


def test_the_rows_come_before_the_backups_ack_and_the_acked_reply_only_after_it(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = _shard(make_shard, SyncConfig())
    release = _held_backup(shard)
    frame = shard.call(PRIMARY, PushPullAckLater.METHOD, _push_pull(1).to_frame())  # returns: nothing waits
    reply = PushPullReply.from_frame(frame)
    seq = ack_pending(frame)
    assert seq is not None and seq >= 1 and shard.replicas[BACKUP].applier.received_seq < seq
    assert reply.push.step == 1
    value = shard.services[PRIMARY].store.get("w/part_0").value
    np.testing.assert_array_equal(reply.pull.values["w/part_0"], value[[1, 3]])  # the rows as of the push

    tag = _push_pull(1).push.worker
    acked = AckedRequest(WORKERS[0], tag.incarnation, 1)
    thread, replies, errors = _in_thread(lambda: shard.call(PRIMARY, AckedRequest.METHOD, acked.to_frame()))
    thread.join(0.5)
    assert thread.is_alive() and not replies and not errors  # the backup has not acknowledged: no reply
    release.set()
    thread.join(_WAIT)
    assert not errors, errors
    assert replies and PushReply.from_frame(replies[0]).step == 1  # the push's reply, as recorded
    assert shard.replicas[BACKUP].applier.received_seq >= seq
    assert shard.replicas[BACKUP].applier.settle(_WAIT)
    assert shard.services[BACKUP].store.get("w/part_0").value.tolist() == value.tolist()  # applied there, once


def test_a_resent_push_pull_is_answered_from_its_record_with_its_entry_pending(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = _shard(make_shard, SyncConfig())
    release = _held_backup(shard)
    first = shard.call(PRIMARY, PushPullAckLater.METHOD, _push_pull(1).to_frame())
    applied = shard.services[PRIMARY].store.get("w/part_0").value.copy()
    again = shard.call(PRIMARY, PushPullAckLater.METHOD, _push_pull(1).to_frame())  # a resend: not applied again
    assert ack_pending(again) == ack_pending(first)
    assert PushPullReply.from_frame(again).push.step == 1
    np.testing.assert_array_equal(shard.services[PRIMARY].store.get("w/part_0").value, applied)
    release.set()


def test_an_acked_call_for_a_push_not_recorded_is_refused_naming_it(make_shard: Callable[..., InProcessShard]) -> None:
    shard = _shard(make_shard, SyncConfig())
    shard.call(PRIMARY, PushPullAckLater.METHOD, _push_pull(1).to_frame())
    with pytest.raises(FailedPreconditionError, match=f"push 7 of {WORKERS[0]} is not the last one recorded"):
        shard.call(PRIMARY, AckedRequest.METHOD, AckedRequest(WORKERS[0], 1, 7).to_frame())


def test_an_ssp_push_pull_ack_later_is_acknowledged_before_its_reply(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = _shard(make_shard, SyncConfig(mode="ssp", staleness=3))
    release = _held_backup(shard)
    thread, replies, errors = _in_thread(
        lambda: shard.call(PRIMARY, PushPullAckLater.METHOD, _push_pull(1).to_frame()))
    thread.join(0.5)
    assert thread.is_alive() and not replies  # today's path: it waits for the backup
    release.set()
    thread.join(_WAIT)
    assert replies and not errors and ack_pending(replies[0]) is None
    assert shard.replicas[BACKUP].applier.received_seq >= 1
