"""A joining member that answers but falls behind (a slow host, a starved process, a snapshot it never finishes
applying) no longer makes its primary's memory grow with every push: its sender's queue past the snapshot is
bounded (entries and array bytes, :class:`~psflow.ps.replication.forwarder.QueueBound`); past it the primary
stops that sender and frees its queue with one warning naming the member and the bound
(psflow/ps/replication/joins.py), and the member Joins again from a new snapshot (startup.watch_view: no sender
to it). A backup of the view is never let go this way (pushes wait for it: its queue is bounded by their waits).
The joiner's Replicate calls are held in the network (it applies nothing) and the pushes counted: no timed
assertion."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, assert_same_state, backup, layout

from psflow.ps.protocol import PushRequest, ReplicateRequest, WorkerTag
from psflow.ps.replication.chunks import entry_bytes
from psflow.ps.replication.forwarder import QueueBound
from psflow.ps.sync import SyncConfig

pytestmark = pytest.mark.timeout(60)


def _push(push_id: int) -> PushRequest:
    return PushRequest([("w/part_0", np.full((1, 4), 0.01, np.float32), np.array([push_id % 20], np.int64)),
                        ("b/part_0", np.full(4, 0.01, np.float32), None)],
                       WorkerTag(WORKERS[0], 1, push_id=push_id, acked=push_id - 1), step=True, examples=1)


def _shard(make_shard: Callable[..., InProcessShard], bound: QueueBound) -> InProcessShard:
    shard = make_shard(backups=2)
    shard.replicas[PRIMARY].joins.bound = bound
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    shard.push(PRIMARY, _push(1))
    return shard


@pytest.mark.parametrize("kind", ["entries", "bytes", "snapshot"])
def test_a_joining_member_that_falls_behind_past_the_bound_is_let_go_and_joins_again(
        make_shard: Callable[..., InProcessShard], caplog: pytest.LogCaptureFixture, kind: str) -> None:
    """``entries``: 8 entries; ``bytes``: 8 pushes' weight (held_bytes: arrays and state); ``snapshot``: twice the
    snapshot's weight. The weights are read from the sender's tally (what it counted)."""
    shard = _shard(make_shard, QueueBound(entries=8 if kind == "entries" else 1 << 20, bytes=1 << 40, snapshots=0.0))
    primary, slow = shard.replicas[PRIMARY], backup(1)
    forwarder = primary.forwarder
    assert forwarder is not None
    shard.push(PRIMARY, _push(2))
    received = len(shard.received.get(slow, []))  # its earlier process's
    held = threading.Event()
    shard.add(slow)  # a restarted process of the backup: it Joins, and applies nothing of what it is sent
    shard.held_requests[(slow, ReplicateRequest.METHOD)] = held
    try:
        with caplog.at_level(logging.INFO, logger="psflow.ps.replication"):
            shard.start(slow)
            shard.wait(lambda: slow in forwarder.senders and shard.holding >= 1,
                       f"the Join of {slow} served, its snapshot's call held")
            sender = forwarder.senders[slow]
            snapshot = shard.received[slow][received]
            assert snapshot.seq == forwarder.last_seq
            shard.push(PRIMARY, _push(3))
            weight = sender.tally.bytes  # one push's entry, as counted (each the same)
            assert sender.tally.entries == 1 and weight > entry_bytes(shard.received[backup(0)][-1])
            after = 8
            if kind == "bytes":
                sender.tally.bound = QueueBound(entries=1 << 20, bytes=8 * weight, snapshots=0.0)
            elif kind == "snapshot":
                sender.tally.bound = QueueBound(entries=1 << 20, bytes=1, snapshots=2.0).for_snapshot(
                    sender.tally.snapshot)
                after = 2 * sender.tally.snapshot // weight
            assert after >= 2, (sender.tally.snapshot, weight)
            most = sender.pending()[0]
            for push_id in range(4, 40):  # the view's other backup acknowledges; the slow member applies nothing
                shard.push(PRIMARY, _push(push_id))
                if forwarder.senders.get(slow) is not sender:
                    break
                most = max(most, sender.pending()[0])
            assert forwarder.senders.get(slow) is not sender, "still sending to the member behind after 37 pushes"
        # its snapshot and the bound's entries after it (each push one entry), never more: let go at the next
        assert most == 1 + after, (most, after)
        assert sender.pending() == (0, 0.0)  # its queue freed
        lines = [r.getMessage() for r in caplog.records if "stopped replicating" in r.getMessage()]
        assert len(lines) == 1 and slow in lines[0] and "bound" in lines[0], lines
        assert f"at most {after + 1:,} entries" in lines[0], lines  # the peak, counted up to the entry let go at
        assert slow not in primary.view.view.backups
        shard.push(PRIMARY, _push(40))  # pushes go on without it
    finally:
        del shard.held_requests[(slow, ReplicateRequest.METHOD)]
        held.set()
    # the member, answering again, finds no sender to it and Joins again: a new snapshot, then caught up
    shard.wait_view(limit=20.0)
    shard.push(PRIMARY, _push(41))
    assert_same_state(shard.services[PRIMARY], shard.services[slow])


def test_an_entrys_state_counts_in_the_bound(make_shard: Callable[..., InProcessShard],
                                            caplog: pytest.LogCaptureFixture) -> None:
    """Each entry carries the small state (the dedup table, the workers, the clock: KBs, built for it): a bound of 8
    pushes' arrays is passed by the first push's entry after the snapshot. Before, the bound counted arrays only
    (this joiner was kept for 8 pushes, the state of 100,000 entries uncounted)."""
    shard = _shard(make_shard, QueueBound(entries=1 << 20, bytes=1 << 40, snapshots=0.0))
    primary, slow = shard.replicas[PRIMARY], backup(1)
    forwarder = primary.forwarder
    assert forwarder is not None
    shard.push(PRIMARY, _push(2))
    arrays = entry_bytes(shard.received[backup(0)][-1])
    primary.joins.bound = QueueBound(entries=1 << 20, bytes=8 * arrays, snapshots=0.0)
    held = threading.Event()
    shard.add(slow)
    shard.held_requests[(slow, ReplicateRequest.METHOD)] = held
    try:
        with caplog.at_level(logging.INFO, logger="psflow.ps.replication"):
            shard.start(slow)
            shard.wait(lambda: slow in forwarder.senders and shard.holding >= 1,
                       f"the Join of {slow} served, its snapshot's call held")
            sender = forwarder.senders[slow]
            shard.push(PRIMARY, _push(3))
            assert forwarder.senders.get(slow) is not sender, "a push's state did not count in the bound"
        lines = [r.getMessage() for r in caplog.records if "stopped replicating" in r.getMessage()]
        assert len(lines) == 1 and "1 entries" in lines[0] and "bound" in lines[0], lines
    finally:
        del shard.held_requests[(slow, ReplicateRequest.METHOD)]
        held.set()
    shard.wait_view(limit=20.0)
    assert_same_state(shard.services[PRIMARY], shard.services[slow])


def test_a_joining_member_that_keeps_up_joins_and_its_figures_are_logged(
        make_shard: Callable[..., InProcessShard], caplog: pytest.LogCaptureFixture) -> None:
    """A joiner whose snapshot's call was held while 6 pushes queued (under a bound of 8 entries) and that then
    applies them joins with the sender it started with; its line says what queued (the measured figures of
    benchmarks/RESULTS.md come from it)."""
    shard = _shard(make_shard, QueueBound(entries=8, bytes=1 << 40, snapshots=0.0))
    primary, slow = shard.replicas[PRIMARY], backup(1)
    forwarder = primary.forwarder
    assert forwarder is not None
    held = threading.Event()
    shard.add(slow)
    shard.held_requests[(slow, ReplicateRequest.METHOD)] = held
    with caplog.at_level(logging.INFO, logger="psflow.ps.replication"):
        try:
            shard.start(slow)
            shard.wait(lambda: slow in forwarder.senders and shard.holding >= 1,
                       f"the Join of {slow} served, its snapshot's call held")
            sender = forwarder.senders[slow]
            for push_id in range(2, 8):
                shard.push(PRIMARY, _push(push_id))
            assert forwarder.senders.get(slow) is sender and sender.tally.entries == 6
        finally:
            del shard.held_requests[(slow, ReplicateRequest.METHOD)]
            held.set()
        shard.wait_view(limit=20.0)
    assert forwarder.senders.get(slow) is sender
    lines = [r.getMessage() for r in caplog.records if f"{slow} caught up" in r.getMessage()]
    assert len(lines) == 1 and "at most 6 entries" in lines[0] and "acknowledged the snapshot after" in lines[0], lines
    assert not [r for r in caplog.records if "stopped replicating" in r.getMessage()]
    shard.push(PRIMARY, _push(8))
    assert_same_state(shard.services[PRIMARY], shard.services[slow])


def test_a_backup_of_the_view_past_the_bound_keeps_its_sender(make_shard: Callable[..., InProcessShard]) -> None:
    """The bound is a joining member's: a backup of the view holds up every push waiting for it (its queue is
    bounded by those waits); entries no call waits for (here recorded directly) never drop it."""
    shard = _shard(make_shard, QueueBound(entries=2, bytes=1))
    primary, member = shard.replicas[PRIMARY], backup(0)
    forwarder = primary.forwarder
    assert forwarder is not None and member in primary.view.view.backups
    sender = forwarder.senders[member]
    shard.cut.add(member)
    for _ in range(6):
        primary._record(forwarder, lambda: [])  # entries no call waits for: they queue for the cut-off backup
    assert forwarder.senders.get(member) is sender and sender.pending()[0] >= 3
    shard.cut.discard(member)
    shard.push(PRIMARY, _push(2))  # the backup answers again and acknowledges
    assert member in primary.view.view.backups and forwarder.senders.get(member) is sender
    assert_same_state(shard.services[PRIMARY], shard.services[member])
