"""Failure detection: ping every task with a short deadline; report the silent ones.

:class:`HealthMonitor` sends ``psflow.WorkerService/Ping`` (served by every
task's :class:`~psflow.server.Server`) to every task of a cluster, all in
parallel, every ``interval`` seconds, each with a ``ping_timeout`` deadline.
A task that has not answered for ``unresponsive_after`` seconds is reported
as *unresponsive* ("/job:ps/task:0 unresponsive for 3.1 s (last error:
DEADLINE_EXCEEDED ...)"). A SIGSTOPped or hung process still accepts TCP
connections (the kernel does) but answers nothing, so its pings time out; a
dead one refuses connections.

Detection bound: a task that stops answering at time t is reported by the
first check after ``t + unresponsive_after``, i.e. by
``t + unresponsive_after + interval + ping_timeout`` at the latest.
A task is never reported before it has been unresponsive for
``unresponsive_after`` seconds; a task that never answered yet (still
starting) only after ``start_timeout`` seconds of watching.

Processes, not names: a launcher that restarts tasks names the process it
watches under each task (``check({name: process})``, or the ``tasks``
callable of :meth:`HealthMonitor.start` returning that mapping). A silence is
then one process's: a new process under a name restarts the task's clock (as
:meth:`HealthMonitor.forget` does), and a report carries the process it was
decided for (:attr:`TaskHealth.process`), so what is done about it reaches
that process, never a replacement started after the decision. Being up is
one process's too: :meth:`HealthMonitor.mark_up` names the process that
reported, and a report of a predecessor never makes its replacement, still
starting, one judged after ``unresponsive_after``.

Thread-safety: :meth:`HealthMonitor.check` may run on a background thread
(:meth:`HealthMonitor.start`); :meth:`HealthMonitor.unresponsive` may be read
from any thread. The report handed to ``on_unresponsive`` (and returned by
:meth:`HealthMonitor.check`) is a copy taken as the hang was decided: a
``forget`` before the callback runs changes neither its line nor its process.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

from psflow.cluster import ClusterSpec
from psflow.rpc.api import WORKER_SERVICE, ConnectConfig, RpcError
from psflow.rpc.grpc_client import TaskChannel

__all__ = ["HealthConfig", "TaskHealth", "HealthMonitor"]

log = logging.getLogger("psflow.launch")


#: Seconds between ping rounds while some task has not answered yet (see HealthMonitor._loop).
_STARTUP_INTERVAL = 0.2


@dataclass(frozen=True)
class HealthConfig:
    """Failure-detection timing, seconds.

    Attributes:
        interval: time between two rounds of pings.
        ping_timeout: deadline of one ping; a loaded 2-core machine answers
            in milliseconds, so 1 s leaves a wide margin.
        unresponsive_after: silence after which a task is reported. Shorter
            detects faster but risks reporting a task that is only slow
            (a long GC pause, a huge pull saturating its handler threads).
        start_timeout: silence after which a task that never answered
            (still starting: imports, binding) is reported; at least
            ``unresponsive_after``.
    """

    interval: float = 1.0
    ping_timeout: float = 1.0
    unresponsive_after: float = 10.0
    start_timeout: float = 60.0

    def __post_init__(self) -> None:
        if min(self.interval, self.ping_timeout, self.unresponsive_after, self.start_timeout) <= 0:
            raise ValueError(f"health timings must be positive: {self}")

    @property
    def detection_bound(self) -> float:
        """Seconds from a task's last answer to its report, at most."""
        return self.unresponsive_after + self.interval + self.ping_timeout


@dataclass
class TaskHealth:
    """What the monitor knows about one task."""

    task: str
    address: str
    last_ok: float            # monotonic time of the last answer (or when watching began)
    last_error: str = ""
    answered: bool = False     # answered at least once
    reported: bool = False     # reported as unresponsive (until it answers again)
    report: str = ""           # the report line, once reported
    process: object = None     # the process watched under the task, where the check named it (compared by identity)

    def silent_for(self, now: float) -> float:
        return now - self.last_ok

    def describe(self, now: float) -> str:
        error = f" (last error: {self.last_error})" if self.last_error else ""
        return f"{self.task} at {self.address} unresponsive for {self.silent_for(now):.1f} s{error}"


