"""A joining member's tally (psflow/ps/replication/join_queue.py: the entries queued after its snapshot and what
they hold, against its bound) goes back to 0 entries and 0 bytes whenever its queue empties: the member let go
(the queue freed), or acknowledging every entry, whether queued while it joined (weighed with their state) or
after it entered the view (counted by their arrays). Each Join's sender has its own tally: a member let go and
joining again many times does not carry the earlier joins' counts into the next one's bound (a tally that drifted
upward would let go a healthy joiner). Review of 143b400; the joiner's Replicate calls are held in the network
(it applies nothing while held) and the pushes counted: no timed assertion."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, assert_same_state, backup, layout

from psflow.ps.protocol import PushRequest, ReplicateRequest, WorkerTag
from psflow.ps.replication.chunks import entry_bytes
from psflow.ps.replication.forwarder import BackupSender, QueueBound
from psflow.ps.sync import SyncConfig

pytestmark = pytest.mark.timeout(180)

_BOUND, _LET_GO = 4, 5  # entries after the snapshot; the one that passes it lets the member go


def _push(push_id: int) -> PushRequest:
    return PushRequest([("w/part_0", np.full((1, 4), 0.01, np.float32), np.array([push_id % 20], np.int64)),
                        ("b/part_0", np.full(4, 0.01, np.float32), None)],
                       WorkerTag(WORKERS[0], 1, push_id=push_id, acked=push_id - 1), step=True, examples=1)


def test_a_member_let_go_and_joining_again_many_times_leaves_no_count_behind(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard(backups=2)
    primary, slow = shard.replicas[PRIMARY], backup(1)
    primary.joins.bound = QueueBound(entries=_BOUND, bytes=1 << 40, snapshots=0.0)
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    pushes = iter(range(1, 1000))
    shard.push(PRIMARY, _push(next(pushes)))
    forwarder = primary.forwarder
    assert forwarder is not None
    arrays = entry_bytes(shard.received[backup(0)][-1])  # one push's arrays (each the same)
    seen: list[BackupSender] = []

    def next_join(what: str) -> BackupSender:
        shard.wait(lambda: slow in forwarder.senders and forwarder.senders[slow] not in seen, what, limit=60.0)
        sender = forwarder.senders[slow]
        seen.append(sender)
        return sender

    held = threading.Event()
    shard.add(slow)
    shard.held_requests[(slow, ReplicateRequest.METHOD)] = held
    try:
        shard.start(slow)
        for join in range(6):
            sender = next_join(f"Join {join} of {slow} served")
            while forwarder.senders.get(slow) is sender:
                shard.push(PRIMARY, _push(next(pushes)))
            assert sender.pending() == (0, 0.0), join  # its queue freed
            assert (sender.tally.entries, sender.tally.bytes) == (0, 0), (join, sender.tally.entries, sender.tally.bytes)
            assert sender.tally.peak_entries == _LET_GO, (join, sender.tally.peak_entries)  # its own, not the earlier
        sender = next_join(f"the last Join of {slow} served")
        for _ in range(_BOUND - 1):  # queued while it joins: weighed with their state
            shard.push(PRIMARY, _push(next(pushes)))
        assert sender.tally.entries == _BOUND - 1 and sender.tally.bytes > (_BOUND - 1) * arrays, sender.figures()
    finally:
        del shard.held_requests[(slow, ReplicateRequest.METHOD)]
        held.set()
    shard.wait_view(limit=60.0)
    assert forwarder.senders.get(slow) is sender
    for _ in range(20):  # a backup of the view: counted by their arrays, acknowledged before each push returns
        shard.push(PRIMARY, _push(next(pushes)))
    shard.wait(lambda: sender.pending() == (0, 0.0), f"{slow} acknowledged every entry", limit=60.0)
    assert (sender.tally.entries, sender.tally.bytes) == (0, 0), sender.figures()
    assert sender.tally.peak_entries >= _BOUND - 1, sender.figures()  # what queued while it joined
    assert_same_state(shard.services[PRIMARY], shard.services[slow])
