"""A restarted ps task that held nothing is brought back without a restore: the trained model stays.

Seen in a real run (psflow train --ps 4 --workers 1 --model logistic --restart-policy on-failure
--chaos kill:ps:3@step=30): ps tasks 2-3 hold none of the model's two variables; ps task 3 killed and restarted
empty made the chief restore the newest checkpoint onto EVERY task (the launcher's recovery checkpoint dir: the
step-0 one), 'the final model holds 0 of the 4480 examples', exit 0. A task holding nothing lost nothing: the chief
registers it (creating nothing) and makes it ready at the cluster's generation (:mod:`psflow.train.idle_tasks`),
and every worker resumes where it was.

Real in-process ps services: ``weights`` on ps task 0, ``bias`` on ps task 1, nothing on ps tasks 2 and 3.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from two_ps_in_process import SGD

from psflow.checkpoint.save import CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.coord import Lease
from psflow.gradients import DenseGradient
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.idle import idle_tasks
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import TaskUnavailableError
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import join_cluster
from psflow.train.idle_tasks import ReadmitIdleTasks
from psflow.train.recovery import ClusterRecovery

pytestmark = pytest.mark.timeout(60)

CLUSTER = ClusterSpec({"ps": [f"127.0.0.1:{i + 1}" for i in range(4)]})


def _lease() -> Lease:
    return Lease("chief", "/job:worker/task:0", "/job:worker/task:0#1", 7, 10.0, time.monotonic() + 10.0)


def _client(services: list[ParameterService], name: str = "/job:worker/task:0", *,
            sync: SyncConfig | None = None, dynamic: bool = False) -> ParameterClient:
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("weights", (8, 2), initializer={"name": "random_normal", "seed": 3})  # ps task 0
    vs.get_variable("bias", (2,))                                                          # ps task 1
    if dynamic:
        vs.get_variable("table", (0, 2), dynamic={})
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    return ParameterClient(CLUSTER, vs.placements(), client_name=name, channels=channels, sync=sync)


def _services() -> list[ParameterService]:
    return [ParameterService(i, holds_global_step=i == 0) for i in range(4)]


def _push(client: ParameterClient, position: str) -> None:
    client.push({"weights": DenseGradient(np.ones((8, 2), np.float32)), "bias": DenseGradient(np.ones(2, np.float32))},
                examples=10, position=position, generation=client.ps_stats().generation)


def _trained(tmp_path: Path) -> tuple[list[ParameterService], ParameterClient, dict[str, np.ndarray]]:
    """A cluster initialized with its step-0 checkpoint written, then trained 3 steps past it."""
    services = _services()
    client = _client(services)
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    CheckpointManager(str(tmp_path), run_id="run-a").save(client)
    for n in range(3):
        _push(client, f'{{"record": {n + 1}}}')
    return services, client, client.pull({"weights": None, "bias": None})


def _restart(client: ParameterClient, services: list[ParameterService], index: int) -> None:
    services[index] = ParameterService(index, holds_global_step=index == 0)
    client.channels[index] = InProcessChannel(f"/job:ps/task:{index}", services[index].handlers())


def test_idle_tasks_come_from_the_placement() -> None:
    services = _services()
    assert idle_tasks(_client(services)) == {2, 3}
    assert idle_tasks(_client(services, sync=SyncConfig(mode="sync", replicas_to_aggregate=1))) == set()
    assert idle_tasks(_client(services, dynamic=True)) == set()


def test_the_chief_readmits_a_restarted_task_that_held_nothing_without_a_restore(tmp_path: Path) -> None:
    services, client, trained = _trained(tmp_path)
    _restart(client, services, 3)
    assert client.ps_stats(3).ready is False
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=_lease, timeout=10.0, run="run-a")
    assert recovery.needed()
    restored, position = recovery.wait()
    assert (restored, position) == (True, '{"record": 3}')  # resumes where it was: nothing trained twice
    assert recovery.restores == 0 and recovery.generation == 0
    states = [client.ps_stats(t) for t in range(4)]
    assert [(s.ready, s.generation) for s in states] == [(True, 0)] * 4
    assert states[0].global_step == 3 and states[0].counters["examples"] == 30
    now = client.pull({"weights": None, "bias": None})
    np.testing.assert_array_equal(now["weights"], trained["weights"])
    np.testing.assert_array_equal(now["bias"], trained["bias"])
    _push(client, '{"record": 4}')  # training goes on at the same generation
    assert client.ps_stats().global_step == 4


def test_a_worker_that_is_not_the_chief_waits_and_resumes_where_it_was(tmp_path: Path) -> None:
    services, client, _ = _trained(tmp_path)
    other = _client(services, "/job:worker/task:1")
    other.register(SGD)
    _restart(client, services, 2)
    other.channels[2] = client.channels[2]
    waiting = ClusterRecovery(other, SGD, checkpoint_dir=str(tmp_path), leader=lambda: None, timeout=10.0)
    assert waiting.needed()
    polled, states = threading.Event(), waiting._states

    def first_poll() -> Any:  # the chief readmits once this worker saw the task not ready in its wait
        try:
            return states()
        finally:
            polled.set()

    waiting._states = first_poll  # type: ignore[method-assign]
    result: list[tuple[bool, str | None]] = []
    thread = threading.Thread(target=lambda: result.append(waiting.wait()))
    thread.start()
    assert polled.wait(15.0)
    chief = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=_lease, timeout=10.0, run="run-a")
    assert chief.wait()[0] is True
    thread.join(15.0)
    assert result == [(True, None)]  # its own position: it pushed nothing yet
    assert waiting.generation == 0 and client.ps_stats().global_step == 3


def test_a_restarted_task_holding_a_partition_still_restores_every_task(tmp_path: Path) -> None:
    services, client, _ = _trained(tmp_path)
    _restart(client, services, 1)  # held bias
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=_lease, timeout=10.0, run="run-a")
    assert recovery.wait()[0] is True
    assert recovery.restores == 1 and recovery.generation != 0


@pytest.mark.parametrize("with_checkpoint", [False, True])
def test_a_chief_restarted_beside_it_keeps_the_model_and_its_hook_readmits_it(tmp_path: Path,
                                                                              with_checkpoint: bool) -> None:
    """A chief's join beside the restarted task: no StateLostError (it lost nothing), no restore; the lease
    holder's :class:`ReadmitIdleTasks` (before the saver) makes it ready at the cluster's generation."""
    services, client, trained = _trained(tmp_path)
    _restart(client, services, 3)
    chief = _client(services)
    join = join_cluster(chief, SGD, chief=True, checkpoint_dir=str(tmp_path) if with_checkpoint else None)
    assert join.restored is None and join.generation == 0 and join.global_step == 3
    assert chief.ps_stats(3).ready is False
    hook = ReadmitIdleTasks(chief, SGD, _lease, run="run-a")
    assert hook.check() is True
    assert [(s.ready, s.generation) for s in (chief.ps_stats(t) for t in range(4))] == [(True, 0)] * 4
    np.testing.assert_array_equal(chief.pull({"weights": None})["weights"], trained["weights"])
    if with_checkpoint:  # saves succeed again
        assert CheckpointManager(str(tmp_path), run_id="run-a").save(chief).global_step == 3


def test_the_hook_asks_only_the_idle_tasks_while_they_are_ready(tmp_path: Path) -> None:
    services, client, _ = _trained(tmp_path)
    hook = ReadmitIdleTasks(client, SGD, _lease, run="run-a")
    assert hook.idle == {2, 3} and hook.check() is True
    _restart(client, services, 2)
    assert hook.check() is True and client.ps_stats(2).ready is True
    assert ReadmitIdleTasks(client, SGD, lambda: None, run="run-a").check() is True
    _restart(client, services, 3)
    assert ReadmitIdleTasks(client, SGD, lambda: None, run="run-a").check() is False  # no lease: waits


class _Gone:
    """The channel of a ps task whose process is gone (or silent): every call fails as a carrier's does."""

    task = "/job:ps/task:3"

    def call_async(self, *args: object, **kwargs: object) -> _Gone:
        return self  # a carrier's pending call: its error comes with the result

    def result(self) -> object:
        raise TaskUnavailableError(f"{self.task}: connection refused")

    def call(self, *args: object, **kwargs: object) -> object:
        return self.result()


