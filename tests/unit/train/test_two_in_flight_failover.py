"""Two steps in flight on a replicated shard (psflow/train/step.py over psflow/ps/failover.py, issue 28): the
shard's primary dies while a push is travelling and the next batch is being computed.

In process: the shard is real (a primary and its backup, each a ParameterService with its ShardReplication,
tests/replica_shard.py); the worker's client routes by a real ShardRouter over channels that deliver a call
only when its reply is collected (as a call still travelling would be), so the push of batch t is in flight
while batch t+1 computes. The primary dies either before the push reaches it (the request lost: the promoted
backup applies the resend) or after it applied and replicated it (the reply lost: the promoted backup answers
the resend from its dedup table without applying it again). Either way: each call returns its own push's
step, every push is applied exactly once, the reader position is the last pushed batch's, and every push is
counted acknowledged once.
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

pytestmark = pytest.mark.timeout(60)

BACKUP = backup(0)
PUSHES = ("Push", "PushPull")


class Network(ShardNetwork):
    """The worker's side of the network to the shard's members: calls travel until their reply is collected;
    the primary dies at its ``kill_at``-th push call (1-based), ``"before"`` it is delivered or ``"after"`` it
    was applied (and replicated), its reply lost."""

    def __init__(self, shard: InProcessShard, kill_at: int, when: str, events: list[tuple[str, ...]]) -> None:
        super().__init__(shard, kill_at, when, events, PUSHES)
        self.pushes = 0

    def deliver(self, task: str, method: str, meta: Mapping[str, Any] | None,
                arrays: Mapping[str, np.ndarray] | None, timeout: float | None) -> Frame:
        if task == PRIMARY and method in PUSHES:
            self.pushes += 1
            if self.pushes == self.kill_at and self.when == "before":
                self.kill()
        self.refuse_if_dead(task, method)
        frame = Link(self.shard, task).call(method, meta, arrays, timeout=timeout)
        if task == PRIMARY and method in PUSHES and self.pushes == self.kill_at and self.when == "after":
            self.kill()
            self.refuse_if_dead(task, method)
        return frame


def _started(make_shard: Callable[..., InProcessShard]) -> InProcessShard:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    return shard


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_primary_dying_while_a_push_travels_and_the_next_batch_computes_loses_and_repeats_nothing(
        make_shard: Callable[..., InProcessShard], monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    events: list[tuple[str, ...]] = []
    shard = _started(make_shard)
    network = Network(shard, kill_at=3, when=when, events=events)  # batch 2's push
    model = Recorder(events)
    client = shard_client(shard, network, model, monkeypatch)
    step = TrainStep(model, client, steps_in_flight=2)
    batches = _batches(6)
    results = []
    for i in range(6):
        ahead = batches[i + 1:i + 3]
        results.append(step(batches[i], next_batch=ahead[0] if ahead else None, position=_position(i),
                            after_next=ahead[1] if len(ahead) > 1 else None))
        assert client.reader_positions()[WORKER] == _position(i)  # the last pushed batch's, on either member

    # The failover happened while batch 3 computed: batch 2's push was sent, batch 3 computed, then the reply
    # was collected (failed: the primary was dead), and the push resent to the promoted backup.
    at = 0
    for event in (("compute", "2"), ("send", PRIMARY, "PushPull"), ("compute", "3"), ("killed", PRIMARY),
                  ("reply", BACKUP, "PushPull")):
        at = events.index(event, at)  # each after the one before (ValueError: not in that order)
    assert client.router is not None and client.router.routes[0][0] == BACKUP and client.router.failovers == 1

    # Each call returned its own push's step, each step once; each push applied exactly once (SGD at rate 1,
    # gradient 1: w is minus the pushes applied), each batch read every own push but the one in flight.
    assert [r.step for r in results] == [1, 2, 3, 4, 5, 6]
    assert [r.loss for r in results] == [float(i) for i in range(6)]
    assert model.read == {t: -float(max(0, t - 1)) for t in range(6)}
    assert shard.services[BACKUP].store.get("w/part_0").value.tolist() == [-6.0]
    stats = shard.replicas[BACKUP].stats()
    assert stats["role"] == "primary" and stats["pushes_applied"] == 6
    assert client.acked == {0: 6}  # each push acknowledged once, the resent one too
    assert client.stats()["examples"] == sum(b.num_examples for b in batches)
