"""One step in flight on a replicated shard, async (psflow/train/step.py over PushPullAckLater and Acked,
issue 28): the push's rows come first, the next batch computes, then the acknowledgement is collected; the
shard's primary dies between the rows and the acknowledgement.

In process: the shard is real (a primary and its backup, each a ParameterService with its ShardReplication,
tests/replica_shard.py); the worker's client routes by a real ShardRouter over channels that deliver a call
only when its reply is collected (as a call still travelling would be). The primary dies right after it
applied push 3 and replied with the rows (its entry most likely never reached the backup: the promoted backup
applies the resent push), or once the backup received that entry, as the Acked call reaches it (the promoted
backup answers the resend from its dedup table). Either way: each call returns its own push's step, once the
push is acknowledged; every push is applied exactly once; each batch read every earlier push (one step in
flight's gradients); the reader position is the last pushed batch's; and acknowledged == applied.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
from replica_shard import PRIMARY, InProcessShard, Link, backup
from travelling_ps import WORKER, Recorder
from travelling_ps import batches as _batches
from travelling_ps import position as _position
from travelling_shard import ShardNetwork, shard_client

from psflow.rpc.framing import Frame
from psflow.train.step import TrainStep

pytestmark = pytest.mark.timeout(90)

BACKUP = backup(0)
ROWS, ACKED = "PushPullAckLater", "Acked"
LOGGED = (ROWS, ACKED, "Push", "PushPull")


class Network(ShardNetwork):
    """The worker's side of the network to the shard's members: calls travel until their reply is collected;
    the primary dies at its ``kill_at``-th PushPullAckLater (1-based): ``"after_rows"``, once it replied with the
    rows (the reply gets through), or ``"at_ack"``, as that push's Acked call reaches it once the backup
    received the push's entry (the Acked call is refused)."""

    def __init__(self, shard: InProcessShard, kill_at: int, when: str, events: list[tuple[str, ...]]) -> None:
        super().__init__(shard, kill_at, when, events, LOGGED)
        self.rows = 0

    def deliver(self, task: str, method: str, meta: Mapping[str, Any] | None,
                arrays: Mapping[str, np.ndarray] | None, timeout: float | None) -> Frame:
        at_kill = task == PRIMARY and self.rows == self.kill_at
        if at_kill and method == ACKED and self.when == "at_ack":
            replica, forwarder = self.shard.replicas[BACKUP], self.shard.replicas[PRIMARY].forwarder
            assert forwarder is not None
            self.shard.wait(lambda: replica.applier.received_seq >= forwarder.last_seq, "the backup has the entry",
                           limit=30.0)
            self.kill()
        self.refuse_if_dead(task, method)
        frame = Link(self.shard, task).call(method, meta, arrays, timeout=timeout)
        if task == PRIMARY and method == ROWS:
            self.rows += 1
            if self.rows == self.kill_at and self.when == "after_rows":
                self.kill()  # its reply still gets through: the rows were on their way
        return frame


@pytest.mark.parametrize("when", ["none", "after_rows", "at_ack"])
def test_a_primary_dying_between_the_rows_and_the_ack_loses_and_repeats_nothing(
        make_shard: Callable[..., InProcessShard], monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    events: list[tuple[str, ...]] = []
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    network = Network(shard, kill_at=3 if when != "none" else 0, when=when, events=events)  # batch 2's push
    model = Recorder(events)
    client = shard_client(shard, network, model, monkeypatch)
    assert client.acks_later
    step = TrainStep(model, client)
    batches = _batches(6)
    results = []
    for i in range(6):
        results.append(step(batches[i], next_batch=batches[i + 1] if i + 1 < 6 else None, position=_position(i)))
        assert client.reader_positions()[WORKER] == _position(i)  # nothing in flight; on either member

    # Batch 3 computed between batch 2's rows and the collection of its acknowledgement; the call for batch 2
    # returned after that.
    at = 0
    served = PRIMARY if when == "none" else BACKUP
    for event in (("compute", "2"), ("send", PRIMARY, ROWS), ("reply", PRIMARY, ROWS), ("send", PRIMARY, ACKED),
                  ("compute", "3"), ("reply", PRIMARY, ACKED)):
        at = events.index(event, at)  # each after the one before (ValueError: not in that order)
    if when != "none":  # the push alone, resent to the promoted backup
        at = events.index(("reply", BACKUP, "Push"), events.index(("killed", PRIMARY)))
        assert ("reply", BACKUP, ROWS) not in events[:at]
        assert client.router is not None and client.router.routes[0][0] == BACKUP and client.router.failovers == 1

    # Each call returned its own push's step, each step once; each push applied exactly once (SGD at rate 1,
    # gradient 1: w is minus the pushes applied), each batch read every earlier push (one step in flight).
    assert [r.step for r in results] == [1, 2, 3, 4, 5, 6]
    assert [r.loss for r in results] == [float(i) for i in range(6)]
    assert model.read == {t: -float(t) for t in range(6)}
    assert shard.services[served].store.get("w/part_0").value.tolist() == [-6.0]
    stats = shard.replicas[served].stats()
    assert stats["role"] == "primary" and stats["pushes_applied"] == 6
    assert client.acked == {0: 6}  # each push acknowledged once, the resent one too
    assert client.stats()["examples"] == sum(b.num_examples for b in batches)
    client.leave()
    assert shard.replicas[served].stats()["pushes_acknowledged"] == 6
