"""How often a non-chief asks whether the chief made the ps tasks ready (psflow.ps.registration.ready_waits).

Issue 29: the second worker of a short run asked at 0.05, 0.1, 0.2 s... and started its first step up to 0.35 s
after the chief had initialized the variables; its data then ended that much after the chief's.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SetReadyRequest
from psflow.ps.registration import ready_waits
from psflow.ps.service import ParameterService
from psflow.rpc.api import ConnectConfig, TaskUnavailableError
from psflow.rpc.inprocess import InProcessChannel

pytestmark = pytest.mark.timeout(60)


def test_the_first_second_is_asked_every_20_ms_then_with_exponential_backoff() -> None:
    config = ConnectConfig(backoff_initial=0.05, backoff_max=2.0)
    waits = list(itertools.islice(ready_waits(config), 60))
    fast = [w for w in waits if w <= 0.02]
    assert waits[:len(fast)] == fast and all(w == 0.02 for w in fast)  # the fast asks come first
    assert sum(fast) >= 1.0                                           # about the first second
    assert waits[len(fast):len(fast) + 6] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6]
    assert waits[len(fast) + 6:] == [2.0] * (60 - len(fast) - 6)     # bounded by backoff_max


def test_a_shorter_backoff_than_the_fast_pause_is_kept() -> None:
    config = ConnectConfig(backoff_initial=0.01, backoff_max=0.04)
    waits = list(itertools.islice(ready_waits(config), 60))
    assert max(waits) <= 0.04 and waits[0] == 0.01


def test_the_fast_asks_of_many_workers_together_stay_as_many_as_one_workers() -> None:
    # 50 workers asking every 0.02 s for a second: 2500 Register calls a second at ps task 0, each 0.16-0.55 ms
    # there (2-30 variables), while it serves the chief's initialization. Together they ask as one worker does.
    config = ConnectConfig(backoff_initial=0.05, backoff_max=2.0)
    one = list(itertools.islice(ready_waits(config), 50))
    for askers in (2, 3, 10, 50):
        waits = list(itertools.islice(ready_waits(config, askers=askers), 60))
        fast = waits[:50 // askers]
        assert all(w == min(0.02 * askers, 0.05) for w in fast), askers
        assert askers * len(fast) <= len(one)                        # no more fast asks in all than one worker's
        assert waits[len(fast):len(fast) + 4] == [0.05, 0.1, 0.2, 0.4]  # then the same backoff
    assert list(itertools.islice(ready_waits(config, askers=0), 50)) == one  # a run with one worker: none wait


def _clients() -> tuple[ParameterClient, ParameterClient]:
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
    vs = VariableSet(replica_device_setter(cluster=cluster))
    vs.get_variable("emb", (6, 2))   # ps task 0
    vs.get_variable("bias", (2,))    # ps task 1
    services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]

    def client(name: str) -> ParameterClient:
        channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
        return ParameterClient(cluster, vs.placements(), client_name=name, channels=channels)

    return client("/job:worker/task:0"), client("/job:worker/task:1")


def test_a_worker_waits_for_the_chief_to_make_every_ps_task_ready() -> None:
    chief, other = _clients()
    optimizer = OptimizerSpec("sgd", {"learning_rate": 1.0})
    outcome: list[bool | BaseException] = []

    def join() -> None:
        try:
            outcome.append(other.register(optimizer, ready_timeout=30.0))
        except BaseException as e:  # noqa: BLE001 - the test reports it
            outcome.append(e)

    waiter = threading.Thread(target=join, daemon=True)
    waiter.start()
    waiter.join(timeout=0.2)
    assert outcome == []                                   # nothing is ready: it keeps asking
    assert chief.register(optimizer, chief=True)           # the chief creates the variables
    waiter.join(timeout=30)
    assert outcome == [False]                              # ready for the other worker, created by the chief
    assert other.pull({"bias": None})["bias"].shape == (2,)


def test_a_worker_whose_chief_never_comes_names_the_tasks_not_ready() -> None:
    _, other = _clients()
    with pytest.raises(TaskUnavailableError, match=r"/job:ps/task:0, /job:ps/task:1 not initialized by the chief"):
        other.register(OptimizerSpec("sgd", {"learning_rate": 1.0}), ready_timeout=0.3)


def test_a_worker_waits_past_its_limit_while_the_chief_saves_the_initial_checkpoint() -> None:
    """The chief created the variables and holds the tasks not ready while it writes the initial checkpoint (or
    restores one), which takes as long as the model is big (a W&D model's: over a minute on a loaded machine): the
    non-chief's ``ready_timeout`` bounds its wait for the initialization; the save's own deadline (``save_timeout``)
    comes on top. Before, the other worker failed after ``ready_timeout`` while the chief was still saving, and the
    run with it (it used to train during that save)."""
    chief, other = _clients()
    other.config = ConnectConfig(save_timeout=60.0, backoff_initial=0.01, backoff_max=0.05)
    optimizer = OptimizerSpec("sgd", {"learning_rate": 1.0})
    assert chief.register(optimizer, chief=True, defer_ready=True)  # initialized, not ready: the save goes on
    limit, asks = 0.3, []  # type: float, list[float]
    outcome: list[bool | BaseException] = []
    sent = other.call_async

    def counted(task: int, request: object) -> object:
        asks.append(time.monotonic())
        return sent(task, request)  # type: ignore[arg-type]

    other.call_async = counted  # type: ignore[assignment,method-assign]

    def join() -> None:
        try:
            outcome.append(other.register(optimizer, ready_timeout=limit))
        except BaseException as e:  # noqa: BLE001 - the test reports it
            outcome.append(e)

    start = time.monotonic()
    waiter = threading.Thread(target=join, daemon=True)
    waiter.start()
    while waiter.is_alive() and not (asks and asks[-1] - start > 3 * limit):  # it still asks well past its limit
        waiter.join(timeout=0.01)
    for task in (1, 0):  # the save is over: ps task 0 last, as the chief does
        chief.call(task, SetReadyRequest(chief.client_name))
    waiter.join(timeout=30)
    assert outcome == [False], outcome


def test_a_worker_whose_chief_never_comes_waits_its_whole_limit_before_giving_up() -> None:
    """It gave up one pause early: with a 1 s backoff and a 1.5 s limit it stopped after about 1.0 s, when the next
    pause would have ended past the limit ('... after 2.9 s ... (the limit: --connect-timeout, 4 s)'). The last
    pause is now cut to the limit, and the last ask made at it. A lower bound: load only makes the wait longer."""
    _, other = _clients()
    other.config = ConnectConfig(backoff_initial=1.0, backoff_max=1.0)
    limit = 1.5
    start = time.monotonic()
    with pytest.raises(TaskUnavailableError, match=r"not initialized by the chief after ") as e:
        other.register(OptimizerSpec("sgd", {"learning_rate": 1.0}), ready_timeout=limit)
    assert time.monotonic() - start >= limit
    waited = float(str(e.value).split(" after ", 1)[1].split(" s ", 1)[0])
    assert waited >= limit, str(e.value)
