"""A worker's client of a real replicated shard (tests/replica_shard.py) over channels whose calls are delivered
only when their reply is collected (tests/travelling_ps.py), and a network that kills the shard's primary at a
chosen call: the shared set-up of the steps-in-flight failover unit tests
(tests/unit/train/test_two_in_flight_failover.py, test_ack_later_failover.py).

Each test's network subclasses :class:`ShardNetwork` with its own :meth:`~ShardNetwork.deliver` (when the
primary dies); the calls of ``logged`` methods are logged in ``events`` as ``("send" | "reply", task, method)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest
from replica_shard import PRIMARY, InProcessShard
from travelling_ps import WORKER, Recorder, TravellingCall

from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig, TaskUnavailableError
from psflow.rpc.framing import Frame

Events = list[tuple[str, ...]]


class ShardNetwork:
    """The worker's side of the network to the shard's members; :meth:`kill` cuts the primary off (what a
    channel says of a dead process's address, and its backup cannot reach it either: Promote checks)."""

    def __init__(self, shard: InProcessShard, kill_at: int, when: str, events: Events,
                 logged: Sequence[str]) -> None:
        self.shard, self.kill_at, self.when, self.events, self.logged = shard, kill_at, when, events, tuple(logged)

    def open(self, task: str) -> TravellingLink:
        return TravellingLink(self, task)

    def deliver(self, task: str, method: str, meta: Mapping[str, Any] | None,
                arrays: Mapping[str, np.ndarray] | None, timeout: float | None) -> Frame:
        raise NotImplementedError

    def kill(self) -> None:
        self.events.append(("killed", PRIMARY))
        self.shard.cut.add(PRIMARY)

    def refuse_if_dead(self, task: str, method: str) -> None:
        if task in self.shard.cut:
            raise TaskUnavailableError(f"{task}: {method}: UNAVAILABLE: Connection refused (test: the process died)")


class TravellingLink:
    """A channel to one member over a :class:`ShardNetwork`: logs each send and reply of its logged calls."""

    def __init__(self, network: ShardNetwork, task: str) -> None:
        self.network, self.task, self.address = network, task, "in-process"

    def wait_ready(self, timeout: float | None = None) -> None:
        """Returns at once."""

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> TravellingCall:
        network = self.network
        if method in network.logged:
            network.events.append(("send", self.task, method))

        def run() -> Frame:
            if method in network.logged:
                network.events.append(("reply", self.task, method))
            return network.deliver(self.task, method, meta, arrays, timeout)

        return TravellingCall(run)

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def close(self) -> None:
        """Nothing to close."""


def shard_client(shard: InProcessShard, network: ShardNetwork, model: Recorder,
                 monkeypatch: pytest.MonkeyPatch) -> ParameterClient:
    """The worker's client of ``model`` (w zero, SGD at rate 1) on the replicated shard, over ``network``,
    registered as the chief."""
    monkeypatch.setattr("psflow.ps.client.open_channel", lambda transport, task, address, service, config:
                        network.open(task))
    variables = VariableSet(replica_device_setter(cluster=shard.cluster))
    for spec in model.variables():
        variables.get_variable(spec.name, spec.shape)
    client = ParameterClient(shard.cluster, variables.placements(), client_name=WORKER,
                             config=ConnectConfig(backoff_initial=0.001, connect_timeout=10.0), failover_timeout=10.0)
    client.connect()
    client.register(OptimizerSpec("sgd", {"learning_rate": 1.0}), chief=True)
    assert client.router is not None
    return client
