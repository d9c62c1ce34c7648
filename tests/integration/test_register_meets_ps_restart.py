"""A worker registering while ps task 0 is killed and restarted waits for it: real processes, real gRPC.

A restarted worker sent its Register to ps task 0 just as a kill of that task landed and exited with the
channel's TaskUnavailableError (a traceback; the launcher counted one restart more than the run's faults). It now
asks again until the task is back (and made ready by the chief), within its limit (psflow.ps.registration).
"""

from __future__ import annotations

import logging
import threading

import pytest
from support import TOKEN, wait_until

from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(200)]

OPTIMIZER = OptimizerSpec("sgd", {"learning_rate": 1.0})


def test_a_worker_registering_while_ps_task_0_is_killed_waits_for_its_restart(
        local_cluster, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(2)
    vs = VariableSet(replica_device_setter(cluster=handle.cluster))
    vs.get_variable("emb", (6, 2))   # ps task 0
    vs.get_variable("bias", (2,))    # ps task 1

    def client(name: str) -> ParameterClient:
        c = ParameterClient(handle.cluster, vs.placements(), client_name=name,
                            config=ConnectConfig(connect_timeout=120.0, token=TOKEN))
        c.connect()
        return c

    chief, worker = client("/job:worker/task:0"), client("/job:worker/task:1")
    assert chief.register(OPTIMIZER, chief=True)
    handle.kill("ps", 0)
    outcome: list[bool | BaseException] = []

    def join() -> None:
        try:
            outcome.append(worker.register(OPTIMIZER, ready_timeout=120.0))
        except BaseException as e:  # noqa: BLE001 - the test reports it
            outcome.append(e)

    with caplog.at_level(logging.INFO, logger="psflow.ps.client"):
        waiter = threading.Thread(target=join, daemon=True)
        waiter.start()
        # It met the dead task (and, before, ended there): its INFO line names it.
        wait_until(lambda: outcome or any("/job:ps/task:0 unreachable" in r.getMessage() for r in caplog.records),
                   "the worker's Register meeting the dead ps task 0")
        assert outcome == [], outcome
        handle.start("ps", 0)
        handle.wait_serving(0)
        # The new ps task 0 is empty: the worker waits for the chief to create its variables again.
        assert chief.register(OPTIMIZER, chief=True)
        waiter.join(timeout=120)
    assert outcome == [False], outcome
    assert worker.pull({"emb": None})["emb"].shape == (6, 2)
