"""The live picture of a run: what the status page, ``/metrics`` and ``psflow status`` show.

:class:`StatusCollector` samples a running cluster on its own thread, every
``interval`` seconds (1 s), and keeps the newest *snapshot*, a JSON-ready dict:

``run``             what, where and since when; ``phase`` (starting, training,
                    evaluating, finished, failed, interrupted)
``global_step``, ``examples`` (each record once per epoch, as metrics.json),
``examples_per_sec`` (over the last ``RATE_WINDOW`` seconds; a restore starts the window over),
``loss`` (the cluster's moving average), ``last_step_loss`` (the newest push's loss),
``learning_rate`` (the run's learning rate in force: the next update's, as ps task 0 computes it)
``tasks``           one row per task: host, address, pid, state, last heartbeat,
                    restarts, generation and ``restored_at`` (ps tasks), exit, and
                    ``history`` (deaths and restarts). Once the run is over
                    (:meth:`StatusCollector.finish`) no task shows ``up``: one still
                    running then shows ``finished`` (the run finished) or ``stopped``
``ps``              per ps task: request, byte and apply-time counters and their
                    rates per second over the last sample, ``generation`` and
                    ``restored_at``, and ``busiest`` (:func:`busiest_ps`), so a hot task
                    stands out
``series``          time, global_step, examples/s and loss over the run (at most
                    ``HISTORY`` points; older ones thinned out evenly)
``scalars``         the chief's TensorBoard scalars so far (``train/loss``,
                    ``eval/auc``, ...), read incrementally from the summary directory
``staleness_histogram`` (staleness -> pushes, ps task 0), ``sync`` (the step being
                    collected, over every ps task: who contributed, who it waits for, for how
                    long; ``per_ps``: each task's own part), ``ssp``
``faults``, ``restarts``, ``hangs``  (the launcher's; as metrics.json), ``checkpoints``
                    (the ledger of ps task 0: saved, failed, newest step and path)

Where the numbers come from: every task is pinged (``Ping``: pid, answer =
heartbeat), every ps task is asked for ``Stats``, ps task 0 for
``CheckpointStatus`` when the run checkpoints, all in parallel with a short
deadline; a task that does not answer keeps its last numbers and shows as
unreachable. A launcher adds what only it knows through ``processes`` (pid,
exit, restarts of each task process) and ``events`` (faults, restarts, hangs).
Without a launcher (the chief under ``psflow server``) a task's pid changing
between answers counts as a restart.

Guarantees: sampling never blocks the caller (its own daemon thread; each
round waits at most ``timeout`` per RPC, in parallel); :meth:`snapshot` returns
a consistent copy at any time; the collector reads the cluster and never
changes it. With ``run_dir`` every round also replaces ``run_dir/status.json``
atomically (what ``psflow status RUN_DIR`` reads, also after the run).

At the run's end :meth:`StatusCollector.finish` takes the run's final snapshot
(:mod:`psflow.status.final_snapshot`): from then on every figure it shares with
metrics.json (:data:`FINAL_FIGURES`, the ps rows, the phase) is that snapshot's.
"""

from __future__ import annotations

import collections
import copy
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from psflow import jsonio, storage
from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import BACKUP_JOB
from psflow.rpc.api import PARAMETER_SERVICE, WORKER_SERVICE, ConnectConfig, FailedPreconditionError, RpcError
from psflow.rpc.grpc_client import TaskChannel
from psflow.rpc.tls import TlsConfig
from psflow.status.replication import REPLICATION_FIGURES, replication_entry, replication_view, shard_primaries
from psflow.status.views import ledger_view, mark_busiest, ps_index, restored_at, ssp_view, sync_view

__all__ = ["FINAL_FIGURES", "HISTORY", "ProcessInfo", "StatusCollector", "STATUS_FILE"]

log = logging.getLogger(__name__)

HISTORY = 600            # points kept per time series
RATE_WINDOW = 5.0        # seconds examples/s is measured over
STATUS_FILE = "status.json"
#: The figures a run's final snapshot (metrics.json) gives the collector's last snapshot (:meth:`StatusCollector.finish`).
FINAL_FIGURES = ("global_step", "examples", "resumed_from", "examples_at_start", "examples_this_run", "wall_seconds",
                 "examples_per_sec", "loss", "last_step_loss", "eval", "checkpoints", "faults", "restarts", "hangs",
                 *REPLICATION_FIGURES, "shards", "shards_unread")
