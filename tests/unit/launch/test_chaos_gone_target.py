"""A chaos fault never reports a signal to a process that had already exited, nor waits for one that will not
come back, and a ``stop`` fault's hold is kept by process, not by pid.

Found checking chaos.py (task H4): (a) a begun round's fault whose task had exited 0 (a worker that finished its
data: never restarted) waited for it for the rest of the run, the round never completing and every later round
held back; the end said it "waited for its target ... or its task running again". (b) the launcher's exit code
of a task is recorded by the watch loop every 50 ms: a process that exited in between (a zombie, not yet reaped)
counted as running, so a fault "sent SIGKILL to /job:worker/task:1 (pid P)" that hit nothing, and it was then
never recovered. (c) a task a ``stop`` fault hit is not held again by later rounds (it is stopped already), but
that was decided by pid: a later process given the same pid (the stopped one killed by hang detection, its pid
reused) was never held while a later round fired. Real child processes where a state is read (/proc).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launched_tasks import FakeCluster, FakeTask

from psflow.cluster import ClusterSpec
from psflow.launch.chaos_plan import ChaosPlan
from psflow.launch.fault_recovery import StepReading
from psflow.launch.resilience import Resilience, ResilienceConfig

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")]

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
NO_PID = 1 << 30  # above any pid_max: a signal to it finds no process


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(3)]
    try:
        for p in procs:  # started and asleep, not still being exec'd
            while _state(p.pid) != "S" or b"sleep" not in Path(f"/proc/{p.pid}/cmdline").read_bytes():
                time.sleep(0.001)
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=10)


def _resilience(procs: list[FakeTask], specs: list[str]) -> tuple[Resilience, list[tuple[int, str]]]:
    resilience = Resilience(FakeCluster(CLUSTER, procs), ResilienceConfig(health=None, chaos=ChaosPlan.parse(specs)))
    sent: list[tuple[int, str]] = []
    assert resilience.injector is not None
    resilience.injector._send = lambda pid, sig: sent.append((pid, signal.Signals(sig).name))
    return resilience, sent


def test_a_begun_rounds_fault_on_a_task_that_exited_0_is_dropped_and_the_schedule_goes_on() -> None:
    procs = [FakeTask("ps", 0, NO_PID), FakeTask("ps", 1, NO_PID + 1), FakeTask("worker", 0, NO_PID + 2),
             FakeTask("worker", 1, NO_PID + 3, exit_code=0)]  # worker 1 finished its data: never restarted
    resilience, sent = _resilience(procs, ["kill:ps:1@step=10", "kill:worker:1@step=10", "kill:ps:0@step=20"])
    injector = resilience.injector
    assert injector is not None
    resilience._act([], StepReading(12, True, 1))
    assert sent == [(NO_PID + 1, "SIGKILL")]
    assert "kill:worker:1@step=10" in injector.not_fired, injector.summary()
    assert injector.not_fired["kill:worker:1@step=10"].startswith(f"/job:worker/task:1 (pid {NO_PID + 3}) exited 0")
    injector.injected[0].recovered_at_step = 15  # ps task 1's replacement trained on
    resilience._act([], StepReading(24, True, 1))
    assert len(sent) == 1   # due at 15 + 10
    resilience._act([], StepReading(25, True, 1))
    assert sent[1] == (NO_PID, "SIGKILL")
    lines = injector.summary()
    assert lines[0] == "chaos: 2 of 3 faults fired"
    assert lines[2].startswith(f"chaos:   kill:worker:1@step=10: not fired: /job:worker/task:1 (pid {NO_PID + 3}) "
                               "exited 0"), lines


def test_a_round_whose_only_task_exited_0_fires_nothing_and_does_not_hold_the_next() -> None:
    procs = [FakeTask("ps", 1, NO_PID + 1), FakeTask("worker", 0, NO_PID + 2), FakeTask("worker", 1, NO_PID + 3, exit_code=0)]
    resilience, sent = _resilience(procs, ["kill:worker:1@step=10", "kill:ps:1@step=20"])
    resilience._act([], StepReading(12, True, 1))
    assert sent == []
    resilience._act([], StepReading(20, True, 1))   # nothing fired, nothing to recover: the next round at its step
    assert sent == [(NO_PID + 1, "SIGKILL")]


def test_a_process_that_exited_before_the_watch_loop_saw_it_is_not_signalled() -> None:
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        while _state(done.pid) != "Z":  # exited, not reaped: what the launcher's recorded exit code still hides
            time.sleep(0.005)
        procs = [FakeTask("ps", 1, NO_PID + 1), FakeTask("worker", 0, NO_PID + 2),
                 FakeTask("worker", 1, done.pid, popen=done)]
        resilience, sent = _resilience(procs, ["kill:worker:1@step=10"])
        resilience._act([], StepReading(12, True, 1))
        assert sent == []
        assert resilience.injector is not None and resilience.metrics()["faults"] == []
        assert resilience.injector.not_fired["kill:worker:1@step=10"].startswith(
            f"/job:worker/task:1 (pid {done.pid}) exited 0")
    finally:
        done.wait(timeout=10)


def test_a_later_process_with_a_stopped_ones_pid_is_held_when_a_later_round_fires(
        sleepers: list[subprocess.Popen[bytes]]) -> None:
    ps, w0, w1 = (p.pid for p in sleepers)
    procs = [FakeTask("ps", 1, ps), FakeTask("worker", 0, w0), FakeTask("worker", 1, w1)]
    resilience, sent = _resilience(procs, ["stop:worker:1@step=10", "kill:ps:1@step=20"])
    resilience.injector._send = os.kill  # type: ignore[union-attr]
    resilience._act([], StepReading(12, True, 0))
    assert _state(w1) == "T"
    # Hang detection killed the stopped worker 1 and its replacement was given the same pid (stood for here by
    # the same process, resumed): a new process, which the next round must hold like every other trainer.
    procs[2].exit_code = -9
    procs[2] = FakeTask("worker", 1, w1)
    os.kill(w1, signal.SIGCONT)
    assert resilience.injector is not None
    resilience.injector.injected[0].recovered_at_step = 14
    states: list[str] = []
    resilience.injector._send = lambda pid, sig: states.append(_state(w1))
    resilience._act([], StepReading(30, True, 0))
    assert states == ["T"]      # held while the ps task's fault was sent
    assert _state(w1) != "T"    # and resumed afterwards
