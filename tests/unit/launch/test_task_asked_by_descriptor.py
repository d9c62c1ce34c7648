"""The chaos and health threads ask a task's process, never its number: its exit and whether a SIGSTOP took effect
are read through its process descriptor, and a hung task that was already gone is reported so, not as killed.

Before: :func:`psflow.launch.exits.exit_status` asked ``waitid(P_PID, pid)`` and ``Resilience._wait_stopped``
read ``/proc/PID/stat``: once the process was reaped, the number may name another process (a task restarted
since, which is this launcher's child too, or a process psflow did not start), whose exit or state was then read as
the task's. ``Resilience._kill_hung`` recorded ``killed pid N (SIGKILL)`` for a task whose process had already
exited (a zombie takes the signal without effect) or been reaped (the signal failed). The reuse of a number is
stood in for by pointing the task's ``Popen.pid`` at another child of the test (a real pid reuse needs the pid
space to wrap). Real processes, started by ``LocalCluster.start_task`` with a command prefix standing in for the
task's program (``sh -c 'exit 3'`` exits 3, ``sh -c 'exec sleep 60'`` runs), each ended by the test (by pid:
``stop_all``).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import psflow.launch.resilience as resilience_module
from psflow.launch.chaos_plan import ChaosPlan
from psflow.launch.fault_recovery import StepReading
from psflow.launch.health import TaskHealth
from psflow.launch.processes import LocalCluster, TaskHosts, TaskProcess
from psflow.launch.resilience import Resilience, ResilienceConfig

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not hasattr(os, "pidfd_open") or not hasattr(os, "P_PIDFD")
                                 or not Path("/proc/self/stat").exists(),
                                 reason="process descriptors (Linux 5.4+), process states read from /proc")]

EXITS_3 = ("sh", "-c", "exit 3")
RUNS = ("sh", "-c", "exec sleep 60")


def _state(pid: int) -> str:
    """The state of one of the test's own children (not reaped: its pid is its own)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _until(what: str, check: Any) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


@pytest.fixture
def lc(tmp_path: Path) -> Iterator[LocalCluster]:
    placement = TaskHosts(prefixes={("ps", 0): RUNS, ("worker", 0): RUNS, ("worker", 1): EXITS_3})
    cluster = LocalCluster.create(1, 2, str(tmp_path), placement=placement)
    yield cluster
    for t in cluster.tasks:  # a number the test pointed elsewhere is the task's own again before it is ended
        t.popen.pid = getattr(t, "_own_pid", t.popen.pid)
    cluster.stop_all(grace=10.0)


def _start(lc: LocalCluster, job: str, index: int, tmp_path: Path) -> TaskProcess:
    task = lc.start_task(job, index, str(tmp_path / "config.json"))
    task._own_pid = task.popen.pid  # type: ignore[attr-defined]
    return task


def _renumber(task: TaskProcess, other: TaskProcess) -> None:
    """``task``'s number now names ``other``'s process (as once ``task`` was reaped and its pid given to ``other``)."""
    task.popen.pid = other.popen.pid


