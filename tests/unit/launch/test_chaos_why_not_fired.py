"""A chaos fault that does not fire says why, and the run's end lists every fault: fired or not, and why.

Seen: ``--ps-replicas 1 --restart-policy on-failure --chaos kill:ps:0@step=100 --chaos kill:ps:0@step=300``
on a 601-step run said only ``chaos: kill:ps:0@step=300 not fired: training ended at step 601``. By design
(:mod:`psflow.launch.chaos`) the second round waits until the first recovered (ps task 0's replacement back
in shard 0's view: killing the promoted primary before that loses the shard) and then keeps its 200-step
spacing; the replacement rejoined at step 598, so the round was never due. The line hid that, and the
run's end did not say which faults fired. Pure logic, no processes.
"""

from __future__ import annotations

import logging

import pytest
from launched_tasks import FakeCluster, FakeTask

from psflow.cluster import ClusterSpec
from psflow.launch.chaos import ChaosInjector
from psflow.launch.chaos_plan import ChaosPlan
from psflow.launch.fault_recovery import StepReading
from psflow.launch.resilience import Resilience, ResilienceConfig

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
TWO_KILLS = ["kill:ps:0@step=100", "kill:ps:0@step=300"]


def _injector(specs: list[str]) -> ChaosInjector:
    return ChaosInjector(ChaosPlan.parse(specs), CLUSTER, lambda job, i: FakeTask(job, i, 40 + i),
                         send=lambda pid, sig: None)


def test_a_round_held_back_by_the_round_before_it_not_recovered_names_that_fault(
        caplog: pytest.LogCaptureFixture) -> None:
    injector = _injector(TWO_KILLS)
    [fired] = injector.poll(102)
    assert fired.spec == "kill:ps:0@step=100"
    with caplog.at_level(logging.WARNING, logger="psflow.launch"):
        assert injector.training_ended(601) == ["kill:ps:0@step=300"]
    assert ("chaos: kill:ps:0@step=300 not fired: training ended at step 601 before kill:ps:0@step=100 (fired at "
            "global_step 102) recovered: a round fires once the round before it recovered, then 200 steps "
            "later") in caplog.text, caplog.text


def test_a_round_due_after_the_end_names_the_step_it_was_due_at(caplog: pytest.LogCaptureFixture) -> None:
    injector = _injector(TWO_KILLS)
    [fired] = injector.poll(102)
    fired.recovered_at_step = 450
    with caplog.at_level(logging.WARNING, logger="psflow.launch"):
        injector.training_ended(601)
    assert ("chaos: kill:ps:0@step=300 not fired: training ended at step 601 before it was due at global_step 650 "
            "(200 steps after the round before it recovered, at global_step 450)") in caplog.text, caplog.text


def test_a_first_round_past_the_end_names_its_step_and_later_rounds_the_round_before(
        caplog: pytest.LogCaptureFixture) -> None:
    injector = _injector(["kill:worker:1@step=900", "kill:ps:1@step=950"])
    with caplog.at_level(logging.WARNING, logger="psflow.launch"):
        injector.training_ended(601)
    assert "chaos: kill:worker:1@step=900 not fired: training ended at step 601 before its step" in caplog.text
    assert ("chaos: kill:ps:1@step=950 not fired: training ended at step 601 before the round before it "
            "(step 900) fired") in caplog.text, caplog.text


def test_the_runs_end_lists_every_fault_fired_or_not(caplog: pytest.LogCaptureFixture) -> None:
    tasks = [FakeTask("ps", 0, 1 << 30), FakeTask("ps", 1, 1 << 30), FakeTask("worker", 0, 1 << 30),
             FakeTask("worker", 1, 1 << 30)]
    resilience = Resilience(FakeCluster(CLUSTER, tasks), ResilienceConfig(
        health=None, chaos=ChaosPlan.parse([*TWO_KILLS, "stop:worker:1@step=5000"])))
    injector = resilience.injector
    assert injector is not None
    injector._send = lambda pid, sig: None
    resilience._fire(_reading(102, finished=0))
    tasks[0] = FakeTask("ps", 0, (1 << 30) + 1)        # the replacement runs
    resilience._fire(_reading(601, finished=2))        # every worker finished: the rounds left are dropped
    with caplog.at_level(logging.WARNING, logger="psflow.launch"):
        resilience.settle([{"global_step": 601, "ready": True}])
    lines = [r.getMessage() for r in caplog.records]
    end = lines[lines.index("chaos: 1 of 3 faults fired"):]
    assert end[1].startswith("chaos:   kill:ps:0@step=100: fired: SIGKILL to /job:ps/task:0 (pid "), end
    assert end[1].endswith("at global_step 102; not recovered: global_step did not advance past 601 after "
                           "/job:ps/task:0's replacement started"), end
    assert end[2] == ("chaos:   kill:ps:0@step=300: not fired: training ended at step 601 before kill:ps:0@step=100 "
                      "(fired at global_step 102) recovered: a round fires once the round before it recovered, then "
                      "200 steps later"), end
    assert end[3] == ("chaos:   stop:worker:1@step=5000: not fired: training ended at step 601 before the round "
                      "before it (step 300) fired"), end
    assert resilience.metrics()["faults_not_fired"] == 2


def test_a_fault_still_waiting_when_the_run_ends_is_listed_with_why() -> None:
    injector = _injector(TWO_KILLS)
    injector.poll(102)
    assert injector.summary() == [
        "chaos: 1 of 2 faults fired",
        "chaos:   kill:ps:0@step=100: fired: SIGKILL to /job:ps/task:0 (pid 40) at global_step 102; not recovered "
        "yet",
        "chaos:   kill:ps:0@step=300: not fired by the run's end (global_step 102 seen last): waiting until "
        "kill:ps:0@step=100 (fired at global_step 102) recovered: a round fires once the round before it "
        "recovered, then 200 steps later"]


def _reading(step: int, *, finished: int) -> StepReading:
    return StepReading(step, True, finished)


def test_the_runs_end_says_why_a_fault_did_not_recover_once(caplog: pytest.LogCaptureFixture) -> None:
    """Seen reviewing 7f8551b: settle logged 'chaos: SPEC: not recovered: WHY' for each fault left, then the
    summary's line for that fault said the same again ('fired: ...; not recovered: WHY'); one line per fault."""
    tasks = [FakeTask("ps", 0, 1 << 30), FakeTask("ps", 1, 1 << 30), FakeTask("worker", 0, 1 << 30),
             FakeTask("worker", 1, 1 << 30)]
    resilience = Resilience(FakeCluster(CLUSTER, tasks), ResilienceConfig(health=None, chaos=ChaosPlan.parse(TWO_KILLS)))
    assert resilience.injector is not None
    resilience.injector._send = lambda pid, sig: None
    resilience._fire(_reading(102, finished=0))
    tasks[0] = FakeTask("ps", 0, (1 << 30) + 1)        # the replacement runs; global_step never moves past 601
    resilience._fire(_reading(601, finished=2))
    with caplog.at_level(logging.WARNING, logger="psflow.launch"):
        resilience.settle([{"global_step": 601, "ready": True}])
    why = "global_step did not advance past 601 after /job:ps/task:0's replacement started"
    assert [r.getMessage() for r in caplog.records if why in r.getMessage()] == [
        f"chaos:   kill:ps:0@step=100: fired: SIGKILL to /job:ps/task:0 (pid {1 << 30}) at global_step 102; "
        f"not recovered: {why}"], caplog.text
