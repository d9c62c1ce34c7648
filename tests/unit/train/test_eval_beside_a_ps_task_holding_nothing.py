"""An evaluation reads the model wherever it is: a ps task that holds none of its variables does not stop it.

ReadyEvaluation (080c3a3) asked every ps task's ``Stats`` before and after its reads, those that hold no partition
too (``--ps 4`` for a model of three variables: two tasks hold nothing, 'initialized 0 partitions'). Such a task
killed made every evaluation raise (its ``Stats`` unreachable: 'chief duty skipped', tried again at every step,
since a failed evaluation marks no period), and once restarted, unregistered and not ready, every evaluation wait its
5 s and end not done, at every step of the chief, though the model it reads was whole and ready (a plain read, before
080c3a3, gave its metrics). Seen in a real run (psflow train a9a --ps 4 --workers 1 --model logistic
--restart-policy on-failure --eval-every-steps 20 --chaos kill:ps:3@step=30: 31 'chief duty FinalEvalOnce skipped:
/job:ps/task:3 ...' lines, one a step). Now the states compared are those of the tasks holding a partition, and of the
task holding global_step (a restore changes every task's generation, so one begun or ended during the reads is still
caught there).

Real in-process ps services: ``weights`` on ps task 0, ``bias`` on ps task 1, nothing on ps task 2."""

from __future__ import annotations

from typing import Any

import pytest
from two_ps_in_process import SGD, OneExample, SumModel, train_a_step

from psflow.cluster import ClusterSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import BeginRestoreRequest, SetReadyRequest
from psflow.ps.service import ParameterService
from psflow.rpc.api import TaskUnavailableError
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.ready_eval import ReadyEvaluation
from psflow.train.session import MonitoredTrainingSession

pytestmark = pytest.mark.timeout(60)

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]})




class Gone:
    """The channel of a ps task whose process is gone: every call fails as a carrier's does."""

    task = "/job:ps/task:2"

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise TaskUnavailableError(f"{self.task}: connection refused")
        return fail


def _trained() -> tuple[ParameterClient, float]:
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("weights", (8, 2), initializer={"name": "random_normal", "seed": 3})  # ps task 0
    vs.get_variable("bias", (2,))                                                          # ps task 1
    assert {p.task for v in vs.placements() for p in v.partitions} == {0, 1}  # ps task 2 holds nothing
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", ParameterService(i, holds_global_step=i == 0).handlers())
                for i in range(3)}
    client = ParameterClient(CLUSTER, vs.placements(), client_name="/job:worker/task:0", channels=channels)
    with MonitoredTrainingSession(client, SGD, is_chief=True):
        pass
    for _ in range(3):
        train_a_step(client)
    values = client.pull({"weights": None, "bias": None})
    return client, float(values["weights"].sum() + values["bias"].sum())


def _evaluation(client: ParameterClient, model: SumModel | None = None) -> ReadyEvaluation:
    return ReadyEvaluation(model or SumModel(), client, OneExample(), moving_averages=False,  # type: ignore[arg-type]
                           timeout=0.6)


def test_a_restarted_ps_task_holding_nothing_does_not_stop_the_evaluation() -> None:
    client, trained = _trained()
    restarted = ParameterService(2, holds_global_step=False)  # came back empty: not registered, not ready
    client.channels[2] = InProcessChannel("/job:ps/task:2", restarted.handlers())
    assert client.ps_stats(2).ready is False
    evaluation = _evaluation(client)
    assert evaluation()["auc"] == pytest.approx(trained)
    assert evaluation.attempts == 1


def test_an_unreachable_ps_task_holding_nothing_does_not_stop_the_evaluation() -> None:
    client, trained = _trained()
    client.channels[2] = Gone()  # type: ignore[assignment]
    assert _evaluation(client)()["auc"] == pytest.approx(trained)


def test_a_restore_during_the_reads_is_still_caught_without_the_empty_task() -> None:
    """The restore goes to every task: one that began and ended during the reads changed the holders' generation."""
    client, trained = _trained()
    client.channels[2] = Gone()  # type: ignore[assignment]
    model = SumModel()
    model.on_predict.append(lambda: [(client.call(t, BeginRestoreRequest(generation=1)),
                                      client.call(t, SetReadyRequest(generation=1))) for t in (0, 1)])
    evaluation = ReadyEvaluation(model, client, OneExample(), moving_averages=False,  # type: ignore[arg-type]
                                 timeout=20.0)
    assert evaluation()["auc"] == pytest.approx(trained)
    assert evaluation.attempts == 2
