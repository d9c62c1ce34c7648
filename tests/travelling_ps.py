"""In-process ps tasks behind channels whose calls are applied only when their reply is collected (as a call
that is still travelling would be), and a one-weight model that records what it read: the shared set-up of the
steps-in-flight unit tests (tests/unit/train/test_two_steps_in_flight.py, test_pipeline.py).

Every send and every reply is logged in ``events`` as ``("send" | "reply", task, method)``, every compute as
``("compute", batch number)``, in the order they happened.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from psflow.cluster import ClusterSpec
from psflow.data import Batch
from psflow.gradients import DenseGradient
from psflow.models.api import Lookups, Model, ModelConfig, ModelError, ModelOutput, Values, VariableSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel

WORKER = "/job:worker/task:0"
Events = list[tuple[str, ...]]


class TravellingCall:
    """A call in flight: ``run`` delivers it (and returns its reply) when :meth:`result` is called."""

    def __init__(self, run: Callable[[], Frame]) -> None:
        self._run = run

    def result(self) -> Frame:
        return self._run()


class TravellingChannel:
    """An in-process ps task whose calls are applied when their reply is collected; logs sends and replies."""

    def __init__(self, task: str, service: ParameterService, events: Events) -> None:
        self.task, self.address = task, "in-process"
        self._inner = InProcessChannel(task, service.handlers())
        self._events = events

    def wait_ready(self, timeout: float | None = None) -> None:
        return None

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> TravellingCall:
        self._events.append(("send", self.task, method))

        def run() -> Frame:
            self._events.append(("reply", self.task, method))
            return self._inner.call_async(method, meta, arrays, timeout=timeout).result()

        return TravellingCall(run)

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def close(self) -> None:
        return None


class Recorder(Model):
    """One weight ``w``; a batch's gradient is 1 (so SGD at rate 1 takes 1 off ``w`` per applied push), its
    loss is its label (the batch's number); every compute logs the batch and the ``w`` it read; batch
    ``fail_on`` raises ModelError."""

    name = "recorder"

    def __init__(self, events: Events, fail_on: int | None = None) -> None:
        super().__init__(ModelConfig())
        self.events = events
        self.fail_on = fail_on
        self.read: dict[int, float] = {}

    def variables(self) -> Sequence[VariableSpec]:
        return [VariableSpec("w", (1,))]

    def lookups(self, batch: Batch) -> Lookups:
        return {"w": None}

    def compute(self, batch: Batch, values: Values) -> ModelOutput:
        number = int(batch.labels[0])
        self.events.append(("compute", str(number)))
        if number == self.fail_on:
            raise ModelError(f"batch {number} fails")
        self.read[number] = float(values["w"][0])
        return ModelOutput(float(number), {"w": DenseGradient(np.ones(1, np.float32))},
                           {"predictions": np.full(batch.num_examples, 0.5)})

    def predict(self, batch: Batch, values: Values) -> dict[str, np.ndarray]:
        return {"predictions": np.full(batch.num_examples, 0.5)}


def travelling_client(model: Model, events: Events, *, sync: SyncConfig | None = None,
                      channel: Callable[[str, ParameterService, Events], TravellingChannel] = TravellingChannel,
                      ) -> tuple[ParameterClient, list[ParameterService]]:
    """A registered client of ``model`` (variables zero, SGD at rate 1) over two in-process ps tasks, each
    behind ``channel(task, service, events)``; ``events`` cleared after the registration."""
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
    variables = VariableSet(replica_device_setter(cluster=cluster))
    for spec in model.variables():
        variables.get_variable(spec.name, spec.shape)  # zeros
    services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]
    channels = {i: channel(f"/job:ps/task:{i}", s, events) for i, s in enumerate(services)}
    client = ParameterClient(cluster, variables.placements(), client_name=WORKER, channels=channels, sync=sync)
    client.register(OptimizerSpec("sgd", {"learning_rate": 1.0}), chief=True)
    events.clear()
    return client, services


def batches(n: int) -> list[Batch]:
    """Batch i has i + 1 examples, each labelled i."""
    return [Batch(np.full(i + 1, i, np.float32), {}, {}) for i in range(n)]


def position(i: int) -> str:
    """The (made-up) reader position after batch ``i``."""
    return json.dumps({"batch": i})
