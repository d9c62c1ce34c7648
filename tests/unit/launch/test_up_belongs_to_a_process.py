"""A task known to be up is one process's, and a ps member is up only from its own report (task D2).

Before: :meth:`HealthMonitor.mark_up` took task names. A report of a task's process A arriving after A was replaced
by B (restarted under the same name, and watched: a check named B) marked B up: B, still starting, was judged after
``unresponsive_after`` instead of ``start_timeout``, and could be killed as hung while it imported. And the chaos
thread (:meth:`Resilience._chaos_loop`) marked every ps member up whenever one ps task reported a step: a ps task
restarted and starting (or one that never answered) was judged as one that had served. Now ``mark_up`` takes each
task with the process that reported (a report of another process than the one watched is ignored), and the chaos
thread marks up only the members whose own ``Stats`` answered (:attr:`StepReading.answered`), each with the process
that ran under its name when it was asked.

A fake clock and a port nothing listens on (every ping fails) for the monitor; fake ps channels (no sockets) for the
chaos thread, which runs its real loop over them.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from launched_tasks import FakeCluster, FakeTask

import psflow.launch.resilience as resilience_module
from psflow.cluster import ClusterSpec
from psflow.launch.chaos_plan import ChaosPlan
from psflow.launch.fault_recovery import poll_reading
from psflow.launch.health import HealthConfig, HealthMonitor
from psflow.launch.ports import free_ports
from psflow.launch.resilience import Resilience, ResilienceConfig
from psflow.rpc.api import FailedPreconditionError, RpcError
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)

WORKER = "/job:worker/task:0"
PS0, PS1 = "/job:ps/task:0", "/job:ps/task:1"
CONFIG = HealthConfig(interval=1.0, ping_timeout=0.5, unresponsive_after=1.0, start_timeout=10.0)


def _monitor(now: list[float]) -> HealthMonitor:
    (port,) = free_ports(1)  # nothing listens: every ping fails
    return HealthMonitor(ClusterSpec({"worker": [f"127.0.0.1:{port}"]}), token=None, config=CONFIG,
                         on_unresponsive=lambda _report, _line: None, clock=lambda: now[0])


def test_a_replacement_is_not_marked_up_by_its_predecessors_report() -> None:
    """A's report (read before A died) comes after B, its replacement, is watched: B stays a starting process,
    judged after ``start_timeout``."""
    now = [0.0]
    with _monitor(now) as monitor:
        a, b = object(), object()
        assert monitor.check({WORKER: a}) == []
        monitor.forget(WORKER)  # A died; the launcher restarted the task
        now[0] = 0.5
        assert monitor.check({WORKER: b}) == []  # B watched from now
        monitor.mark_up({WORKER: a})  # A's late report
        assert not monitor.health[WORKER].answered
        now[0] = 5.0
        assert monitor.check({WORKER: b}) == []  # before: B reported unresponsive for 4.5 s (after 1 s)
        now[0] = 10.6
        (report,) = monitor.check({WORKER: b})
        assert report.process is b and "unresponsive for 10.1 s" in report.report


def test_a_report_of_the_watched_process_marks_it_up() -> None:
    now = [0.0]
    with _monitor(now) as monitor:
        b = object()
        assert monitor.check({WORKER: b}) == []
        monitor.mark_up({WORKER: b})
        assert monitor.health[WORKER].answered
        now[0] = 1.5
        (report,) = monitor.check({WORKER: b})  # judged after unresponsive_after: it served
        assert report.process is b


def test_a_report_before_any_check_makes_its_process_the_watched_one() -> None:
    """Marked up before a check named a process: that process is the one known up; a check naming another
    judges the other from its own start."""
    now = [0.0]
    with _monitor(now) as monitor:
        a, b = object(), object()
        monitor.mark_up({WORKER: a})
        assert monitor.health[WORKER].answered and monitor.health[WORKER].process is a
        now[0] = 0.5
        assert monitor.check({WORKER: b}) == []
        assert not monitor.health[WORKER].answered
        now[0] = 2.0
        assert monitor.check({WORKER: b}) == []  # a starting process: not judged after 1.5 s


class _Channel:
    """A ps member's channel: answers ``Stats`` with ``meta``, refuses (``refuses``), or is silent (None)."""

    def __init__(self, task: str, meta: dict[str, Any] | None, *, refuses: bool = False) -> None:
        self.task, self.meta, self.refuses, self.calls = task, meta, refuses, 0

    def _answer(self) -> Frame:
        self.calls += 1
        if self.refuses:
            raise FailedPreconditionError(f"{self.task}: Stats: FAILED_PRECONDITION: rebuilding")
        if self.meta is None:
            raise RpcError(f"{self.task}: Stats: UNAVAILABLE: connection refused")
        return Frame(dict(self.meta, task=self.task))

    def call(self, method: str, meta: dict[str, Any] | None = None, **_: Any) -> Frame:
        assert method == "Stats"
        return self._answer()

    def call_async(self, method: str, meta: dict[str, Any] | None = None, **_: Any) -> Any:
        channel = self

        class _Call:
            def result(self) -> Frame:
                return channel._answer()

        return _Call()

    def reconnect(self) -> None:
        pass

    def close(self) -> None:
        pass


