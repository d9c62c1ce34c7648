"""A chaos fault whose step comes after the end of training is not fired, and says so (issue 25/30 follow-up).

Before: ``--chaos kill:ps:1@step=S`` with S near the run's last step fired after every worker had
finished its data; the finished workers left, the restore could not rewind them, and the run either
waited 60 s and failed or ended with a model trained on part of the data, depending on a race of a
few milliseconds. Pure logic, no processes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from psflow.cluster import ClusterSpec
from psflow.launch.chaos import ChaosInjector, ChaosPlan
from psflow.launch.fault_recovery import step_reading

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})


@dataclass
class FakeTask:
    name: str
    pid: int


def _injector(specs: list[str], sent: list[int]) -> ChaosInjector:
    return ChaosInjector(ChaosPlan.parse(specs), CLUSTER, lambda job, i: FakeTask(f"/job:{job}/task:{i}", 40 + i),
                         send=lambda pid, sig: sent.append(pid))


def test_a_fault_due_after_training_ended_is_not_fired_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    sent: list[int] = []
    injector = _injector(["kill:ps:1@step=3052", "kill:worker:0@step=3100"], sent)
    with caplog.at_level(logging.WARNING, logger="psflow.launch"):
        assert injector.training_ended(3054) == ["kill:ps:1@step=3052", "kill:worker:0@step=3100"]
    assert injector.poll(3054) == [] and sent == []
    assert injector.pending() == 0 and injector.skipped == ["kill:ps:1@step=3052", "kill:worker:0@step=3100"]
    assert "chaos: kill:ps:1@step=3052 not fired: training ended at step 3054" in caplog.text


def test_faults_fired_before_the_end_are_kept_and_a_begun_round_goes_on() -> None:
    sent: list[int] = []
    injector = _injector(["kill:ps:0@step=10", "kill:ps:1@step=10"], sent)
    running = {0: True, 1: False}
    injector._find = lambda job, i: FakeTask(f"/job:{job}/task:{i}", 40 + i) if running[i] else None  # type: ignore[method-assign]
    assert [f.task for f in injector.poll(10)] == ["/job:ps/task:0"]   # ps 1 is being restarted: fires when back
    assert injector.training_ended(12) == []                            # part of a recovery under way
    running[1] = True
    assert [f.task for f in injector.poll(12)] == ["/job:ps/task:1"] and sent == [40, 41]


def test_the_step_reading_counts_the_finished_workers() -> None:
    reading = step_reading({"global_step": 7, "ready": True, "finished": ["/job:worker/task:0", "/job:worker/task:1"]})
    assert reading is not None and (reading.step, reading.ready, reading.finished) == (7, True, 2)
    reading = step_reading({"global_step": 7, "ready": True, "finished": None})
    assert reading is not None and reading.finished == 0
