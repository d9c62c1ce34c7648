"""How one local run ends: its final snapshot, taken once, and everything of its end written from it.

``run_local`` holds a :class:`RunEnd` for the run. Whichever way the run ends,
the end is one final snapshot (:func:`psflow.status.final_snapshot.final_snapshot`)
from which ``metrics.json``, ``status.json``, ``metrics.prom``
(:func:`psflow.launch.run_status.write_run_files`) and the console's last lines
are written, so they agree on every figure they share:

1. *finished* (:meth:`RunEnd.finished`): every driver task exited 0 (the chief
   wrote its final checkpoint) and the launcher evaluated the model; it passes
   the ps tasks' ``Stats`` read after the evaluation, the eval and the workers'
   results; the ledger is polled a last time. The caller prints the last line
   from the returned snapshot.
2. *failed* (a task failed, ``--max-failed-saves`` included): :meth:`RunEnd.capture`
   while the ps tasks still run (their ``Stats`` and the ledger, 1 s deadline
   each), then the tasks are stopped, then :meth:`RunEnd.failed` with the report.
3. *interrupted* (SIGTERM, SIGHUP, SIGINT): :meth:`RunEnd.interrupted` captures,
   stops every task, writes, and returns the report for the user.

With ``--ps-replicas`` each shard is read from its primary, else from a member that answers; a shard none
answered for is named in ``shards_unread`` and the run's replication totals are then None (:func:`with_unread_shards`).

A snapshot is written once (the first of these wins), its files with signals deferred (a signal while they are
written is raised once they are: *after the end*, reported as such, the exit status the end's own; a second one cuts
the writing, a stuck disk's, and the end is then the interrupted one, whose writing the next signal cuts too: then no
end is written, and the report says so); a file that cannot be
written is said on the console (and, for a finished run's metrics.json, raised: :class:`EndNotWritten`, exit 1),
never hidden. metrics.json is the run's end: an end whose metrics.json could not be written is not written: it stays
the run's end (taken once, not written again), but no signal after it says that it stands (:func:`after_the_end` names
the file and its error), and a finished or failed run's then failed: exit status 1, a later signal's too
(``LauncherSignals.unwritten``). Where only metrics.prom (a scrape file: its error said) or status.json (the live
page's file) could not be, the end is written: a later signal leaves it standing, its exit status the end's own.
Not thread-safe: the launcher's main thread calls it.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from psflow.checkpoint.ledger import SaveStatusWatcher
from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import BACKUP_JOB, PS_JOB, shard_members
from psflow.launch.launcher_signals import EndNotWritten
from psflow.launch.lifeline import LaunchInterrupted, signal_name
from psflow.launch.run_status import METRICS_JSON, LauncherStatus, write_run_files
from psflow.launch.supervisor import describe_exit
from psflow.rpc.api import PARAMETER_SERVICE, ConnectConfig, RpcError
from psflow.rpc.grpc_client import TaskChannel
from psflow.status.final_snapshot import Resumed, final_snapshot, newest_if_unnamed, step_task_stats
from psflow.status.replication import REPLICATION_FIGURES, ps_members, replication_entry, shard_primaries

__all__ = ["RunEnd", "after_the_end", "interrupted_kept", "with_unread_shards"]

log = logging.getLogger("psflow.launch")

_READ_TIMEOUT = 1.0  # seconds each RPC of a capture may take: the run is ending, a silent task is not waited for


class RunEnd:
    """The end of one local run (``lc``: a :class:`~psflow.launch.processes.LocalCluster`); see the module docstring.

    Args:
        lc: the run's processes.
        output_dir: the run directory.
        started: the run's start (``time.monotonic()``).
        checkpoints: the launcher's view of the checkpoint ledger (None: the run has no checkpoint directory).
        resumed: the checkpoint the run resumed (:func:`psflow.status.final_snapshot.resumed_from`).
        checkpoint_dir: the run's (``--checkpoint-dir``): where a ledger that names no save has its newest read.
        page: the run's status page, whose collector writes status.json and metrics.prom (None: only metrics.json).
        run: fields every snapshot of this run carries (mode, replication).
        out: where console lines go (failed saves seen at the end, files not written).
        says_kept: an interrupted run's report says what it kept (:func:`interrupted_kept`: ``checkpoint_dir`` is the
            run's own, None where it has none); off where the caller does not know it.
    """

    def __init__(self, lc: Any, output_dir: str, *, started: float, checkpoints: SaveStatusWatcher | None = None,
                 resumed: Resumed | None = None, checkpoint_dir: str | None = None, page: LauncherStatus | None = None,
                 run: Mapping[str, Any] | None = None, out: TextIO | None = None, says_kept: bool = False) -> None:
        self.lc, self.output_dir, self.started = lc, output_dir, started
        self.says_kept = says_kept
        self.checkpoints, self.resumed, self.page = checkpoints, resumed, page
        self.checkpoint_dir = checkpoint_dir
        self.run = dict(run or {})
        self.out = out
        self.snapshot: dict[str, Any] | None = None  # the final snapshot, once written (or its writing failed)
        self.unwritten: dict[str, str] = {}  # the snapshot's files that could not be written: file name -> error
        self._cut = False  # a signal cut the writing of an end: the run directory may not answer (a stuck mount)
        self._captured: tuple[list[dict[str, Any]], float, set[int]] | None = None  # ps Stats, seconds, running

    # ---- the three ways to end -----------------------------------------------------------------
    def finished(self, *, ps_stats: list[dict[str, Any]], train_seconds: float,
                 evaluation: Mapping[str, Any] | None, extra: Mapping[str, Any], client: Any,
                 ledger_gone: bool = False) -> dict[str, Any]:
        """A finished run's snapshot, written; returned (the caller prints the last line from it).
        ``ledger_gone``: the ps task holding the ledger exited (not restarted): the watch's last reading stands,
        its task not waited for.

        Raises:
            EndNotWritten: metrics.json could not be written (the other files' failures are console lines).
        """
        if self.checkpoints is not None and not ledger_gone:
            self._say(self.checkpoints.poll(client, force=True))  # after the final checkpoint
        final = self._snapshot("finished", ps_stats, train_seconds, extra, evaluation)
        failed = self._write(final)
        if METRICS_JSON in failed:
            raise EndNotWritten(final, failed[METRICS_JSON])
        return final

    def capture(self) -> tuple[list[dict[str, Any]], float, set[int]]:
        """Reads what a run that did not finish ends with, while its tasks still run: each ps task's
        ``Stats`` and the checkpoint ledger (``_READ_TIMEOUT`` each, in parallel), the time, which tasks
        run. Blocks ~1 s at most. Idempotent: the first capture is the one kept (and returned)."""
        if self._captured is None:
            running = {id(t) for t in self.lc.tasks if t.popen.poll() is None}
            self._captured = (self._read_ps(), time.monotonic() - self.started, running)
        return self._captured

    def failed(self, error: str) -> dict[str, Any]:
        """A failed run's snapshot (``error``: the failure report), written once its tasks were stopped
        (captured before, where the caller could); returned. Never raises for a file not written."""
        if self.snapshot is not None:
            return self.snapshot
        return self._end("failed", {"error": error, "exit_code": 1})

    def interrupted(self, signum: int) -> str:
        """After ``signum`` reached the launcher: captures, stops every task, writes the snapshot and
        returns the report for the user. Blocks ~4 s at most (1 s reading, 3 s stopping).

        A signal that arrives after the run's end was written (a finished run's metrics.json, before the
        launcher defers signals for its shutdown; a failed run's, while it closes its client and page) stops
        every task still running and writes nothing: that end stands, and the report says so (with a failed
        run's error, which the user reads nowhere else: the signal replaced the failure's exception)."""
        if self.snapshot is not None:
            self.lc.stop_all()
            return self._after_the_end(signum, self.snapshot)
        self.capture()  # before the ps tasks go
        self.lc.stop_all()
        twice = self._cut
        try:
            final = self._end("interrupted", {"interrupted": signal_name(signum), "exit_code": 128 + signum})
        except LaunchInterrupted:  # its writing cut (_write): the directory does not answer
            return self._not_written(signum, twice)
        lines = [f"interrupted by {signal_name(signum)} {at_global_step(final.get('global_step'))} after "
                 f"{final['wall_seconds']:.1f} s; every task stopped:"]
        lines += [f"  {t['task']} (pid {t['pid']}) {t['exit']}" for t in final["tasks"]]
        if self.says_kept:
            lines.append(interrupted_kept(final, self.checkpoint_dir))
        lines.append(self.unwritten.get(METRICS_JSON, f"metrics: {self.output_dir}/{METRICS_JSON}"))
        resilience = self.lc.resilience
        return "\n".join(lines) + (resilience.on_failure() if resilience is not None else "")

    def _not_written(self, signum: int, twice: bool) -> str:
        """The report of an interrupted run whose end could not be written: a signal cut its writing (``twice``: a
        finished or failed end's before)."""
        ps_stats, seconds, _ = self.capture()
        step = (step_task_stats(ps_stats) or {}).get("global_step")
        lines = [f"interrupted by {signal_name(signum)} {at_global_step(step)}"
                 f" after {seconds:.1f} s; its end was not written: a signal cut the writing of {self.output_dir}'s "
                 f"files{' twice' if twice else ''} (does its disk answer?); every task stopped:"]
        lines += [f"  {t.name} (pid {t.pid}) {describe_exit(t.popen.returncode or 0)}" for t in self.lc.tasks]
        return "\n".join(lines)

    def _after_the_end(self, signum: int, final: Mapping[str, Any]) -> str:
        return after_the_end(signum, final, self.output_dir, "; every task stopped", self.unwritten)

    # ---- the snapshot --------------------------------------------------------------------------
    def _end(self, phase: str, extra: dict[str, Any]) -> dict[str, Any]:
        ps_stats, seconds, running = self.capture()
        extra["tasks"] = [{"task": t.name, "pid": t.pid, "exit": describe_exit(t.popen.returncode or 0),
                           "stopped_by_launcher": id(t) in running} for t in self.lc.tasks]
        final = self._snapshot(phase, ps_stats, seconds, extra)
        self._write(final)
        return final

    def _snapshot(self, phase: str, ps_stats: list[dict[str, Any]], seconds: float, extra: Mapping[str, Any],
                  evaluation: Mapping[str, Any] | None = None) -> dict[str, Any]:
        resilience = self.lc.resilience
        if resilience is not None:  # a fault that recovered after the chaos thread's last poll counts
            resilience.settle(ps_stats)
        ledger = self.checkpoints.ledger() if self.checkpoints is not None else None
        snapshot = final_snapshot(phase=phase, ps_stats=ps_stats, wall_seconds=seconds, resumed=self.resumed,
                                  checkpoints=ledger, newest=newest_if_unnamed(ledger, self.checkpoint_dir),
                                  events=resilience.metrics() if resilience is not None else None,
                                  evaluation=evaluation, extra={**self.run, **extra})
        return with_unread_shards(snapshot, ps_stats)

    def _write(self, final: dict[str, Any]) -> dict[str, str]:
        # It is this run's end from the moment snapshot is set, and interrupted() then writes nothing; a signal cuts
        # the writing as LauncherSignals.writing_end says: cut, it is no end, and interrupted() writes its own.
        signals = self.lc.signals
        with signals.writing_end(self.output_dir, cut_before=self._cut):
            self.snapshot = final
            try:
                failed = write_run_files(final, self.output_dir,
                                         self.page.collector if self.page is not None else None)
            except LaunchInterrupted:
                self.snapshot, self._cut = None, True
                raise
            self.unwritten = failed
            signals.end_written(final, failed.get(METRICS_JSON))  # (status.json, metrics.prom alone: said, written)
        # A finished run's metrics.json: raised (finished), the one line main prints.
        self._say(f"psflow: {line}" for name, line in failed.items()
                  if name != METRICS_JSON or final.get("phase") != "finished")
        return failed

    def _read_ps(self) -> list[dict[str, Any]]:
        """Each answering ps task's ``Stats`` (with ``--ps-replicas``: every member's, each shard's primary's
        kept, :func:`~psflow.status.replication.shard_primaries`), then (with checkpoints) the ledger of the one
        holding global_step, fed to the watcher (its failure lines printed)."""
        channels = self._channels(_READ_TIMEOUT)
        try:
            stats = _shard_stats(channels, _READ_TIMEOUT, self.lc.cluster)
            head = step_task_stats(stats)
            if self.checkpoints is not None and head is not None:
                try:
                    ledger = channels[str(head.get("task"))].call("CheckpointStatus", {}, timeout=_READ_TIMEOUT).meta
                    self._say(self.checkpoints.update(ledger))
                except (RpcError, KeyError, ValueError) as e:
                    log.debug("no checkpoint ledger for the final snapshot: %s", e)
            return stats
        finally:
            for ch in channels.values():
                ch.close()

    def read_shards(self, timeout: float, gone: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
        """(A finished run with ``--ps-replicas``) each shard's primary's ``Stats``, asked of every member in
        parallel (``timeout`` s each): a shard whose primary is silent, from the member that answers (its own
        role and view: :func:`~psflow.status.replication.shard_primaries`); a shard no member answered for, as
        an unread stand-in (:func:`_unread`); ``gone``: the shards whose every member exited
        (:func:`~psflow.launch.final_model.gone_after_training`): their stand-ins say how."""
        channels = self._channels(timeout)
        try:
            return _shard_stats(channels, timeout, self.lc.cluster, gone=gone)
        finally:
            for ch in channels.values():
                ch.close()

    def _channels(self, timeout: float) -> dict[str, TaskChannel]:
        connect = ConnectConfig(connect_timeout=timeout, rpc_timeout=timeout, token=self.lc.token)
        return {name: TaskChannel(name, address, PARAMETER_SERVICE, connect)
                for name, address in ps_members(self.lc.cluster)}

    def _say(self, lines: Any) -> None:
        for line in lines:
            print(line, file=self.out or sys.stderr, flush=True)


def _shard_stats(channels: Mapping[str, TaskChannel], timeout: float, cluster: ClusterSpec, *,
                 gone: Mapping[str, Mapping[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Each answering member's ``Stats``; with more members than ps tasks (replicated shards), each shard's
    primary's (:func:`~psflow.status.replication.shard_primaries`), then a stand-in for each shard no member
    answered for (:func:`_unread`): never left out, so the end names it unread (``shards_unread``) rather than
    summing its figures as 0. ``gone``: stand-ins of shards whose every member exited, by the shard's ps task."""
    calls = {name: ch.call_async("Stats", {}, timeout=timeout) for name, ch in channels.items()}
    stats: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    for name, call in calls.items():
        try:
            stats.append(dict(call.result().meta))
        except RpcError as e:
            errors[name] = str(e)
            log.debug("%s: no Stats for the final snapshot: %s", name, e)
    if BACKUP_JOB not in cluster.jobs:
        return stats
    primaries = shard_primaries(stats)
    read = {entry.get("shard") for reply in primaries if (entry := replication_entry(reply)) is not None}
    return primaries + [_unread(k, shard_members(cluster, k), errors, (gone or {}).get(f"/job:{PS_JOB}/task:{k}"))
                        for k in cluster.task_indices(PS_JOB) if k not in read]


def _unread(shard: int, members: Sequence[str], errors: Mapping[str, str],
            gone: Mapping[str, Any] | None) -> dict[str, Any]:
    """The stand-in of replicated ``shard``, none of whose ``members`` answered ``Stats`` with its state
    (``errors``: each failed call's): named by its ps task, not ready (a finished run's model is then its final
    checkpoint's: :mod:`psflow.launch.final_model`), ``unread_shard`` its index, ``error`` why (``gone``'s where
    every member exited, then ``exited``)."""
    if gone is not None:
        return {**gone, "unread_shard": shard}
    why = "; ".join(f"{name}: {errors.get(name, 'no shard state in its answer')}" for name in members)
    return {"task": f"/job:{PS_JOB}/task:{shard}", "ready": False, "unread_shard": shard,
            "error": f"no member of shard {shard} answered Stats ({why})"}


def with_unread_shards(snapshot: dict[str, Any], ps_stats: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``snapshot`` where a replicated shard was not read (``ps_stats`` holds its stand-in: no member answered,
    :func:`_unread`): ``shards_unread`` names each (``shard``, ``task``, ``error``) and the run's replication
    totals (``pushes_acknowledged``, ``pushes_applied``, ``updates_lost``) are None, not known: summed over the
    shards read they would count the unread one's as 0, its lost updates included. ``shards`` keeps the shards
    read. Else ``snapshot`` unchanged."""
    unread = [{"shard": s["unread_shard"], "task": s.get("task"), "error": s.get("error")}
              for s in ps_stats if s.get("unread_shard") is not None]
    if unread:
        snapshot.update(dict.fromkeys(REPLICATION_FIGURES), shards_unread=unread)
        snapshot.setdefault("shards", [])
    return snapshot


def at_global_step(step: Any) -> str:
    """``at global_step S`` of a run's report; where none was read (its ps tasks not answering yet, or the variables
    not created yet: the step task holds none), that none was: a report never says ``global_step None``."""
    return f"at global_step {step}" if step is not None else "with no global_step read (no ps task had answered one)"


def after_the_end(signum: int, final: Mapping[str, Any], output_dir: str, stopped: str = "",
                  unwritten: Mapping[str, str] | None = None) -> str:
    """The report of ``signum`` that reached the launcher after the run's end ``final`` was written (a cluster run's
    :meth:`RunEnd.interrupted`, an ``--in-process`` run's): that end stands; a failed run's error follows (the
    signal replaced the failure's exception, so the user reads it nowhere else). ``stopped``: said after it.
    ``unwritten``: the end's files that could not be written (file name -> error), each error said; where
    metrics.json is one, the end does not stand (its error in place of its path)."""
    phase = {"interrupted": "been interrupted"}.get(str(final.get("phase")), str(final.get("phase")))
    stands = "its end was not written whole" if METRICS_JSON in (unwritten or {}) else "its end stands"
    lines = [f"{signal_name(signum)} arrived after the run had {phase} {at_global_step(final.get('global_step'))}: "
             f"{stands}{stopped}"]
    if final.get("error"):
        lines += [f"  {line}" for line in str(final["error"]).splitlines()]
    lines += [f"  {line}" for line in (unwritten or {}).values()]
    if METRICS_JSON not in (unwritten or {}):
        lines.append(f"metrics: {output_dir}/{METRICS_JSON}")
    return "\n".join(lines)


def interrupted_kept(final: Mapping[str, Any], checkpoint_dir: str | None) -> str:
    """The line of an interrupted run's report (its end ``final``) saying what it leaves: not finished nor evaluated,
    and what a run after it starts from: the newest checkpoint in ``checkpoint_dir`` (its ledger's, else the newest
    there: ``final["checkpoints"]``), none there, or nothing kept (no checkpoint directory)."""
    saved = final.get("checkpoints")
    if not checkpoint_dir:
        kept = "nothing of its training is kept (no --checkpoint-dir)"
    elif not isinstance(saved, Mapping):  # the ledger was not read (its ps task silent): none is named
        kept = f"its checkpoints were not read: a run with --checkpoint-dir {checkpoint_dir} resumes from the newest there"
    elif saved.get("last_saved_path"):
        kept = (f"the newest checkpoint is {saved['last_saved_path']} (global_step {saved.get('last_saved_step')}): "
                f"a run with --checkpoint-dir {checkpoint_dir} resumes there")
    else:
        kept = f"no checkpoint is in {checkpoint_dir}: a run there starts from the beginning"
    return f"not finished, not evaluated: {kept}"