class HealthMonitor:
    """Pings every task of a cluster and tracks which ones stopped answering."""

    def __init__(self, cluster: ClusterSpec, *, token: str | None, config: HealthConfig | None = None,
                 on_unresponsive: Callable[[TaskHealth, str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Opens (lazily connected) channels to every task; starts no thread.

        Args:
            cluster: the tasks to watch.
            token: the cluster token.
            config: timings.
            on_unresponsive: called once per episode with the task and its
                report line when a task becomes unresponsive. It reports the
                task (says what was done about it): the monitor then logs
                nothing of it itself, so that one hung task is one line. With
                none, the monitor logs the report line (WARNING).
            clock: monotonic seconds.
        """
        self.config = config or HealthConfig()
        self._clock = clock
        self._on_unresponsive = on_unresponsive
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._tasks_fn: Callable[[], Collection[str]] | None = None
        self._connect = ConnectConfig(connect_timeout=self.config.ping_timeout, rpc_timeout=self.config.ping_timeout,
                                      token=token)
        now = clock()
        self._channels: dict[str, TaskChannel] = {}
        self.health: dict[str, TaskHealth] = {}
        for job in cluster.jobs:
            for index in cluster.task_indices(job):
                name, address = f"/job:{job}/task:{index}", cluster.task_address(job, index)
                self._channels[name] = TaskChannel(name, address, WORKER_SERVICE, self._connect)
                self.health[name] = TaskHealth(name, address, now)

    def check(self, tasks: Collection[str] | None = None) -> list[TaskHealth]:
        """One round: pings every task (or only ``tasks``) in parallel; blocks up to ``ping_timeout``.

        Tasks left out of ``tasks`` (e.g. finished ones) are neither pinged
        nor reported, and their clock restarts when they are included again.
        Where ``tasks`` maps each name to the process watched under it, a name
        whose process is not the one watched before has its clock restarted
        (a new process is judged from its own start), and a report names the
        process of this round (:attr:`TaskHealth.process`).

        Returns:
            Copies of the tasks that became unresponsive in this round (``report`` holds the line).
        """
        names = [n for n in self._channels if tasks is None or n in tasks]
        processes: Mapping[str, object] = tasks if isinstance(tasks, Mapping) else {}
        if tasks is not None:
            for name in set(self._channels) - set(names):
                self.forget(name)
        pending = {name: self._channels[name].call_async("Ping", {}, timeout=self.config.ping_timeout) for name in names}
        results: dict[str, str | None] = {}
        for name, call in pending.items():
            try:
                call.result()
                results[name] = None
            except RpcError as e:
                results[name] = str(e).splitlines()[0][:200]
        now, reports = self._clock(), []
        with self._lock:
            for name, error in results.items():
                h = self.health[name]
                process = processes.get(name)
                if process is not None and process is not h.process:
                    if h.process is not None:  # another process than the one watched: judged from now
                        self._restart_clock(h)
                    h.process = process
                if error is None:
                    if h.reported:
                        log.warning("%s answers again after %.1f s", name, h.silent_for(now))
                    h.last_ok, h.last_error, h.answered, h.reported, h.report = now, "", True, False, ""
                    continue
                h.last_error = error
                # A failed channel backs off its reconnects (up to minutes): use a fresh one next round.
                self._channels[name].reconnect()
                limit = self.config.unresponsive_after if h.answered else max(self.config.unresponsive_after,
                                                                               self.config.start_timeout)
                if not h.reported and h.silent_for(now) >= limit:
                    h.reported, h.report = True, h.describe(now)
                    reports.append(dataclasses.replace(h))  # as decided: a forget before the callback changes it not
        for h in reports:
            if self._on_unresponsive is not None:
                self._on_unresponsive(h, h.report)  # reports it, with what was done (see __init__)
            else:
                log.warning("%s", h.report)
        return reports

    def unresponsive(self) -> list[str]:
        """Report lines of every task currently considered unresponsive."""
        now = self._clock()
        with self._lock:
            return [h.describe(now) for h in self.health.values() if h.reported]

    def mark_up(self, reports: Mapping[str, object]) -> None:
        """Records that each task of ``reports`` is serving (e.g. its ``Stats`` answered), as an answered ping
        would: ``reports`` maps the task to the process that answered (compared by identity, as :meth:`check`'s).

        A task that has never answered is judged only after ``start_timeout``; one known to be up is judged after
        ``unresponsive_after``. Up belongs to a process: a report of another process than the one watched under
        the name (a predecessor's, read before its replacement was watched; or a replacement's not watched yet)
        is ignored, so a process still starting is never judged as one that served. Where no process is watched
        yet, the reporting one becomes the watched one (a check naming another then judges that one from its
        own start).
        """
        now = self._clock()
        with self._lock:
            for name, process in reports.items():
                h = self.health.get(name)
                if h is None or h.answered or (h.process is not None and h.process is not process):
                    continue
                h.process, h.last_ok, h.answered = process, now, True

    def forget(self, task: str) -> None:
        """Restarts the clock of ``task`` (e.g. after the launcher restarted it)."""
        with self._lock:
            h = self.health.get(task)
            if h is not None:
                self._restart_clock(h)

    def _restart_clock(self, h: TaskHealth) -> None:
        """(Under the lock) ``h`` as a task never heard from, watched from now."""
        h.last_ok, h.last_error, h.answered, h.reported, h.report = self._clock(), "", False, False, ""

    def start(self, tasks: Callable[[], Collection[str]] | None = None) -> None:
        """Runs :meth:`check` every ``interval`` seconds on a daemon thread until :meth:`stop`.

        Args:
            tasks: called before each round: the tasks to check (default: all), or each mapped to its process
                (see :meth:`check`).
        """
        self._tasks_fn = tasks
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="psflow-health", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            started = self._clock()
            try:
                self.check(self._tasks_fn() if self._tasks_fn is not None else None)
            except Exception:  # noqa: BLE001 - the monitor must outlive a surprise
                log.exception("health check failed")
            # Until every task has answered once, ping more often: a task that is stopped or hangs
            # before its first answer is only judged after start_timeout, so learn early that it is up.
            with self._lock:
                starting = any(not h.answered for h in self.health.values())
            period = min(self.config.interval, _STARTUP_INTERVAL) if starting else self.config.interval
            self._stop.wait(max(0.0, period - (self._clock() - started)))

    def stop(self) -> None:
        """Stops the thread (if any) and closes the channels; idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.config.interval + self.config.ping_timeout + 1)
        for ch in self._channels.values():
            ch.close()

    def __enter__(self) -> HealthMonitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