def test_the_hook_waits_while_an_idle_task_is_unreachable(tmp_path: Path) -> None:
    services, client, trained = _trained(tmp_path)
    client.channels[3] = _Gone()  # type: ignore[assignment]
    assert ReadmitIdleTasks(client, SGD, _lease, run="run-a").check() is False
    assert [client.ps_stats(t).generation for t in range(3)] == [0, 0, 0]
    _restart(client, services, 3)  # back, empty: made ready at the next period
    assert ReadmitIdleTasks(client, SGD, _lease, run="run-a").check() is True
    np.testing.assert_array_equal(client.pull({"weights": None})["weights"], trained["weights"])


def test_a_restore_while_an_idle_task_is_also_down_waits_for_it_and_saves_need_it_not(tmp_path: Path) -> None:
    """ps task 1 (bias) restarted empty while idle ps task 3 is down: no save needs task 3 (its shard holds nothing:
    psflow.checkpoint.shard_files), and the restore, which reaches every task, begins once task 3 answers again
    (the supervisor restarts it); every task ends ready at the restore's generation, the model the checkpoint's."""
    services, client, _ = _trained(tmp_path)
    manager = CheckpointManager(str(tmp_path), run_id="run-a", max_failed_saves=1)
    saved = client.pull({"weights": None, "bias": None})
    assert manager.save(client).global_step == 3
    client.channels[3] = _Gone()  # type: ignore[assignment]
    assert manager.save(client).global_step == 3  # task 3 down: the save needs nothing of it
    _restart(client, services, 1)  # held bias: a restore is needed
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=_lease, timeout=20.0, run="run-a")
    result: list[tuple[bool, str | None]] = []
    thread = threading.Thread(target=lambda: result.append(recovery.wait()))
    thread.start()
    time.sleep(0.5)
    assert not result and recovery.restores == 0  # waiting for task 3 to answer
    _restart(client, services, 3)
    thread.join(20.0)
    assert result and result[0][0] is True and recovery.restores == 1
    states = [client.ps_stats(t) for t in range(4)]
    assert {(s.ready, s.generation) for s in states} == {(True, recovery.generation)}
    now = client.pull({"weights": None, "bias": None})
    np.testing.assert_array_equal(now["weights"], saved["weights"])
    np.testing.assert_array_equal(now["bias"], saved["bias"])
    lease = _lease()  # the restore took the pointer over at its epoch
    assert manager.save(client, epoch=lease.epoch, holder=lease.holder).global_step == 3


def test_the_hooks_end_asks_a_gone_idle_task_once_and_waits_not(tmp_path: Path) -> None:
    """Before the final save: the save needs no idle task (psflow.checkpoint.shard_files), so the end does not wait
    for one gone for good (restarts spent, stopped): one check, then the final save goes ahead (it used to wait up
    to --connect-timeout, asking again and again, then the final save failed on it all the same)."""
    services, client, _ = _trained(tmp_path)
    asked: list[object] = []

    class _Counted(_Gone):
        def call_async(self, *args: object, **kwargs: object) -> _Gone:
            asked.append(args)
            return self

    client.channels[3] = _Counted()  # type: ignore[assignment]
    ReadmitIdleTasks(client, SGD, _lease, run="run-a").end(None)  # type: ignore[arg-type]
    assert len(asked) == 1
    assert CheckpointManager(str(tmp_path), run_id="run-a", max_failed_saves=1).save(client, final=True).global_step == 3