_PS_COUNTERS = ("pushes", "pulls", "bytes_in", "bytes_out", "apply_seconds", "rows_pulled", "rows_pushed")
#: States of a task that is (as far as anyone knows) still running; at the run's end they become its end.
_RUNNING_STATES = ("up", "starting", "unresponsive", "unknown", "unreachable")


@dataclass
class ProcessInfo:
    """What a launcher knows about one task's process.

    ``state``: ``running``, ``finished`` (exited 0), ``dead`` (exited otherwise, no
    restart coming), ``restarting`` (dead, a restart is scheduled) or ``stopped``
    (ended by the launcher). ``history``: ``{"time", "event", "detail"}`` per death
    and restart, oldest first (wall-clock seconds).
    """

    pid: int | None
    state: str
    exit: str | None = None
    restarts: int = 0
    history: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class _Task:
    name: str
    job: str
    index: int
    address: str
    channel: TaskChannel
    pid: int | None = None
    last_heartbeat: float | None = None   # wall-clock time of the last answer
    last_error: str = ""
    pid_changes: int = 0                  # restarts seen from outside (no launcher)


class StatusCollector:
    """Samples one cluster; see the module docstring."""

    def __init__(self, cluster: ClusterSpec, *, token: str | None, run: Mapping[str, Any] | None = None,
                 interval: float = 1.0, timeout: float = 1.0, run_dir: str | None = None,
                 summary_dir: str | None = None, checkpoints: bool = False,
                 processes: Callable[[], Mapping[str, ProcessInfo]] | None = None,
                 events: Callable[[], Mapping[str, Any]] | None = None, tls: TlsConfig | None = None) -> None:
        """Opens (lazily connected) channels to every task; starts no thread (:meth:`start`).

        Args:
            cluster: the tasks.
            token: the cluster token.
            run: static facts shown with the run (mode, model, run directory ...).
            interval: seconds between samples.
            timeout: deadline of each RPC of a sample.
            run_dir: where ``status.json`` is kept (None: nowhere).
            summary_dir: the chief's TensorBoard directory, read for ``scalars``.
            checkpoints: ask ps task 0 for its checkpoint ledger.
            processes: (launcher) task name -> :class:`ProcessInfo`.
            events: (launcher) ``faults``, ``restarts``, ``hangs`` as in metrics.json.
            tls: the channels use it (``None``: plain text); ``psflow server``'s chief passes its own.
        """
        self.cluster = cluster
        self.interval = interval
        self._timeout = timeout
        self._run_dir = run_dir
        self._processes = processes
        self._events = events
        self._checkpoints = checkpoints
        self._started_wall = time.time()
        self._started = time.monotonic()
        connect = ConnectConfig(connect_timeout=timeout, rpc_timeout=timeout, token=token, tls=tls)
        self._tasks: list[_Task] = []
        for job in cluster.jobs:
            for index in cluster.task_indices(job):
                name, address = f"/job:{job}/task:{index}", cluster.task_address(job, index)
                self._tasks.append(_Task(name, job, index, address, TaskChannel(name, address, WORKER_SERVICE, connect)))
        self._ps = {t.index: TaskChannel(t.name, t.address, PARAMETER_SERVICE, connect)
                    for t in self._tasks if t.job == "ps"}
        # Replicated shards (a ps_backup job): every member is asked, each shard's primary's answer counts.
        self._backups = {t.name: TaskChannel(t.name, t.address, PARAMETER_SERVICE, connect)
                         for t in self._tasks if t.job == BACKUP_JOB}
        self._primary: dict[int, TaskChannel] = {}  # shard -> the channel of the member last seen as its primary
        self._tail: Any = None
        if summary_dir:
            from psflow.train.summary import ScalarTail

            self._tail = ScalarTail(summary_dir)
        self._scalars: dict[str, list[tuple[int, float]]] = {}
        self._ps_stats: dict[int, dict[str, Any]] = {}
        self._ps_rates: dict[int, dict[str, float]] = {}
        self._prev: dict[int, tuple[float, dict[str, float]]] = {}
        self._examples_window: collections.deque[tuple[float, int]] = collections.deque()
        self._generation: Any = None  # the ps tasks' restore generation at the last sample
        self._rate = 0.0
        self._series: dict[str, list[Any]] = {"time": [], "global_step": [], "examples_per_sec": [], "loss": []}
        self._stride, self._skipped = 1, 0
        self._ledger: dict[str, Any] | None = None
        self._run = {"started": self._started_wall, "phase": "starting", **dict(run or {})}
        self._final: dict[str, Any] | None = None
        self._ended: dict[str, str] = {}  # task -> its state at the run's end, where it was still running
        self._unwritable = False  # the last write of status.json failed (said once: _write)
        self._lock = threading.Lock()
        self._sample_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._snapshot: dict[str, Any] = self._build(time.time())

    # ---- control ----------------------------------------------------------
    def start(self) -> None:
        """Samples every ``interval`` seconds on a daemon thread until :meth:`stop`; idempotent."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="psflow-status", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Stops sampling, writes ``status.json`` a last time and closes the channels; idempotent.
        The last snapshot stays readable."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.interval + 4 * self._timeout + 5)
        with self._sample_lock:  # a round in flight on another thread ends before the channels close
            self._write()
            for t in self._tasks:
                t.channel.close()
            for ch in [*self._ps.values(), *self._backups.values()]:
                ch.close()

    def set_phase(self, phase: str) -> None:
        """Records what the run is doing now (``training``, ``evaluating``, ``finished`` ...)."""
        with self._lock:
            self._run["phase"] = phase
            self._snapshot["run"] = dict(self._run)

    def finish(self, final: Mapping[str, Any]) -> dict[str, Any]:
        """The run's end: every figure the snapshot shares with ``final`` (the run's final snapshot,
        :mod:`psflow.status.final_snapshot`, which metrics.json is) is taken from it, and so are the ps
        rows (its ``ps``) and the phase; later samples no longer change them. Writes ``status.json``
        (with ``run_dir``) and returns the new snapshot. Works on a collector never started."""
        with self._sample_lock:
            now = time.time()
            for stats in final.get("ps") or []:
                index = _shard(stats)
                if index is not None:
                    self._ps_stats[index] = dict(stats)
            with self._lock:
                self._final = {k: final[k] for k in FINAL_FIGURES if k in final}
                self._run["phase"] = str(final.get("phase") or "finished")
            # A task still running now is stopped next (the launcher's shutdown, or its stop after a failure):
            # it shows as the run's end, and so it stays, whatever its process says later.
            ended = "finished" if self._run["phase"] == "finished" else "stopped"
            processes = dict(self._processes()) if self._processes is not None else {}
            for t in self._tasks:
                if self._task_row(t, processes.get(t.name), now)["state"] in _RUNNING_STATES:
                    self._ended[t.name] = ended
            self._poll_summaries()
            return self._publish(now)

    def snapshot(self) -> dict[str, Any]:
        """The newest snapshot (a deep copy: the caller may keep or change it)."""
        with self._lock:
            return copy.deepcopy(self._snapshot)

    # ---- sampling ---------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                self.sample()
            except Exception:  # noqa: BLE001 - the page must outlive a surprise; the run goes on
                log.exception("status: a sample failed")
            self._stop.wait(max(0.05, self.interval - (time.monotonic() - began)))

    def sample(self) -> dict[str, Any]:
        """One round (blocks up to about ``timeout``); returns the new snapshot."""
        with self._sample_lock:
            if self._final is None:
                self._ping_all()
                self._read_ps()
            self._poll_summaries()
            return self._publish(time.time())

    def _ping_all(self) -> None:
        calls = {t.name: t.channel.call_async("Ping", {}, timeout=self._timeout) for t in self._tasks}
        now = time.time()
        for t in self._tasks:
            try:
                meta = calls[t.name].result().meta
            except RpcError as e:
                t.last_error = str(e).splitlines()[0][:200]
                t.channel.reconnect()  # a failed channel backs off its reconnects: a fresh one next round
                continue
            pid = meta.get("pid")
            if isinstance(pid, int):
                if t.pid is not None and pid != t.pid:
                    t.pid_changes += 1
                t.pid = pid
            t.last_heartbeat, t.last_error = now, ""

    def _read_ps(self) -> None:
        if self._backups:
            self._read_members()
        else:
            calls: dict[int, Any] = {i: ch.call_async("Stats", {}, timeout=self._timeout) for i, ch in self._ps.items()}
            for index, call in calls.items():
                try:
                    self._ps_stats[index] = dict(call.result().meta)
                except RpcError:
                    self._ps[index].reconnect()
        step_task = self._step_task()
        if self._checkpoints and step_task is not None:
            try:
                channel = self._primary.get(step_task) or self._ps[step_task]
                self._ledger = dict(channel.call("CheckpointStatus", {}, timeout=self._timeout).meta)
            except RpcError:
                pass

    def _read_members(self) -> None:
        """Replicated shards: ``Stats`` of every member; per shard, its primary's (a shard none answered for
        keeps its last numbers). A member without the shard's state refuses (it shows as joining in its
        primary's figures, :mod:`psflow.status.replication`); only a channel whose call got no answer is replaced."""
        channels = {ch.task: ch for ch in [*self._ps.values(), *self._backups.values()]}
        calls = {name: ch.call_async("Stats", {}, timeout=self._timeout) for name, ch in channels.items()}
        answers = []
        for name, call in calls.items():
            try:
                answers.append(dict(call.result().meta))
            except FailedPreconditionError:
                pass  # a member without the shard's state (rebuilding, deposed) refused: up, its channel kept
            except RpcError:
                channels[name].reconnect()
        for stats in shard_primaries(answers):
            shard = _shard(stats)
            if shard is not None:
                self._ps_stats[shard] = stats
                if str(stats.get("task")) in channels:
                    self._primary[shard] = channels[str(stats.get("task"))]

    def _poll_summaries(self) -> None:
        if self._tail is None:
            return
        try:
            new = self._tail.poll()
        except OSError as e:
            log.debug("status: summaries unreadable: %s", e)
            return
        for tag, points in new.items():
            merged = dict(self._scalars.get(tag, []))
            merged.update(points)
            series = sorted(merged.items())
            self._scalars[tag] = series[-HISTORY:]

    def _step_task(self) -> int | None:
        for index, stats in sorted(self._ps_stats.items()):
            if stats.get("global_step") is not None:
                return index
        return None

    # ---- the snapshot -----------------------------------------------------
    def _publish(self, now: float) -> dict[str, Any]:
        self._update_rates(now)
        snapshot = self._build(now)
        with self._lock:
            self._snapshot = snapshot
        self._write()
        return snapshot

    def _update_rates(self, now: float) -> None:
        mono = time.monotonic()
        for index, stats in self._ps_stats.items():
            counters = {k: float(stats.get(k) or 0) for k in _PS_COUNTERS}
            prev = self._prev.get(index)
            if prev is not None and mono - prev[0] > 0.2:
                dt = mono - prev[0]
                self._ps_rates[index] = {f"{k}_per_sec": max(0.0, (counters[k] - prev[1][k]) / dt) for k in counters}
                self._prev[index] = (mono, counters)
            elif prev is None:
                self._prev[index] = (mono, counters)
        step_task = self._step_task()
        if step_task is None or self._final is not None:
            return
        stats = self._ps_stats[step_task]
        examples = int(stats.get("examples") or 0)
        generation = stats.get("generation")
        window = self._examples_window
        if window and (examples < window[-1][1] or generation != self._generation):
            window.clear()  # a restore set the count back (or to the checkpoint's, from 0): start the window over
            self._rate = 0.0
        self._generation = generation
        window.append((mono, examples))
        while len(window) > 2 and mono - window[1][0] >= RATE_WINDOW:
            window.popleft()
        if len(window) > 1 and window[-1][0] - window[0][0] > 0.2:
            self._rate = (window[-1][1] - window[0][1]) / (window[-1][0] - window[0][0])
        self._append_series(mono - self._started, stats.get("global_step"), self._rate, stats.get("loss_ema"))

    def _append_series(self, t: float, step: Any, rate: float, loss: Any) -> None:
        """Keeps at most HISTORY points: when full, every other point goes and only every
        ``stride``-th sample is kept from then on, so the series always spans the whole run."""
        self._skipped += 1
        if self._skipped < self._stride:
            return
        self._skipped = 0
        s = self._series
        for key, value in (("time", round(t, 2)), ("global_step", step), ("examples_per_sec", round(rate, 1)),
                           ("loss", loss)):
            s[key].append(value)
        if len(s["time"]) >= HISTORY:
            for key in s:
                s[key] = s[key][::2]
            self._stride *= 2

    def _build(self, now: float) -> dict[str, Any]:
        step_task = self._step_task()
        head = self._ps_stats.get(step_task, {}) if step_task is not None else {}
        final = self._final or {}
        processes = dict(self._processes()) if self._processes is not None else {}
        events = dict(self._events()) if self._events is not None else {}
        snapshot: dict[str, Any] = {
            "time": now,
            "run": {**self._run, "elapsed": time.monotonic() - self._started},
            "global_step": head.get("global_step"),
            "examples": head.get("examples"),
            "examples_per_sec": self._rate,
            "loss": head.get("loss_ema"),
            "last_step_loss": head.get("last_loss"),
            "learning_rate": head.get("learning_rate"),
            "eval": None,
            "tasks": [self._task_row(t, processes.get(t.name), now) for t in self._tasks],
            "ps": mark_busiest([self._ps_row(i) for i in sorted(self._ps_stats)]),
            "series": {k: list(v) for k, v in self._series.items()},
            "scalars": {tag: [list(p) for p in points] for tag, points in sorted(self._scalars.items())},
            "staleness_histogram": dict(head.get("staleness_histogram") or {}),
            "sync": sync_view(head, [self._ps_stats[i] for i in sorted(self._ps_stats)]),
            "ssp": ssp_view(head),
            "faults": list(events.get("faults", [])),
            "restarts": list(events.get("restarts", [])),
            "hangs": list(events.get("hangs", [])),
            "checkpoints": ledger_view(self._ledger),
        }
        replication = replication_view([self._ps_stats[i] for i in sorted(self._ps_stats)])
        if replication is not None:  # acknowledged, applied and lost pushes; per shard its primary, backups' lag
            snapshot.update({k: replication[k] for k in REPLICATION_FIGURES})
            snapshot["shards"] = replication["shards"]
        snapshot.update(final)  # the run's end: its final snapshot's figures, those of metrics.json
        return snapshot

    def _task_row(self, t: _Task, process: ProcessInfo | None, now: float) -> dict[str, Any]:
        answered_recently = t.last_heartbeat is not None and now - t.last_heartbeat <= max(3 * self.interval, 3.0)
        if process is not None:
            state = process.state
            if state == "running":
                state = "up" if answered_recently else ("starting" if t.last_heartbeat is None else "unresponsive")
            pid, restarts, history, exit_ = process.pid, process.restarts, process.history, process.exit
        else:
            state = "up" if answered_recently else ("unknown" if t.last_heartbeat is None else "unreachable")
            pid, restarts, history, exit_ = t.pid, t.pid_changes, [], None
        state = self._ended.get(t.name, state)
        generation = self._ps_stats.get(t.index, {}).get("generation") if t.job == "ps" else None
        return {
            "task": t.name, "job": t.job, "index": t.index, "address": t.address,
            "host": t.address.rsplit(":", 1)[0], "pid": pid, "state": state, "exit": exit_,
            "last_heartbeat": t.last_heartbeat,
            "heartbeat_age": None if t.last_heartbeat is None else round(now - t.last_heartbeat, 2),
            "restarts": restarts, "generation": generation, "restored_at": restored_at(generation),
            "last_error": t.last_error or None, "history": list(history),
        }

    def _ps_row(self, index: int) -> dict[str, Any]:
        stats = self._ps_stats[index]
        row: dict[str, Any] = {"task": stats.get("task", f"/job:ps/task:{index}"), "index": index}
        row.update({k: stats.get(k) for k in _PS_COUNTERS})
        row["parameter_bytes"] = stats.get("parameter_bytes")
        if stats.get("dynamic_tables"):
            row["dynamic_tables"] = stats["dynamic_tables"]
        row["generation"] = stats.get("generation")
        row["restored_at"] = restored_at(row["generation"])
        row["holds_global_step"] = stats.get("global_step") is not None
        row["rates"] = dict(self._ps_rates.get(index, {}))
        return row

    def _write(self) -> None:
        if self._run_dir is None:
            return
        path = os.path.join(self._run_dir, STATUS_FILE)
        try:
            with self._lock:
                snapshot = self._snapshot
            storage.write_atomically(path, jsonio.dumps(snapshot).encode(), durable=False)
        except (OSError, ValueError, TypeError) as e:  # a value JSON cannot hold is said as a disk's refusal is
            if self._unwritable:  # said once while the writes fail (one per sample): the file stays as it was
                log.debug("status: could not write %s: %s", path, e)
            else:
                log.warning("status: could not write %s: %s; it is not updated until a write succeeds", path, e)
            self._unwritable = True
        else:
            self._unwritable = False

    # ---- context manager --------------------------------------------------
    def __enter__(self) -> StatusCollector:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _shard(stats: Mapping[str, Any]) -> int | None:
    """The shard a ps member's ``Stats`` speak for: its ``replication`` entry's, else its ps task index."""
    entry = replication_entry(stats)
    shard = entry.get("shard") if entry is not None else None
    return shard if isinstance(shard, int) and not isinstance(shard, bool) else ps_index(stats)
