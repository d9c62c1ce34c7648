"""The chief's own Register meeting a ps task's restart, over real gRPC: two real ps processes.

1. A ps task SIGKILLed and restarted after the chief (its process restarted, no checkpoint) checked that no task
   lost its state, and before its Register: the Register created fresh variables there and the run went on beside
   the other task's trained ones (no error). It now stops with StateLostError.
2. A chief starting while a ps task is dead (a chaos kill, a rescheduled pod): its Register ended it with the
   channel's TaskUnavailableError (a traceback; the launcher counted a restart). It now waits for the task.

The window is hit with a hook on the chief's state check (the kill happens in it), never a sleep.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pytest
from support import TOKEN, wait_until

import psflow.train.chief as chief_module
from psflow.gradients import DenseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig
from psflow.train.chief import join_cluster
from psflow.train.state_loss import StateLostError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

OPTIMIZER = OptimizerSpec("sgd", {"learning_rate": 1.0})


def _chief(handle: Any) -> ParameterClient:
    vs = VariableSet(replica_device_setter(cluster=handle.cluster))
    vs.get_variable("emb", (6, 2))   # ps task 0
    vs.get_variable("bias", (2,))    # ps task 1
    client = ParameterClient(handle.cluster, vs.placements(), client_name="/job:worker/task:0",
                             config=ConnectConfig(connect_timeout=120.0, token=TOKEN))
    client.connect()
    return client


def _after_the_check(monkeypatch: pytest.MonkeyPatch, then: Any) -> list[bool]:
    """Runs ``then()`` right after the chief's state check passed, before its Register; returns [True] once it ran."""
    checked, ran = chief_module.check_state_kept, []

    def check(*args: Any, **kwargs: Any) -> None:
        checked(*args, **kwargs)
        then()
        ran.append(True)

    monkeypatch.setattr(chief_module, "check_state_kept", check)
    return ran


def test_a_ps_task_restarted_empty_between_the_chiefs_check_and_register_stops_the_run(
        local_cluster, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(2)
    chief = _chief(handle)
    assert join_cluster(chief, OPTIMIZER, chief=True).created
    chief.push({"emb": DenseGradient(np.ones((6, 2), np.float32)), "bias": DenseGradient(np.ones(2, np.float32))})
    trained = chief.pull({"emb": None})["emb"].copy()

    def restart_ps_1() -> None:
        handle.kill("ps", 1)
        handle.start("ps", 1)
        handle.wait_serving(1)

    ran = _after_the_check(monkeypatch, restart_ps_1)
    again = _chief(handle)  # the chief's next process
    with pytest.raises(StateLostError, match=r"^/job:ps/task:1 restarted with no checkpoint to restore from \(the run "
                                             r"has no --checkpoint-dir\): its variables \(bias\) would be fresh "
                                             r"beside trained ones on /job:ps/task:0; rerun with --checkpoint-dir$"):
        join_cluster(again, OPTIMIZER, chief=True)
    assert ran == [True]
    assert not again.ps_stats(1).ready  # the fresh variables serve no pull or push
    assert np.array_equal(again.pull({"emb": None})["emb"], trained)


def test_a_chief_joining_while_ps_task_0_is_dead_waits_for_its_restart(
        local_cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(2)
    chief = _chief(handle)
    ran = _after_the_check(monkeypatch, lambda: handle.kill("ps", 0))
    outcome: list[Any] = []

    def join() -> None:
        try:
            outcome.append(join_cluster(chief, OPTIMIZER, chief=True))
        except BaseException as e:  # noqa: BLE001 - the test reports it
            outcome.append(e)

    with caplog.at_level(logging.INFO, logger="psflow.ps.client"):
        joining = threading.Thread(target=join, daemon=True)
        joining.start()
        # Its Register met the dead task (and, before, ended there): the INFO line names it.
        wait_until(lambda: outcome or any("/job:ps/task:0 unreachable" in r.getMessage() for r in caplog.records),
                   "the chief's Register meeting the dead ps task 0")
        assert outcome == [] and ran == [True], outcome
        handle.start("ps", 0)
        handle.wait_serving(0)
        joining.join(timeout=120)
    assert len(outcome) == 1 and not isinstance(outcome[0], BaseException), outcome
    assert outcome[0].created and outcome[0].global_step == 0
    assert chief.ps_stats(0).ready and chief.ps_stats(1).ready
    assert chief.pull({"emb": None})["emb"].shape == (6, 2)
