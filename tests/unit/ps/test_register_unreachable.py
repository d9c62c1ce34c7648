"""A worker's Register that meets a ps task's death waits for the task to come back (psflow.ps.registration).

A restarted worker (slow to start beside load) sent its Register to ps task 0 just as a chaos kill of that task
landed: the call's TaskUnavailableError (the error every channel raises for UNAVAILABLE) ended the worker with a
traceback, and the launcher counted a third restart for a run of two faults. A non-chief now asks again, within its
limit, as it does while the chief initializes; a different layout (FailedPrecondition) still fails at once.
"""

from __future__ import annotations

import logging

import pytest
from dead_task import UnreachableCall

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.api import ConnectConfig, FailedPreconditionError, TaskUnavailableError
from psflow.rpc.inprocess import InProcessChannel

pytestmark = pytest.mark.timeout(60)

OPTIMIZER = OptimizerSpec("sgd", {"learning_rate": 1.0})


def _clients(extra: str | None = None) -> tuple[ParameterClient, ParameterClient]:
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
    services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]

    def client(name: str, more: str | None) -> ParameterClient:
        vs = VariableSet(replica_device_setter(cluster=cluster))
        vs.get_variable("emb", (6, 2))   # ps task 0
        vs.get_variable("bias", (2,))    # ps task 1
        if more:
            vs.get_variable(more, (3,))
        channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
        c = ParameterClient(cluster, vs.placements(), client_name=name, channels=channels)
        c.config = ConnectConfig(backoff_initial=0.01, backoff_max=0.02)
        return c

    return client("/job:worker/task:0", None), client("/job:worker/task:1", extra)


def _dead_for(client: ParameterClient, task: int, calls: int) -> list[int]:
    """Makes ``client``'s first ``calls`` calls to ps task ``task`` fail as to a dead task; returns the tasks called."""
    sent, called = client.call_async, []  # type: ignore[var-annotated]

    def call(t: int, request: object, **kwargs: object) -> object:
        called.append(t)
        if t == task and called.count(task) <= calls:
            return UnreachableCall(f"/job:ps/task:{t}", "Register")
        return sent(t, request, **kwargs)  # type: ignore[arg-type]

    client.call_async = call  # type: ignore[assignment,method-assign]
    return called


@pytest.mark.parametrize("task", [0, 1])
def test_a_worker_whose_register_meets_a_dead_ps_task_asks_again_until_it_answers(task: int) -> None:
    chief, other = _clients()
    assert chief.register(OPTIMIZER, chief=True)
    called = _dead_for(other, task, calls=3)
    assert other.register(OPTIMIZER, ready_timeout=30.0) is False
    assert called.count(task) == 4  # three calls met the dead task, the fourth its new process


def test_a_ps_task_that_never_comes_back_fails_the_register_in_one_line_naming_it(
        caplog: pytest.LogCaptureFixture) -> None:
    chief, other = _clients()
    assert chief.register(OPTIMIZER, chief=True)
    _dead_for(other, 1, calls=10**9)
    limit = 0.5
    with caplog.at_level(logging.INFO, logger="psflow.ps.client"), pytest.raises(TaskUnavailableError) as e:
        other.register(OPTIMIZER, ready_timeout=limit)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("/job:worker/task:1: /job:ps/task:1 unreachable after "), message
    assert "--connect-timeout" not in message and f"the limit: {limit:g} s" in message, message
    assert "Connection refused" in message, message  # the last error, as the channel told it
    waited = float(message.split(" unreachable after ", 1)[1].split(" s ", 1)[0])
    assert waited >= limit, message  # a lower bound: load only makes it longer
    lines = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert lines and all("/job:ps/task:1" in line for line in lines), lines


def test_a_different_layout_still_fails_at_once() -> None:
    chief, other = _clients(extra="more")
    assert chief.register(OPTIMIZER, chief=True)
    called = _dead_for(other, 0, calls=0)
    with pytest.raises(FailedPreconditionError):
        other.register(OPTIMIZER, ready_timeout=30.0)
    assert called.count(0) == 1  # asked once: a refusal is not a dead task
