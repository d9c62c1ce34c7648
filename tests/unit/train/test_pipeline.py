"""K-1 pushes in flight per worker (psflow.train.pipeline, ``--steps-in-flight K`` >= 3).

The ps tasks are in this process. ``TravellingChannel`` applies a call only when its reply is collected
(a call still travelling); ``ReorderingChannel`` delivers each call from a thread of its own, later calls
first, so only the ps task's ordering (psflow.ps.push_order) puts them back in order.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from travelling_ps import WORKER, Recorder, TravellingCall, TravellingChannel, travelling_client
from travelling_ps import batches as _batches
from travelling_ps import position as _position

from psflow.data import Batch
from psflow.errors import ConfigError
from psflow.gradients import DenseGradient
from psflow.models.api import Model
from psflow.ps.client import ClientError, ParameterClient
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import FailedPreconditionError
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.config import TrainConfig
from psflow.train.pipeline import PipelinedStep
from psflow.train.step import StepResult

pytestmark = pytest.mark.timeout(60)


class ReorderingChannel(TravellingChannel):
    """Push calls are held until ``hold`` of them were sent, then delivered at once, the latest first, each
    from a thread of its own (as a server's handler threads would run calls that overtook each other)."""

    def __init__(self, task: str, service: ParameterService, events: list[tuple[str, ...]], hold: int) -> None:
        super().__init__(task, service, events)
        self._hold, self._held = hold, []
        self._served = InProcessChannel(task, service.handlers())

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> TravellingCall:
        if not method.startswith("Push"):
            return super().call_async(method, meta, arrays, timeout=timeout)
        box: dict[str, Any] = {}
        done = threading.Event()

        def serve() -> None:
            try:
                box["frame"] = self._served.call_async(method, meta, arrays, timeout=timeout).result()
            except BaseException as e:  # noqa: BLE001 -- handed to the caller
                box["error"] = e
            done.set()

        self._held.append(threading.Thread(target=serve, daemon=True))
        if len(self._held) >= self._hold:
            for t in reversed(self._held):
                t.start()
            self._held = []

        def collect() -> Frame:
            for t in reversed(self._held):  # the loop ended: deliver what is still held
                t.start()
            self._held = []
            if not done.wait(30):
                raise AssertionError("a push was never served")
            if "error" in box:
                raise box["error"]
            frame: Frame = box["frame"]
            return frame

        return TravellingCall(collect)


def _client(model: Model, events: list[tuple[str, ...]], hold: int = 0,
            sync: SyncConfig | None = None) -> tuple[ParameterClient, list[ParameterService]]:
    if not hold:
        return travelling_client(model, events, sync=sync)
    return travelling_client(model, events, sync=sync,
                             channel=lambda task, service, log: ReorderingChannel(task, service, log, hold))


def _run(step: PipelinedStep, batches: list[Batch], count: int | None = None,
         generation: dict[int, int] | None = None) -> list[StepResult]:
    """Calls ``step`` as the worker loop does (K batches ahead) for the first ``count`` batches, then drains."""
    out: list[StepResult] = []
    k = step.steps_in_flight
    for i in range(len(batches) if count is None else count):
        r = step.step(batches[i], ahead=batches[i + 1:i + 1 + k], position=_position(i),
                      generation=(generation or {}).get(i))
        if r is not None:
            out.append(r)
    return out + step.drain()


def _pushes(events: list[tuple[str, ...]], kind: str) -> list[int]:
    """Indexes of the push call events of ``kind`` (send or reply) to the task holding global_step."""
    return [i for i, e in enumerate(events) if e[0] == kind and e[1] == "/job:ps/task:0" and e[2].startswith("Push")]


@pytest.mark.parametrize("k", [3, 4])
def test_k_minus_1_pushes_travel_while_the_worker_computes(k: int) -> None:
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    client, _ = _client(model, events)
    _run(PipelinedStep(model, client, steps_in_flight=k), _batches(8))
    sent, replied = _pushes(events, "send"), _pushes(events, "reply")
    assert len(sent) == len(replied) == 8
    for t in range(k - 1, 8):  # batch t computes while the pushes of t-k+1 .. t-1 travel
        computed = events.index(("compute", str(t)))
        assert sent[t - 1] < computed < replied[t - k + 1], (t, events)
        if t - k >= 0:
            assert replied[t - k] < computed
    for t in range(8):  # never more than k-1 in flight: when push t replies, the ones sent after the t before it
        assert sum(1 for s in sent if s < replied[t]) - t <= k - 1


@pytest.mark.parametrize("k", [3, 5])
def test_results_come_in_order_once_each_and_a_batch_reads_all_but_its_k_minus_1_latest_own_updates(k: int) -> None:
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    client, _ = _client(model, events)
    step = PipelinedStep(model, client, steps_in_flight=k)
    batches = _batches(9)
    results = _run(step, batches)
    assert [r.step for r in results] == list(range(1, 10))
    assert [r.loss for r in results] == [float(i) for i in range(9)]
    assert [r.examples for r in results] == [b.num_examples for b in batches]
    assert model.read == {t: -float(max(0, t - (k - 1))) for t in range(9)}
    assert float(client.pull({"w": None})["w"][0]) == -9.0
    assert client.reader_positions()[WORKER] == _position(8)
    assert client.stats()["examples"] == sum(b.num_examples for b in batches)


def test_pushes_that_overtake_each_other_are_applied_in_the_order_made() -> None:
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    client, services = _client(model, events, hold=3)  # every 3 pushes to a task arrive latest first
    results = _run(PipelinedStep(model, client, steps_in_flight=4), _batches(9))
    assert [r.step for r in results] == list(range(1, 10))  # push i produced step i + 1: applied in order
    assert [r.loss for r in results] == [float(i) for i in range(9)]
    assert client.reader_positions()[WORKER] == _position(8)
    assert services[0].order.waiting() == 0


def test_a_loop_that_stops_collects_what_is_in_flight_and_never_pushes_more() -> None:
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    client, _ = _client(model, events)
    step = PipelinedStep(model, client, steps_in_flight=4)
    batches = _batches(9)
    results = _run(step, batches, count=5)  # the loop stops after batch 4 (max_steps, a stop request)
    assert [r.step for r in results] == [1, 2, 3, 4, 5] and step.in_flight == 0
    assert client.global_step() == 5
    assert client.stats()["examples"] == sum(b.num_examples for b in batches[:5])
    assert client.reader_positions()[WORKER] == _position(4)


def test_a_refused_push_fails_the_step_and_none_after_it_is_applied() -> None:
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    client, services = _client(model, events)
    generation = services[0].gate.generation
    step = PipelinedStep(model, client, steps_in_flight=4)
    with pytest.raises(FailedPreconditionError) as caught:
        _run(step, _batches(9), generation={i: generation + (1 if i == 2 else 0) for i in range(9)})
    assert client.global_step() == 2  # batches 0 and 1; 2 was refused (another restore generation) ...
    assert client.reader_positions()[WORKER] == _position(1)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "push 2" in notes  # ... and the pushes in flight after it were refused in their turn
    assert step.in_flight == 0


def test_a_new_pipeline_on_the_same_client_starts_a_new_sequence() -> None:
    """A worker's loop that starts over (after a recovery) numbers its pushes from 0 again."""
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    client, _ = _client(model, events)
    _run(PipelinedStep(model, client, steps_in_flight=3), _batches(4))
    results = _run(PipelinedStep(model, client, steps_in_flight=3), _batches(4))
    assert [r.step for r in results] == [5, 6, 7, 8]


def test_where_k_above_2_is_refused() -> None:
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    client, _ = _client(model, events, sync=SyncConfig(mode="ssp", staleness=2))
    with pytest.raises(ValueError, match="async"):
        PipelinedStep(model, client, steps_in_flight=3)
    client, _ = _client(model, events)
    with pytest.raises(ValueError, match="3 to 8"):
        PipelinedStep(model, client, steps_in_flight=2)
    with pytest.raises(ConfigError, match="--steps-in-flight 3 needs --transport grpc"):
        TrainConfig.flat(train=("x",), num_features=4, transport="tcp", steps_in_flight=3)
    assert TrainConfig.flat(train=("x",), num_features=4, steps_in_flight=8).sync.steps_in_flight == 8


def test_an_ordered_push_before_start_ordered_is_refused_naming_what_is_missing() -> None:
    events: list[tuple[str, ...]] = []
    client, services = _client(Recorder(events), events)
    grads = {"w": DenseGradient(np.ones(1, np.float32))}
    with pytest.raises(ClientError, match=r"start_ordered\(\)") as caught:
        client.send_push_pull(grads, None, ordered=True)
    assert WORKER in str(caught.value) and "replicated" not in str(caught.value)  # (this cluster is not)
    assert events == [] and services[0].global_step is not None and services[0].global_step.value == 0
