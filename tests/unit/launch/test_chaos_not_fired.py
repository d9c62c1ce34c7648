"""A chaos fault whose step comes after the end of training is not fired, and says so (issue 25/30 follow-up).

Before: ``--chaos kill:ps:1@step=S`` with S near the run's last step fired after every worker had
finished its data; the finished workers left, the restore could not rewind them, and the run either
waited 60 s and failed or ended with a model trained on part of the data, depending on a race of a
few milliseconds. Pure logic, no processes.
"""

from __future__ import annotations

import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from launched_tasks import FakeCluster
from launched_tasks import FakeTask as FakeProcess

from psflow.cluster import ClusterSpec
from psflow.launch.chaos import ChaosInjector
from psflow.launch.chaos_plan import ChaosPlan
from psflow.launch.fault_recovery import StepReading, step_reading
from psflow.launch.resilience import Resilience, ResilienceConfig

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


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.timeout(30)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_a_due_round_fires_while_every_training_process_is_held() -> None:
    """The decision (training ended or not) and the signals happen with the workers held (SIGSTOP), so no
    worker passes its last check in between; they run on afterwards, except one a ``stop`` fault hit."""
    sleepers = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    try:
        for p in sleepers:  # started: asleep in sleep(1), not still being exec'd
            while _state(p.pid) != "S" or Path(f"/proc/{p.pid}/cmdline").read_bytes()[:5] != b"sleep":
                time.sleep(0.001)
        procs = [FakeProcess("ps", 1, sleepers[0].pid), FakeProcess("worker", 0, sleepers[1].pid),
                 FakeProcess("worker", 1, sleepers[2].pid)]
        config = ResilienceConfig(health=None, chaos=ChaosPlan.parse(["kill:ps:1@step=10", "stop:worker:1@step=10"]))
        resilience = Resilience(FakeCluster(CLUSTER, procs), config)
        seen: list[tuple[int, list[str]]] = []
        assert resilience.injector is not None
        resilience.injector._send = lambda pid, sig: seen.append((pid, [_state(p.pid) for p in procs]))
        resilience._fire_held([], StepReading(12, True, 1))
        # Both faults sent while the workers were stopped (the ps task, not a trainer, ran on).
        assert [pid for pid, _ in seen] == [procs[0].pid, procs[2].pid]
        assert all(states[1] == "T" and states[2] == "T" and states[0] != "T" for _, states in seen), seen
        # Afterwards worker 0 runs again; worker 1, which the stop fault hit, stays stopped.
        assert _state(procs[1].pid) != "T" and _state(procs[2].pid) == "T"
    finally:
        for p in sleepers:
            p.kill()
            p.wait(timeout=10)


def test_a_round_is_not_fired_when_the_held_reading_shows_training_ended() -> None:
    procs = [FakeProcess("ps", 1, 1 << 30), FakeProcess("worker", 0, 1 << 30), FakeProcess("worker", 1, 1 << 30)]
    resilience = Resilience(FakeCluster(CLUSTER, procs), ResilienceConfig(
        health=None, chaos=ChaosPlan.parse(["kill:ps:1@step=10"])))
    assert resilience.injector is not None
    sent: list[int] = []
    resilience.injector._send = lambda pid, sig: sent.append(pid)
    resilience._fire_held([], StepReading(12, True, 2))   # both workers finished (pids gone: nothing to hold)
    assert sent == [] and resilience.metrics()["faults_not_fired"] == 1
