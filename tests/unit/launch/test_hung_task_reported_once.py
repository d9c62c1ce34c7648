"""A hung task is reported once on the console: what the health check saw and what was done about it.

Before: :meth:`HealthMonitor.check` logged its report (``/job:worker/task:0 at ... unresponsive for 3.1 s ...``)
and then handed it to ``Resilience._kill_hung``, which logged it again with ``; killed pid N (SIGKILL)``: one
hung task, two lines (seen running ``psflow train --chaos stop:worker:1@step=40 --liveness-timeout 3``). A task
whose exit the watch loop had recorded between the check and the kill got the first line only, nothing said of
what became of it. Now the monitor leaves the report to its ``on_unresponsive`` callback where it has one (and
logs it itself where it has none); ``_kill_hung`` says, in one line, what was seen and what was done.

Real processes (``LocalCluster.start_task`` with a command prefix: ``sh -c 'exec sleep 60'`` runs and serves no
ping, ``sh -c 'exit 3'`` exits 3), real pings to their unanswered ports; each process ended by the test (by pid:
``stop_all``).
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from psflow.launch.health import HealthConfig, HealthMonitor
from psflow.launch.processes import LocalCluster, TaskHosts, TaskProcess
from psflow.launch.resilience import Resilience, ResilienceConfig

pytestmark = pytest.mark.timeout(60)

RUNS = ("sh", "-c", "exec sleep 60")
EXITS_3 = ("sh", "-c", "exit 3")
QUICK = HealthConfig(interval=0.1, ping_timeout=0.5, unresponsive_after=0.1, start_timeout=0.1)


@pytest.fixture
def lc(tmp_path: Path) -> Iterator[LocalCluster]:
    placement = TaskHosts(prefixes={("ps", 0): RUNS, ("worker", 0): RUNS, ("worker", 1): EXITS_3})
    cluster = LocalCluster.create(1, 2, str(tmp_path), placement=placement)
    yield cluster
    cluster.stop_all(grace=10.0)


def _check_until_reported(monitor: HealthMonitor, task: str, process: TaskProcess | None = None) -> None:
    deadline = time.monotonic() + 30
    while not monitor.check({task: process} if process is not None else [task]):
        assert time.monotonic() < deadline, f"{task} never reported unresponsive"
        time.sleep(0.05)


def _lines_about(caplog: pytest.LogCaptureFixture, task: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if task in r.getMessage()]


def test_a_hung_task_that_runs_is_reported_once_with_its_kill(lc: LocalCluster, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    task = lc.start_task("worker", 0, str(tmp_path / "config.json"))
    resilience = Resilience(lc, ResilienceConfig(health=QUICK))
    assert resilience.monitor is not None
    caplog.set_level(logging.INFO, logger="psflow.launch")
    _check_until_reported(resilience.monitor, task.name, task)
    assert task.popen.wait(timeout=30) == -signal.SIGKILL
    lines = _lines_about(caplog, task.name)
    assert len(lines) == 1, lines
    assert "unresponsive for" in lines[0] and lines[0].endswith(f"; killed pid {task.pid} (SIGKILL)"), lines
    assert resilience.hang_kills == lines


def test_a_hung_task_whose_exit_was_recorded_is_reported_once_as_gone(lc: LocalCluster, tmp_path: Path,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    """The watch loop recorded its exit after the check pinged it and before the kill: said so, not killed."""
    task: TaskProcess = lc.start_task("worker", 1, str(tmp_path / "config.json"))
    resilience = Resilience(lc, ResilienceConfig(health=QUICK))
    assert resilience.monitor is not None
    assert task.popen.wait(timeout=30) == 3
    lc.poll()
    assert task.exit_code == 3
    caplog.set_level(logging.INFO, logger="psflow.launch")
    _check_until_reported(resilience.monitor, task.name, task)
    lines = _lines_about(caplog, task.name)
    assert len(lines) == 1, lines
    assert "unresponsive for" in lines[0] and lines[0].endswith(
        f"; pid {task.pid} had already exited (exit status 3): not killed"), lines
    assert resilience.hang_kills == lines


def test_a_monitor_without_a_callback_logs_its_report(lc: LocalCluster, caplog: pytest.LogCaptureFixture) -> None:
    monitor = HealthMonitor(lc.cluster, token=lc.token, config=QUICK)
    caplog.set_level(logging.INFO, logger="psflow.launch")
    _check_until_reported(monitor, "/job:worker/task:0")
    lines = _lines_about(caplog, "/job:worker/task:0")
    assert len(lines) == 1 and "unresponsive for" in lines[0], lines
