"""A joining member that is gone for good (its host lost, never restarted) no longer keeps a sender on the
primary, nor the queue of every entry since its snapshot (which grew with every push until the ps task ran out
of memory): once it answered no call for a few Replicate deadlines, its sender stops and its queue is freed,
with one warning naming it (psflow/ps/replication/joins.py); the member, reachable again, Joins again
(psflow/ps/replication/startup.py's watch_view). A backup of the view is never let go this way.
Driven by a fake clock (the primary's Joins.clock) and by counts of its reads: no timed assertion."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, assert_same_state, backup, layout

from psflow.ps.protocol import PushRequest, WorkerTag
from psflow.ps.sync import SyncConfig

pytestmark = pytest.mark.timeout(60)


def _push(push_id: int) -> PushRequest:
    return PushRequest([("w/part_0", np.full((1, 4), 0.01, np.float32), np.array([push_id % 20], np.int64)),
                        ("b/part_0", np.full(4, 0.01, np.float32), None)],
                       WorkerTag(WORKERS[0], 1, push_id=push_id, acked=push_id - 1), step=True, examples=1)


class _Clock:
    """A fake monotonic clock: ``now`` moves only when the test says; ``reads`` counts its reads."""

    def __init__(self) -> None:
        self.now, self.reads, self._lock = 1000.0, 0, threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            self.reads += 1
            return self.now


def _shard(make_shard: Callable[..., InProcessShard], backups: int) -> tuple[InProcessShard, _Clock]:
    shard = make_shard(backups=backups)
    clock = _Clock()
    shard.replicas[PRIMARY].joins.clock = clock
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    shard.push(PRIMARY, _push(1))
    return shard, clock


def test_a_joining_member_that_never_answers_loses_its_sender_and_queue(
        make_shard: Callable[..., InProcessShard], caplog: pytest.LogCaptureFixture) -> None:
    shard, clock = _shard(make_shard, backups=2)
    primary, gone = shard.replicas[PRIMARY], backup(1)
    forwarder = primary.forwarder
    assert forwarder is not None
    shard.add(gone)  # a restarted process of the backup, whose host is then lost: the primary reaches it no more
    shard.cut.add(gone)
    with caplog.at_level(logging.INFO, logger="psflow.ps.replication"):
        shard.start(gone)
        shard.wait(lambda: gone in forwarder.senders and forwarder.senders[gone].last_error is not None,
                   f"the Join of {gone} served, its sender failing")
        sender = forwarder.senders[gone]
        assert gone not in primary.view.view.backups
        for push_id in range(2, 6):  # the view's other backup acknowledges; the gone member's queue grows
            shard.push(PRIMARY, _push(push_id))
        assert sender.pending()[0] >= 5, sender.pending()  # its snapshot and the four pushes at least
        reads = clock.reads
        shard.wait(lambda: clock.reads > reads + 1, "a failed call looked at the clock")
        assert gone in forwarder.senders  # within the limit: kept
        clock.now += 30.0  # six Replicate deadlines of 5 s with no answer
        shard.wait(lambda: gone not in forwarder.senders, f"{gone}'s sender stopped")
        # its thread logs the line once it released the forwarder's lock: after the test may see it stopped
        shard.wait(lambda: any("stopped replicating" in r.getMessage() for r in caplog.records), "the line logged")
    assert sender.pending() == (0, 0.0)  # its queue freed
    lines = [r.getMessage() for r in caplog.records if "stopped replicating" in r.getMessage()]
    assert len(lines) == 1 and gone in lines[0], lines
    shard.push(PRIMARY, _push(6))
    assert gone not in forwarder.senders
    # the member, reachable again (the same process: its watch_view sees no sender to it), Joins again
    with caplog.at_level(logging.INFO, logger="psflow.ps.replication"):
        shard.cut.discard(gone)
        shard.wait_view()
    assert any("has no sender to this joining member" in r.getMessage() for r in caplog.records)
    shard.push(PRIMARY, _push(7))
    assert_same_state(shard.services[PRIMARY], shard.services[gone])


def test_a_backup_of_the_view_is_never_let_go_for_its_silence(make_shard: Callable[..., InProcessShard]) -> None:
    shard, clock = _shard(make_shard, backups=1)
    primary, member = shard.replicas[PRIMARY], backup(0)
    forwarder = primary.forwarder
    assert forwarder is not None and member in primary.view.view.backups
    sender = forwarder.senders[member]
    shard.cut.add(member)
    clock.now += 1000.0
    primary._record(forwarder, lambda: [])  # an entry nothing waits for: only the sender's thread sends it
    shard.wait(lambda: sender.last_error is not None, f"{member}'s sender failing")
    reads = clock.reads
    shard.wait(lambda: clock.reads > reads + 1, "two more failed calls")
    assert forwarder.senders.get(member) is sender and sender.pending()[0] >= 1
    shard.cut.discard(member)
    shard.push(PRIMARY, _push(2))  # the backup answers again and acknowledges
    assert_same_state(shard.services[PRIMARY], shard.services[member])
