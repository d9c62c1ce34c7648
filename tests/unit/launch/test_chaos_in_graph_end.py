"""An in-graph run's training end drops the chaos faults left, as a between-graph run's does.

Seen reviewing 7f8551b: the launcher decided training ended once the step task counted every chief and
worker task finished (``Leave``); in an in-graph run the workers only run the client's steps and never
leave: the client alone does, once (:func:`psflow.train.in_graph_client._leave`), so the count
never reached the number of tasks and no fault was ever dropped. A round that came due without a target
(a replicated shard's failover under way) then fired once its target answered, after the last training
step; a round not due yet waited to the run's end and was listed as still waiting. An in-graph run has one
trainer, its client. Pure logic, no processes.
"""

from __future__ import annotations

import pytest
from launched_tasks import FakeCluster, FakeTask

from psflow.cluster import ClusterSpec
from psflow.launch.chaos_plan import ChaosPlan
from psflow.launch.fault_recovery import StepReading
from psflow.launch.resilience import Resilience, ResilienceConfig

pytestmark = pytest.mark.timeout(60)

REPLICATED = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3", "127.0.0.1:4"],
                          "ps_backup": ["127.0.0.1:5"]})
PLAIN = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})


def _resilience(cluster: ClusterSpec, specs: list[str], *, in_graph: bool) -> Resilience:
    tasks = [FakeTask(job, i, 1000 + 10 * n + i) for n, job in enumerate(cluster.jobs) for i in cluster.task_indices(job)]
    return Resilience(FakeCluster(cluster, tasks), ResilienceConfig(health=None, chaos=ChaosPlan.parse(specs)),
                      in_graph=in_graph)


def test_an_in_graph_shard_fault_due_without_a_target_is_dropped_once_the_client_finished() -> None:
    resilience = _resilience(REPLICATED, ["kill:ps:0@step=100"], in_graph=True)
    injector = resilience.injector
    assert injector is not None
    sent: list[tuple[int, int]] = []
    primary: list[str | None] = [None]                    # a failover under way: no member says primary
    injector._send = lambda pid, sig: sent.append((pid, sig))
    injector._member = lambda job, shard: primary[0]
    assert resilience._fire(StepReading(102, True)) == []  # due, no target: begun
    resilience._fire(StepReading(601, True, finished=1))  # the client finished (its Leave)
    primary[0] = "/job:ps_backup/task:0"                  # the promoted primary answers, after training ended
    assert resilience._fire(StepReading(601, True, finished=1)) == [] and sent == []
    assert injector.pending() == 0 and resilience.metrics()["faults_not_fired"] == 1
    assert injector.not_fired["kill:ps:0@step=100"].startswith("training ended at step 601 before any fault"), \
        injector.not_fired


def test_an_in_graph_fault_past_the_end_says_training_ended() -> None:
    resilience = _resilience(PLAIN, ["kill:ps:0@step=900"], in_graph=True)
    resilience._fire(StepReading(601, True, finished=1))
    assert resilience.injector is not None and resilience.injector.pending() == 0
    assert resilience.injector.summary()[1] == \
        "chaos:   kill:ps:0@step=900: not fired: training ended at step 601 before its step"


def test_a_between_graph_run_still_waits_for_every_worker() -> None:
    resilience = _resilience(PLAIN, ["kill:ps:0@step=900"], in_graph=False)
    resilience._fire(StepReading(601, True, finished=1))  # worker 1 still trains
    assert resilience.injector is not None and resilience.injector.pending() == 1
    resilience._fire(StepReading(650, True, finished=2))
    assert resilience.injector.pending() == 0
