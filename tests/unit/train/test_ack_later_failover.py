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
from travelling_ps import WORKER, Recorder, TravellingCall
from travelling_ps import batches as _batches
from travelling_ps import position as _position

from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig, TaskUnavailableError
from psflow.rpc.framing import Frame
from psflow.train.step import TrainStep

pytestmark = pytest.mark.timeout(90)

BACKUP = backup(0)
ROWS, ACKED = "PushPullAckLater", "Acked"
LOGGED = (ROWS, ACKED, "Push", "PushPull")


class Network:
    """The worker's side of the network to the shard's members: calls travel until their reply is collected;
    the primary dies at its ``kill_at``-th PushPullAckLater (1-based): ``"after_rows"``, once it replied with the
    rows (the reply gets through), or ``"at_ack"``, as that push's Acked call reaches it once the backup
    received the push's entry (the Acked call is refused)."""

    def __init__(self, shard: InProcessShard, kill_at: int, when: str, events: list[tuple[str, ...]]) -> None:
        self.shard, self.kill_at, self.when, self.events = shard, kill_at, when, events
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
        self._refuse_if_dead(task, method)
        frame = Link(self.shard, task).call(method, meta, arrays, timeout=timeout)
        if task == PRIMARY and method == ROWS:
            self.rows += 1
            if self.rows == self.kill_at and self.when == "after_rows":
                self.kill()  # its reply still gets through: the rows were on their way
        return frame

    def kill(self) -> None:
        self.events.append(("killed", PRIMARY))
        self.shard.cut.add(PRIMARY)  # its backup cannot reach it either (Promote checks)

    def _refuse_if_dead(self, task: str, method: str) -> None:
        if task in self.shard.cut:  # what a channel says of a dead process's address
            raise TaskUnavailableError(f"{task}: {method}: UNAVAILABLE: Connection refused (test: the process died)")


class TravellingLink:
    """A channel to one member over :class:`Network`: logs each send and reply of a data call in ``events``."""

    def __init__(self, network: Network, task: str) -> None:
        self.network, self.task, self.address = network, task, "in-process"

    def wait_ready(self, timeout: float | None = None) -> None:
        """Returns at once."""

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> TravellingCall:
        events = self.network.events
        if method in LOGGED:
            events.append(("send", self.task, method))

        def run() -> Frame:
            if method in LOGGED:
                events.append(("reply", self.task, method))
            return self.network.deliver(self.task, method, meta, arrays, timeout)

        return TravellingCall(run)

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def close(self) -> None:
        """Nothing to close."""


def _client(shard: InProcessShard, network: Network, model: Recorder, monkeypatch: pytest.MonkeyPatch
            ) -> ParameterClient:
    """The worker's client of ``model`` (w zero, SGD at rate 1) on the replicated shard, registered."""
    monkeypatch.setattr("psflow.ps.client.open_channel", lambda transport, task, address, service, config:
                        TravellingLink(network, task))
    variables = VariableSet(replica_device_setter(cluster=shard.cluster))
    for spec in model.variables():
        variables.get_variable(spec.name, spec.shape)
    client = ParameterClient(shard.cluster, variables.placements(), client_name=WORKER,
                             config=ConnectConfig(backoff_initial=0.001, connect_timeout=10.0), failover_timeout=10.0)
    client.connect()
    client.register(OptimizerSpec("sgd", {"learning_rate": 1.0}), chief=True)
    assert client.router is not None and client.acks_later
    return client


@pytest.mark.parametrize("when", ["none", "after_rows", "at_ack"])
def test_a_primary_dying_between_the_rows_and_the_ack_loses_and_repeats_nothing(
        make_shard: Callable[..., InProcessShard], monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    events: list[tuple[str, ...]] = []
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    network = Network(shard, kill_at=3 if when != "none" else 0, when=when, events=events)  # batch 2's push
    model = Recorder(events)
    client = _client(shard, network, model, monkeypatch)
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
