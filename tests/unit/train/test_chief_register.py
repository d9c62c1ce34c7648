"""The chief's own Register (psflow.train.chief.join_cluster), without sockets: ps services in this process.

1. A ps task that restarts empty after the chief checked that no task lost its state, and before its Register
   reached it, got fresh variables from that Register and the run went on with that shard's trained state replaced
   by initial values (ps task 1), or with every variable reset (ps task 0: the chief took the cluster for a new
   one). The chief now reads which tasks its Register created the variables on: a new process's beside a ready
   task, with no checkpoint to restore, is the StateLostError the check raises.
2. The chief's Register, and its reader positions and global_step read right after, met an unreachable ps task
   (restarting) with a traceback; it now asks again, as a non-chief does (psflow.ps.registration).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from dead_task import DyingChannel
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

import psflow.train.chief as chief_module
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig, TaskUnavailableError
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import join_cluster
from psflow.train.state_loss import StateLostError

pytestmark = pytest.mark.timeout(60)


def _restart_after_the_check(monkeypatch: pytest.MonkeyPatch, client: ParameterClient, services: list[Any],
                             index: int) -> list[Any]:
    """ps task ``index`` restarts empty right after the chief's state check passed (before its Register)."""
    checked, fresh = chief_module.check_state_kept, []

    def check(*args: Any, **kwargs: Any) -> None:
        checked(*args, **kwargs)
        fresh.append(restart_ps(client, services, index))

    monkeypatch.setattr(chief_module, "check_state_kept", check)
    return fresh


@pytest.mark.parametrize("index, lost, kept", [(1, "bias", 0), (0, "weights", 1)])
def test_a_ps_task_restarted_between_the_check_and_the_register_stops_the_run(
        monkeypatch: pytest.MonkeyPatch, index: int, lost: str, kept: int) -> None:
    client, services = two_ps_cluster()
    assert join_cluster(client, SGD, chief=True).created
    train_a_step(client)
    trained = client.pull({"weights": None, "bias": None})
    fresh = _restart_after_the_check(monkeypatch, client, services, index)
    with pytest.raises(StateLostError) as e:  # the chief's process restarted: it joins again
        join_cluster(client, SGD, chief=True)
    assert fresh, "the restart did not happen in the window"
    assert str(e.value) == (
        f"/job:ps/task:{index} restarted with no checkpoint to restore from (the run has no --checkpoint-dir): its "
        f"variables ({lost}) would be fresh beside trained ones on /job:ps/task:{kept}; rerun with --checkpoint-dir")
    assert not fresh[0].ready  # the fresh variables never served a pull or a push
    kept_name = "bias" if index == 0 else "weights"
    assert np.array_equal(client.pull({kept_name: None})[kept_name], trained[kept_name])  # the trained shard as it was


class _DeadFirst(DyingChannel):
    """A channel whose first ``calls`` calls of ``method`` fail as to a task that died (at ``result()``, as a gRPC
    future does), then the service answers."""

    def __init__(self, channel: InProcessChannel, method: str, calls: int) -> None:
        super().__init__(channel)
        self.method, self.left, self.asked = method, calls, 0

    def dies(self, method: str) -> bool:
        if method != self.method:
            return False
        self.asked += 1
        self.left -= 1
        return self.left >= 0


@pytest.mark.parametrize("index, method", [(0, "Register"), (1, "Register"), (0, "ReaderPositions"),
                                           (0, "Stats")])
def test_the_chiefs_join_asks_again_a_ps_task_that_is_restarting(index: int, method: str) -> None:
    client, services = two_ps_cluster()
    client.config = ConnectConfig(connect_timeout=30.0, backoff_initial=0.01, backoff_max=0.02)
    dead = client.channels[index] = _DeadFirst(client.channels[index], method, calls=3)  # type: ignore[assignment]
    result = join_cluster(client, SGD, chief=True)
    assert result.created and result.global_step == 0
    assert all(s.ready for s in services)
    assert dead.asked >= 4  # three calls met the dead task, the next its new process


def test_a_ps_task_that_never_comes_back_fails_the_chiefs_join_in_one_line_naming_it(
        caplog: pytest.LogCaptureFixture) -> None:
    client, _ = two_ps_cluster()
    client.config = ConnectConfig(connect_timeout=0.5, backoff_initial=0.01, backoff_max=0.02)
    client.channels[1] = _DeadFirst(client.channels[1], "Register", calls=10**9)  # type: ignore[assignment]
    with caplog.at_level(logging.INFO, logger="psflow.ps.client"), pytest.raises(TaskUnavailableError) as e:
        join_cluster(client, SGD, chief=True)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("/job:worker/task:0: /job:ps/task:1 unreachable after "), message
    assert "the limit: --connect-timeout, 0.5 s" in message and "Connection refused" in message, message
    lines = [r.getMessage() for r in caplog.records if "unreachable" in r.getMessage()]
    assert lines and all("/job:ps/task:1" in line for line in lines), lines
