"""Two steps in flight (psflow.train.step): the next batch computes while this one's push travels.

The ps tasks are in this process, behind channels that apply a call only when its reply is collected
(as a call that is still travelling would be), and record what was sent, applied and computed, in order.
"""

from __future__ import annotations

import pytest
from travelling_ps import WORKER, Recorder, travelling_client
from travelling_ps import batches as _batches
from travelling_ps import position as _position

from psflow.data import Batch
from psflow.errors import ConfigError
from psflow.models.api import Model, ModelError
from psflow.ps.client import ParameterClient
from psflow.train.config import SyncSettings
from psflow.train.step import StepResult, TrainStep

pytestmark = pytest.mark.timeout(60)


def _cluster(model: Model, events: list[tuple[str, ...]]) -> ParameterClient:
    return travelling_client(model, events)[0]


def _run(step: TrainStep, batches: list[Batch], count: int | None = None) -> list[StepResult]:
    """Calls ``step`` as the worker loop does, for the first ``count`` batches (default all)."""
    out = []
    for i in range(len(batches) if count is None else count):
        ahead = batches[i + 1:i + 3]
        out.append(step(batches[i], next_batch=ahead[0] if ahead else None, position=_position(i),
                        after_next=ahead[1] if len(ahead) > 1 else None))
    return out


def _push_sent(events: list[tuple[str, ...]], n: int, kind: str) -> int:
    """Index of the n-th (0-based) push call event of ``kind`` (send or reply) to the task holding global_step."""
    found = [i for i, e in enumerate(events) if e[0] == kind and e[1] == "/job:ps/task:0" and e[2].startswith("Push")]
    return found[n]


@pytest.mark.parametrize("k", [1, 2])
def test_with_two_in_flight_the_next_batch_computes_while_the_push_travels(k: int) -> None:
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    step = TrainStep(model, _cluster(model, events), steps_in_flight=k)
    _run(step, _batches(5))
    for t in range(4):
        sent, replied = _push_sent(events, t, "send"), _push_sent(events, t, "reply")
        computed = events.index(("compute", str(t + 1)))
        if k == 2:
            assert sent < computed < replied, (t, events)
        else:
            assert replied < computed, (t, events)
    # one call per ps task in flight: every send is replied to before the next send to that task
    for task in ("/job:ps/task:0", "/job:ps/task:1"):
        mine = [e[0] for e in events if e[0] in ("send", "reply") and e[1] == task]
        assert mine == ["send", "reply"] * (len(mine) // 2), (task, mine)


@pytest.mark.parametrize("k", [1, 2])
def test_each_call_returns_its_own_batchs_push_and_reads_at_most_k_minus_1_own_updates_late(k: int) -> None:
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    client = _cluster(model, events)
    step = TrainStep(model, client, steps_in_flight=k)
    batches = _batches(6)
    results = _run(step, batches)
    assert [r.step for r in results] == [1, 2, 3, 4, 5, 6]  # in order, each step value once
    assert [r.examples for r in results] == [b.num_examples for b in batches]
    assert [r.loss for r in results] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    # w after t of this worker's pushes is -t: batch t reads every own push before it (k=1) or all but the last
    assert model.read == {t: -float(max(0, t - (k - 1))) for t in range(6)}
    assert float(client.pull({"w": None})["w"][0]) == -6.0


def test_the_ledger_holds_the_position_of_the_last_applied_push_after_every_call() -> None:
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    client = _cluster(model, events)
    step = TrainStep(model, client, steps_in_flight=2)
    batches = _batches(5)
    for i in range(5):
        _run_one = batches[i + 1:i + 3]
        step(batches[i], next_batch=_run_one[0] if _run_one else None, position=_position(i),
             after_next=_run_one[1] if len(_run_one) > 1 else None)
        assert client.reader_positions()[WORKER] == _position(i)
        assert client.stats()["examples"] == sum(b.num_examples for b in batches[:i + 1])


def test_a_loop_that_stops_never_pushes_the_batch_it_computed_ahead() -> None:
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    client = _cluster(model, events)
    step = TrainStep(model, client, steps_in_flight=2)
    batches = _batches(6)
    results = _run(step, batches, count=2)  # the loop stops after batch 1 (max_steps, a stop request)
    assert ("compute", "2") in events  # batch 2 was computed ahead ...
    assert [r.step for r in results] == [1, 2]
    assert client.global_step() == 2  # ... and never pushed
    assert float(client.pull({"w": None})["w"][0]) == -2.0
    assert client.stats()["examples"] == batches[0].num_examples + batches[1].num_examples
    assert client.reader_positions()[WORKER] == _position(1)


def test_a_restarted_loop_computes_its_first_batch_again_and_pushes_each_batch_once() -> None:
    """A call for another batch than the one computed ahead (a loop reopened its data) drops that one."""
    events: list[tuple[str, ...]] = []
    model = Recorder(events)
    client = _cluster(model, events)
    step = TrainStep(model, client, steps_in_flight=2)
    batches = _batches(4)
    _run(step, batches, count=1)
    fresh = _batches(4)  # the same examples, new objects: what a reopened dataset yields
    results = [step(fresh[1], next_batch=fresh[2], position=_position(1), after_next=fresh[3]),
               step(fresh[2], next_batch=fresh[3], position=_position(2)), step(fresh[3], position=_position(3))]
    assert [r.step for r in results] == [2, 3, 4]
    assert client.stats()["examples"] == sum(b.num_examples for b in batches)


def test_a_compute_that_fails_collects_the_push_in_flight_first() -> None:
    events: list[tuple[str, ...]] = []
    model = Recorder(events, fail_on=1)
    client = _cluster(model, events)
    step = TrainStep(model, client, steps_in_flight=2)
    batches = _batches(3)
    with pytest.raises(ModelError, match="batch 1 fails"):
        step(batches[0], next_batch=batches[1], position=_position(0), after_next=batches[2])
    assert _push_sent(events, 0, "reply") > events.index(("compute", "1"))  # collected after the failure
    assert client.global_step() == 1  # batch 0's push was applied, and the client makes calls again
    assert client.reader_positions()[WORKER] == _position(0)


def test_steps_in_flight_settings() -> None:
    assert SyncSettings().steps_in_flight == 1  # the default: as before
    assert SyncSettings(mode="sync").steps_in_flight == 1
    assert SyncSettings(mode="ssp", steps_in_flight=2).steps_in_flight == 2
    with pytest.raises(ConfigError, match="--steps-in-flight must be 1 to 8, got None"):
        SyncSettings(steps_in_flight=None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="--steps-in-flight 2 needs --mode async or ssp"):
        SyncSettings(mode="sync", steps_in_flight=2)
    with pytest.raises(ConfigError, match="--steps-in-flight 2 is for between-graph workers"):
        SyncSettings(replication="in-graph", steps_in_flight=2)
    assert SyncSettings(steps_in_flight=8).steps_in_flight == 8  # psflow.train.pipeline
    with pytest.raises(ConfigError, match="--steps-in-flight must be 1 to 8, got 9"):
        SyncSettings(steps_in_flight=9)
    with pytest.raises(ConfigError, match="--steps-in-flight 3 needs --mode async"):
        SyncSettings(mode="ssp", steps_in_flight=3)
    with pytest.raises(ValueError, match="steps_in_flight must be 1 or 2, got 0"):
        events: list[tuple[str, ...]] = []
        model = Recorder(events)
        TrainStep(model, _cluster(model, events), steps_in_flight=0)
