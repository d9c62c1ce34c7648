"""A fault of a round already begun fires with the trainers held (SIGSTOP), as a round coming due does.

Seen reviewing 7f8551b: the chaos thread held the training processes only when ``due_at()`` said a round
came due; a round begun without every fault fired (its target not found yet: a replicated shard's failover
under way, nobody holding the chief duties, its task being restarted) has no ``due_at`` (None), so its
fault fired from an unheld poll, and the race :meth:`Resilience._fire_held` documents came back: the last
worker could pass its final check between the reading that said training goes on and the signal. The
trainers are held only when a poll could fire something (:meth:`ChaosInjector.may_fire`), not at every poll.
Real child processes stand for the workers (their /proc state is read when the signal is sent); the fault's
own signal goes to a fake.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from launched_tasks import FakeCluster, FakeTask

import psflow.launch.resilience as resilience_module
from psflow.cluster import ClusterSpec
from psflow.launch.chaos import ChaosInjector
from psflow.launch.chaos_plan import ChaosPlan, DutyHolder
from psflow.launch.fault_recovery import StepReading
from psflow.launch.resilience import Resilience, ResilienceConfig

pytestmark = pytest.mark.timeout(60)

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})


@pytest.fixture
def workers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) for _ in range(2)]
    try:
        yield procs
    finally:
        for p in procs:  # ours, by pid: resumed first, so a SIGSTOPped one can die
            p.send_signal(18)  # SIGCONT
            p.kill()
            p.wait(timeout=10)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait(until: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not until():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _run_loop(monkeypatch: pytest.MonkeyPatch, resilience: Resilience, steps: Callable[[int], int]) -> list[int]:
    """Starts the chaos thread on fake readings: the n-th global_step read is ``steps(n)``; returns the steps read."""
    read: list[int] = []
    monkeypatch.setattr(resilience_module, "ps_members", lambda cluster: [])
    monkeypatch.setattr(resilience_module, "poll_reading",
                        lambda channels, replicated=False, also=frozenset(): read.append(steps(len(read))) or StepReading(read[-1], True))
    resilience.start()
    return read


def test_a_chief_fault_that_finds_its_holder_after_its_round_came_due_fires_with_the_workers_held(
        workers: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = [FakeTask("ps", 0, 1 << 30), *(FakeTask("worker", i, p.pid) for i, p in enumerate(workers))]
    resilience = Resilience(FakeCluster(CLUSTER, tasks), ResilienceConfig(health=None, chaos=ChaosPlan.parse(
        ["kill:chief@step=100"])))
    injector = resilience.injector
    assert injector is not None
    read: list[int] = []
    states: list[list[str]] = []
    # Nobody holds the chief lease when the round comes due (step 102); worker 1 takes it from step 130.
    injector._holder = lambda: DutyHolder("worker", 1, 7) if read and read[-1] >= 130 else None
    injector._send = lambda pid, sig: states.append([_state(p.pid) for p in workers])
    try:
        read = _run_loop(monkeypatch, resilience, lambda n: 102 + n)
        _wait(lambda: bool(injector.injected), "the chief fault never fired")
    finally:
        resilience.close()
    assert [(f.task, f.at_step >= 130) for f in injector.injected] == [("/job:worker/task:1", True)]
    assert states == [["T", "T"]], states                  # both workers were held when the fault was sent
    _wait(lambda: [_state(p.pid) for p in workers] == ["S", "S"], "a worker was left stopped")


def test_polls_that_can_fire_nothing_hold_nobody(workers: list[subprocess.Popen[bytes]],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    tasks = [FakeTask("ps", 0, 1 << 30), *(FakeTask("worker", i, p.pid) for i, p in enumerate(workers))]
    resilience = Resilience(FakeCluster(CLUSTER, tasks), ResilienceConfig(health=None, chaos=ChaosPlan.parse(
        ["kill:chief@step=100"])))
    held: list[int] = []
    monkeypatch.setattr(resilience, "_fire_held", lambda channels, reading: held.append(reading.step) or reading)
    try:
        read = _run_loop(monkeypatch, resilience, lambda n: min(1 + n, 99))  # never reaches the fault's step
        _wait(lambda: len(read) >= 150, "the chaos thread did not poll")
    finally:
        resilience.close()
    assert held == []


def test_may_fire_asks_whether_a_begun_rounds_target_runs() -> None:
    running: list[bool] = [False]  # worker 1 is being restarted when its round comes due
    injector = ChaosInjector(ChaosPlan.parse(["kill:worker:1@step=100", "kill:ps:0@step=300"]), CLUSTER,
                             lambda job, i: FakeTask(job, i, 43) if running[0] or job != "worker" else None,
                             send=lambda pid, sig: None)
    assert not injector.may_fire(99) and injector.may_fire(100)
    assert injector.poll(100) == [] and injector.due_at() is None  # begun, its task not back
    assert not injector.may_fire(101)
    running[0] = True
    assert injector.may_fire(101) and [f.task for f in injector.poll(101)] == ["/job:worker/task:1"]
    assert not injector.may_fire(10_000)                          # the next round waits for this one's recovery


def test_a_target_that_answers_between_may_fire_and_the_poll_is_not_hit_unheld(
        workers: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    # Reviewing 515ef99: _act asked may_fire, then (told no) called poll unheld, which asks the targets again
    # (a shard's members, the chief lease): a target that answers between the two asks was hit unheld. Here
    # the holder answers from its third ask on: the round's held poll (1st), may_fire's (2nd), then the poll's.
    tasks = [FakeTask("ps", 0, 1 << 30), *(FakeTask("worker", i, p.pid) for i, p in enumerate(workers))]
    resilience = Resilience(FakeCluster(CLUSTER, tasks), ResilienceConfig(health=None, chaos=ChaosPlan.parse(
        ["kill:chief@step=100"])))
    injector = resilience.injector
    assert injector is not None
    asks: list[int] = []
    states: list[list[str]] = []
    injector._holder = lambda: DutyHolder("worker", 1, 7) if asks.append(1) or len(asks) >= 3 else None
    injector._send = lambda pid, sig: states.append([_state(p.pid) for p in workers])
    try:
        _run_loop(monkeypatch, resilience, lambda n: 102 + n)
        _wait(lambda: bool(injector.injected), "the chief fault never fired")
    finally:
        resilience.close()
    assert [f.task for f in injector.injected] == ["/job:worker/task:1"]
    assert states == [["T", "T"]], states                  # both workers were held when the fault was sent


def test_a_stop_fault_s_task_stays_stopped_when_its_round_fires_another_fault_later(
        workers: list[subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch) -> None:
    # Reviewing 515ef99: the held poll of a begun round stopped every trainer and resumed (SIGCONT) each but
    # the ones a stop fault of that very poll hit, so worker 1, stopped by stop:worker:1 at the round's first
    # poll, was resumed when the round's chief fault fired later ("stop: it hangs; it is not resumed").
    tasks = [FakeTask("ps", 0, 1 << 30), *(FakeTask("worker", i, p.pid) for i, p in enumerate(workers))]
    resilience = Resilience(FakeCluster(CLUSTER, tasks), ResilienceConfig(health=None, chaos=ChaosPlan.parse(
        ["stop:worker:1@step=100", "kill:chief@step=100"])))
    injector = resilience.injector
    assert injector is not None
    read: list[int] = []
    sent: list[tuple[int, str]] = []

    def send(pid: int, sig: int) -> None:
        sent.append((pid, signal.Signals(sig).name))
        if sig == signal.SIGSTOP:
            os.kill(pid, sig)  # our child: really stopped, as the fault would

    # Nobody holds the chief lease when the round comes due; worker 0 takes it from step 130.
    injector._holder = lambda: DutyHolder("worker", 0, 7) if read and read[-1] >= 130 else None
    injector._send = send
    try:
        read = _run_loop(monkeypatch, resilience, lambda n: 102 + n)
        _wait(lambda: len(injector.injected) == 2, "the round's faults never fired")
    finally:
        resilience.close()
    assert sent == [(workers[1].pid, "SIGSTOP"), (workers[0].pid, "SIGKILL")], sent
    _wait(lambda: _state(workers[0].pid) == "S", "worker 0 was left stopped")
    time.sleep(0.2)
    assert _state(workers[1].pid) == "T"                    # the stop fault's task was not resumed