def test_an_exit_is_asked_of_the_process_not_of_its_number(lc: LocalCluster, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    done = _start(lc, "worker", 1, tmp_path)
    _until("worker 1 never exited", lambda: _state(done.pid) == "Z")
    runs = _start(lc, "worker", 0, tmp_path)
    asked: list[int] = []
    real_waitid = os.waitid

    def waitid(idtype: int, ident: int, options: int) -> Any:
        asked.append(idtype)
        return real_waitid(idtype, ident, options)

    monkeypatch.setattr(os, "waitid", waitid)
    _renumber(done, runs)
    assert done.exited() == 3          # its own exit, not the running process its number names now
    assert done.stopped()
    assert runs.exited() is None and not runs.stopped()
    assert asked and set(asked) == {os.P_PIDFD}, asked
    monkeypatch.undo()
    done.popen.pid = done._own_pid  # type: ignore[attr-defined]
    assert _state(done.pid) == "Z"     # still the watch loop's to reap
    assert lc.poll() == [done] and done.exit_code == 3


def test_a_stop_is_asked_of_the_process_not_of_its_number(lc: LocalCluster, tmp_path: Path) -> None:
    runs = _start(lc, "worker", 0, tmp_path)
    other = _start(lc, "ps", 0, tmp_path)
    os.kill(other.pid, signal.SIGSTOP)   # the test's own child, not reaped
    _until("ps 0 never stopped", lambda: _state(other.pid) == "T")
    _renumber(runs, other)
    assert not runs.stopped()          # it runs, though its number names a stopped process now
    runs.popen.pid = runs._own_pid  # type: ignore[attr-defined]
    runs.send_signal(signal.SIGSTOP)
    _until("a SIGSTOPped task never read as stopped", runs.stopped)
    assert _state(runs.pid) == "T"
    runs.send_signal(signal.SIGCONT)
    _until("a SIGCONTed task still read as stopped", lambda: not runs.stopped())
    os.kill(other.pid, signal.SIGCONT)


def test_a_held_round_waits_for_each_trainer_s_stop_through_its_descriptor(
        lc: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A held round (``_fire_held``) waits until every trainer is stopped before it reads global_step: asked through
    each task's descriptor, no ``/proc/PID`` read (a number may name another process once its task was reaped)."""
    ps = _start(lc, "ps", 0, tmp_path)
    w0 = _start(lc, "worker", 0, tmp_path)
    lc.placement = TaskHosts(prefixes={("worker", 1): RUNS})
    w1 = _start(lc, "worker", 1, tmp_path)
    resilience = Resilience(lc, ResilienceConfig(health=None, chaos=ChaosPlan.parse(["kill:ps:0@step=10"])))
    states: list[list[str]] = []
    read: list[str] = []
    real_open = open

    def reading(channels: Any, replicated: bool = False) -> StepReading:
        states.append([_state(w0.pid), _state(w1.pid)])
        return StepReading(12, True, 0)

    def recording_open(path: Any, *args: Any, **kwargs: Any) -> Any:
        read.append(str(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(resilience_module, "poll_reading", reading)
    monkeypatch.setattr(resilience_module, "open", recording_open, raising=False)
    resilience._act([], StepReading(12, True, 0))
    monkeypatch.undo()
    assert [p for p in read if p.startswith("/proc/")] == [], read
    assert states == [["T", "T"]], states     # both held when global_step was read
    assert ps.popen.wait(timeout=30) == -signal.SIGKILL
    _until("a held worker was left stopped", lambda: not w0.stopped() and not w1.stopped())


def _hung(task: TaskProcess) -> TaskHealth:
    return TaskHealth(task.name, "127.0.0.1:1", 0.0, report=f"{task.name} at 127.0.0.1:1 unresponsive for 3.0 s",
                      process=task)


@pytest.mark.parametrize("reaped", [False, True], ids=["exited", "reaped"])
def test_a_hung_task_already_gone_is_reported_gone_not_killed(lc: LocalCluster, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture, reaped: bool) -> None:
    """Its process exited (a zombie the watch loop has not reaped: a SIGKILL would reach nothing) or was reaped
    (the signal fails) after the health check found it silent and before the kill: the log line and ``hangs`` say
    it had exited, with its status, not that it was killed."""
    done = _start(lc, "worker", 1, tmp_path)
    _until("worker 1 never exited", lambda: _state(done.pid) == "Z")
    if reaped:
        assert done.popen.wait(timeout=10) == 3   # the watch loop reaped it; its exit not recorded yet
    resilience = Resilience(lc, ResilienceConfig(health=None))
    caplog.set_level(logging.INFO, logger="psflow.launch")
    resilience._kill_hung(_hung(done))
    assert resilience.hang_kills == [f"/job:worker/task:1 at 127.0.0.1:1 unresponsive for 3.0 s; pid {done.pid} had "
                                     "already exited (exit status 3): not killed"]
    lines = [r.getMessage() for r in caplog.records]
    assert not [line for line in lines if "killing" in line or "killed pid" in line], lines
    assert [line for line in lines if "had already exited (exit status 3): not killed" in line], lines
    if not reaped:
        assert _state(done.pid) == "Z"        # still the watch loop's to reap and record
    assert lc.poll() == [done] and done.exit_code == 3


def test_a_hung_task_that_runs_is_killed_and_said_so(lc: LocalCluster, tmp_path: Path) -> None:
    runs = _start(lc, "worker", 0, tmp_path)
    resilience = Resilience(lc, ResilienceConfig(health=None))
    resilience._kill_hung(_hung(runs))
    assert runs.popen.wait(timeout=30) == -signal.SIGKILL
    assert resilience.hang_kills == [f"/job:worker/task:0 at 127.0.0.1:1 unresponsive for 3.0 s; killed pid {runs.pid} "
                                     "(SIGKILL)"]


def test_a_kernel_without_waitid_by_descriptor_asks_by_pid(lc: LocalCluster, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux 5.3 has pidfd_open but no ``waitid(P_PIDFD)`` (EINVAL): the exit is asked by pid there, while the
    process is not reaped (its pid its own)."""
    done = _start(lc, "worker", 1, tmp_path)
    _until("worker 1 never exited", lambda: _state(done.pid) == "Z")
    real_waitid = os.waitid
    asked: list[int] = []

    def waitid(idtype: int, ident: int, options: int) -> Any:
        asked.append(idtype)
        if idtype == os.P_PIDFD:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_waitid(idtype, ident, options)

    monkeypatch.setattr(os, "waitid", waitid)
    assert done.exited() == 3 and done.exited() == 3
    assert asked == [os.P_PIDFD, os.P_PID, os.P_PID], asked   # told once: by pid from then on
    monkeypatch.undo()
    assert lc.poll() == [done] and done.exit_code == 3