def test_the_chaos_thread_marks_up_only_the_ps_member_that_answered(monkeypatch: pytest.MonkeyPatch) -> None:
    """ps task 0 reports step 5; ps task 1 (restarted, starting) answers nothing: only ps task 0's process is up."""
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3"]})
    tasks = [FakeTask("ps", 0, 1 << 30), FakeTask("ps", 1, (1 << 30) + 1), FakeTask("worker", 0, (1 << 30) + 2)]
    channels = {PS0: _Channel(PS0, {"global_step": 5, "ready": True}), PS1: _Channel(PS1, None)}
    monkeypatch.setattr(resilience_module, "TaskChannel", lambda name, address, service, connect: channels[name])
    resilience = Resilience(FakeCluster(cluster, tasks), ResilienceConfig(
        health=CONFIG, chaos=ChaosPlan.parse(["kill:worker:0@step=1000000"])))
    monitor = resilience.monitor
    assert monitor is not None
    loop = threading.Thread(target=resilience._chaos_loop, daemon=True)
    loop.start()
    try:
        deadline = time.monotonic() + 30
        while channels[PS0].calls < 3:
            assert time.monotonic() < deadline, "the chaos thread never polled"
            time.sleep(0.01)
    finally:
        resilience._closed.set()
        loop.join(timeout=30)
        monitor.stop()
    assert not monitor.health[PS1].answered  # before: marked up by ps task 0's step
    assert monitor.health[PS0].answered and monitor.health[PS0].process is tasks[0]


def test_a_replicated_poll_names_the_members_that_answered() -> None:
    """Every member is asked: those that answered (a refusal is an answer: rebuilding, deposed) are named, a
    silent one is not."""
    primary = {"global_step": 7, "ready": True, "replication": {"shard": 0, "primary": PS0,
                                                                  "backups": ["/job:ps_backup/task:0"]}}
    channels = [_Channel(PS0, primary), _Channel("/job:ps_backup/task:0", None, refuses=True),
                _Channel(PS1, None)]
    reading = poll_reading(channels, replicated=True)  # type: ignore[arg-type]
    assert reading is not None and reading.step == 7
    assert reading.answered == frozenset({PS0, "/job:ps_backup/task:0"})


def test_a_plain_poll_names_the_tasks_asked_that_answered() -> None:
    channels = [_Channel(PS0, None), _Channel(PS1, {"global_step": 3, "ready": True})]  # ps task 0 silent
    reading = poll_reading(channels)  # type: ignore[arg-type]
    assert reading is not None and reading.step == 3 and reading.answered == frozenset({PS1})
