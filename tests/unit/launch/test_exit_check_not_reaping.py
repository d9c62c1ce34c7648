"""The chaos thread's check of a task's exit never reaps it, and no signal of another thread than the watch loop's
reaches a process after it was reaped (its pid may be another process's by then).

Before: :meth:`TaskProcess.exited` called ``Popen.poll``, which reaps, on the chaos thread; ``Resilience._fire_held``
then SIGSTOPped by pid every trainer whose exit the watch loop had not recorded yet, the one just reaped included:
its pid freed, the kernel may give it to a process psflow did not start, which would have been stopped. Now the
check is ``waitid(..., WNOWAIT)`` (:func:`psflow.launch.exits.exit_status`: the zombie keeps its pid until the
watch loop reaps it), and the chaos and health threads signal through the task's process descriptor
(:meth:`TaskProcess.send_signal`), which fails once the process is reaped. Real child processes.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from launched_tasks import FakeCluster

from psflow.cluster import ClusterSpec
from psflow.launch.chaos_plan import ChaosPlan
from psflow.launch.exits import ProcessDescriptor
from psflow.launch.fault_recovery import StepReading
from psflow.launch.processes import TaskProcess
from psflow.launch.resilience import Resilience, ResilienceConfig

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")]

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _task(job: str, index: int, code: str, tmp_path: Path) -> TaskProcess:
    popen = subprocess.Popen([sys.executable, "-c", code])
    log = open(tmp_path / f"{job}-{index}.log", "w")  # noqa: SIM115 (closed by the fixture)
    return TaskProcess(job, index, popen, log.name, log, descriptor=ProcessDescriptor.open(popen.pid))


def _zombie(task: TaskProcess) -> None:
    while _state(task.pid) != "Z":  # exited, not reaped
        time.sleep(0.005)


@pytest.fixture
def tasks(tmp_path: Path) -> Iterator[list[TaskProcess]]:
    made: list[TaskProcess] = []
    yield made
    for t in made:
        if t.popen.returncode is None:
            t.popen.kill()
            t.popen.wait(timeout=10)
        t.log_file.close()


@pytest.mark.parametrize(("code", "status"), [("import sys; sys.exit(3)", 3), ("import os; os.kill(os.getpid(), 9)", -9)])
def test_exited_leaves_the_process_for_the_watch_loop_to_reap(tmp_path: Path, tasks: list[TaskProcess], code: str,
                                                              status: int) -> None:
    task = _task("worker", 1, code, tmp_path)
    tasks.append(task)
    _zombie(task)
    assert task.exited() == status
    assert _state(task.pid) == "Z"   # still unreaped: its pid is still its own
    pid, raw = os.waitpid(task.pid, 0)   # what the watch loop's reap gets: its status (before: ChildProcessError)
    assert pid == task.pid and os.waitstatus_to_exitcode(raw) == status
    task.popen.returncode = status


def test_exited_is_none_while_it_runs(tmp_path: Path, tasks: list[TaskProcess]) -> None:
    task = _task("worker", 0, "import time; time.sleep(60)", tmp_path)
    tasks.append(task)
    assert task.exited() is None


def test_a_reaped_process_is_never_signalled(tmp_path: Path, tasks: list[TaskProcess]) -> None:
    task = _task("worker", 0, "pass", tmp_path)
    tasks.append(task)
    task.popen.wait(timeout=10)   # reaped by the watch loop, its exit not recorded yet (exit_code None)
    with pytest.raises(ProcessLookupError):
        task.send_signal(signal.SIGSTOP)


def test_chaos_never_signals_a_trainer_reaped_before_the_watch_loop_recorded_it(
        tmp_path: Path, tasks: list[TaskProcess], monkeypatch: pytest.MonkeyPatch) -> None:
    """A held round: every trainer whose exit is not recorded is SIGSTOPped, then SIGCONTed. Worker 1 was reaped
    by the watch loop a moment before (its exit_code not yet set): no signal may go to its pid."""
    ps = _task("ps", 0, "import time; time.sleep(60)", tmp_path)
    w0 = _task("worker", 0, "import time; time.sleep(60)", tmp_path)
    w1 = _task("worker", 1, "pass", tmp_path)
    tasks += [ps, w0, w1]
    w1.popen.wait(timeout=10)
    by_pid: list[tuple[int, int]] = []
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:
        by_pid.append((pid, sig))
        real_kill(pid, sig)

    monkeypatch.setattr(os, "kill", kill)
    resilience = Resilience(FakeCluster(CLUSTER, [ps, w0, w1]),  # type: ignore[arg-type]
                            ResilienceConfig(health=None, chaos=ChaosPlan.parse(["kill:ps:0@step=10"])))
    sent: list[Any] = []
    pidfd_send = signal.pidfd_send_signal

    def send(fd: int, sig: int, *args: Any) -> None:
        sent.append((fd, signal.Signals(sig).name))
        pidfd_send(fd, sig, *args)

    monkeypatch.setattr(signal, "pidfd_send_signal", send)
    resilience._act([], StepReading(12, True, 0))
    assert [p for p, _ in by_pid if p == w1.pid] == [], by_pid
    assert ps.popen.wait(timeout=10) == -signal.SIGKILL   # the fault fired, through ps 0's descriptor
    assert (w0.pidfd, "SIGSTOP") in sent and (w0.pidfd, "SIGCONT") in sent, sent
    assert _state(w0.pid) != "T"


def test_chaos_finding_an_exited_task_leaves_it_unreaped(tmp_path: Path, tasks: list[TaskProcess]) -> None:
    """The chaos thread asks whether a fault's task runs (``_find``, ``_ended``): it exited 0, unrecorded; it is
    dropped, not fired, and stays a zombie for the watch loop to reap and record."""
    ps = _task("ps", 0, "import time; time.sleep(60)", tmp_path)
    w1 = _task("worker", 1, "pass", tmp_path)
    tasks += [ps, w1]
    _zombie(w1)
    resilience = Resilience(FakeCluster(CLUSTER, [ps, w1]),  # type: ignore[arg-type]
                            ResilienceConfig(health=None, chaos=ChaosPlan.parse(["kill:worker:1@step=10"])))
    resilience._act([], StepReading(12, True, 0))
    assert resilience.injector is not None and resilience.injector.injected == []
    assert _state(w1.pid) == "Z"
    assert w1.popen.poll() == 0
