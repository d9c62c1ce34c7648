"""A hang report kills the process that hung, never its replacement (task S12).

Before: the health monitor decided a hang under its lock and called ``Resilience._kill_hung`` after releasing
it, with the task's name only; ``_kill_hung`` signalled the newest process of that name. Where the task was
restarted in between (its process exited and the restart policy started a replacement, ``monitor.forget``
called), the SIGKILL went to the replacement, which had never been watched: a healthy task killed, a restart
loop, and ``killed pid N`` said of a process that never hung. ``forget`` also cleared the report line the
callback was about to log (the same object). Now each check round watches the processes the launcher names (a
new process under a name restarts its clock), the report carries the process it saw hang
(:attr:`TaskHealth.process`, a copy the monitor no longer changes), and only that process is signalled
(:func:`psflow.launch.hang_kill.kill_hung`, through its descriptor); one gone since and replaced is said so.

Real processes (``LocalCluster.start_task`` with ``sh -c 'exec sleep 60'``: runs, serves no ping), each ended by
the test (by pid: ``stop_all``); the race is made deterministic by holding the hang callback until the restart
was made.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from psflow.cluster import ClusterSpec
from psflow.launch.health import HealthConfig, HealthMonitor, TaskHealth
from psflow.launch.ports import free_ports
from psflow.launch.processes import LocalCluster, TaskHosts
from psflow.launch.resilience import Resilience, ResilienceConfig
from psflow.launch.supervisor import RestartConfig

pytestmark = pytest.mark.timeout(60)

RUNS = ("sh", "-c", "exec sleep 60")
WORKER = "/job:worker/task:0"


@pytest.fixture
def lc(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster.create(1, 1, str(tmp_path), placement=TaskHosts(prefixes={("worker", 0): RUNS}))
    yield cluster
    cluster.stop_all(grace=10.0)


def _until(what: str, check: Any) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_task_restarted_between_the_hang_and_the_kill_keeps_its_replacement(
        lc: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hang is decided for process A; A exits and the restart policy starts B before the callback runs: B is
    not signalled, and the line (and ``hangs``) says A was replaced, not killed."""
    a = lc.start_task("worker", 0, str(tmp_path / "config.json"))
    # A answered once (judged after unresponsive_after); B, never answering, only after start_timeout (60 s).
    health = HealthConfig(interval=0.1, ping_timeout=0.5, unresponsive_after=0.1, start_timeout=60.0)
    resilience = Resilience(lc, ResilienceConfig(restart=RestartConfig(policy="on-failure", backoff_initial=0.0),
                                                 health=health))
    assert resilience.monitor is not None
    resilience.monitor.mark_up({WORKER: a})
    decided, restarted = threading.Event(), threading.Event()
    kill_hung = resilience._kill_hung

    def held_kill(report: TaskHealth) -> None:  # the monitor's thread, its lock released
        decided.set()
        assert restarted.wait(30), "the test never restarted the task"
        kill_hung(report)

    monkeypatch.setattr(resilience, "_kill_hung", held_kill)
    caplog.set_level(logging.INFO, logger="psflow.launch")
    resilience.start()
    try:
        assert decided.wait(30), f"{WORKER} never reported unresponsive"
        a.send_signal(signal.SIGKILL)  # A exits (on its own, in a real run) ...
        assert a.popen.wait(timeout=30) == -signal.SIGKILL
        assert lc.poll() == [a]
        assert resilience.on_exit(a)  # ... and the watch loop restarts it (as its loop does: on_exit, tick)
        resilience.tick(None)
        (b,) = [t for t in lc.tasks if t.name == WORKER]
        assert b is not a and b.exited() is None
        restarted.set()
        _until("the hang was never reported", lambda: resilience.hang_kills)
    finally:
        restarted.set()
        resilience.close()
    assert b.exited() is None, f"the replacement (pid {b.pid}) was signalled"
    assert not b.stopped()
    (line,) = resilience.hang_kills
    assert line.startswith(f"{WORKER} at ") and "unresponsive for" in line, line
    assert line.endswith(f"; pid {a.pid} (incarnation 1) was replaced before the kill: not killed"), line
    assert (a.incarnation, b.incarnation) == (1, 2)
    lines = [r.getMessage() for r in caplog.records if "unresponsive for" in r.getMessage()]
    assert lines == [line], lines
    assert resilience.metrics()["hangs"] == [line]


def test_the_report_names_the_process_it_saw_hang_and_a_forget_does_not_clear_it() -> None:
    """The callback's report is the process of the round that decided, and a ``forget`` (a restart) between the
    decision and the callback changes neither it nor its line."""
    (port,) = free_ports(1)  # nothing listens: every ping fails
    now = [0.0]
    seen: list[tuple[object, str, str]] = []
    config = HealthConfig(interval=1.0, ping_timeout=0.5, unresponsive_after=1.0, start_timeout=1.0)

    def on_unresponsive(report: TaskHealth, line: str) -> None:
        monitor.forget(report.task)  # a restart, made after the decision and before this callback
        seen.append((report.process, report.report, line))

    monitor = HealthMonitor(ClusterSpec({"worker": [f"127.0.0.1:{port}"]}), token=None, config=config,
                            on_unresponsive=on_unresponsive, clock=lambda: now[0])
    with monitor:
        a = object()
        now[0] = 5.0
        (report,) = monitor.check({WORKER: a})
        assert report.process is a and report.report.startswith(f"{WORKER} at 127.0.0.1:{port} unresponsive for 5.0 s")
        assert seen == [(a, report.report, report.report)]


def test_a_new_process_under_a_name_is_judged_from_its_own_start() -> None:
    """A process watched under a name its predecessor was silent under is not reported for that silence: its
    clock starts when a round first names it (whether or not anyone called ``forget``)."""
    (port,) = free_ports(1)
    now = [0.0]
    config = HealthConfig(interval=1.0, ping_timeout=0.5, unresponsive_after=1.0, start_timeout=1.0)
    with HealthMonitor(ClusterSpec({"worker": [f"127.0.0.1:{port}"]}), token=None, config=config,
                       on_unresponsive=lambda _report, _line: None, clock=lambda: now[0]) as monitor:
        a, b = object(), object()
        now[0] = 0.5
        assert monitor.check({WORKER: a}) == []
        now[0] = 5.0
        assert monitor.check({WORKER: b}) == []  # A silent 5 s; B watched from now
        now[0] = 5.5
        assert monitor.check({WORKER: b}) == []
        now[0] = 6.5
        (report,) = monitor.check({WORKER: b})
        assert report.process is b and "unresponsive for 1.5 s" in report.report


def test_a_report_that_names_no_process_kills_nothing(lc: LocalCluster, tmp_path: Path) -> None:
    """A check by task names only (no process named): nothing is signalled by name, and the line says so."""
    a = lc.start_task("worker", 0, str(tmp_path / "config.json"))
    resilience = Resilience(lc, ResilienceConfig(health=None))
    report = TaskHealth(WORKER, "127.0.0.1:1", 0.0, report=f"{WORKER} at 127.0.0.1:1 unresponsive for 3.0 s")
    resilience._kill_hung(report)
    assert a.exited() is None
    assert resilience.hang_kills == [f"{WORKER} at 127.0.0.1:1 unresponsive for 3.0 s; the check named no process: "
                                     "not killed"]
