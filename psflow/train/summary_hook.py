"""The chief's TensorBoard summaries hook (:class:`SummarySaverHook`): loss, rates and per-ps request/byte rates
every N global steps, and a SessionLog START where the model it trains on was restored (at its join, or within
its session). Exported from :mod:`psflow.train.hooks` with the other built-in hooks; the writer and the tags are
:mod:`psflow.train.summary`'s.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import restore_record
from psflow.rpc.api import RpcError
from psflow.train.hook_api import RunContext, RunValues, SessionRunHook, StepTimer, end_step
from psflow.train.summary import REQUEST_COUNTERS, SummaryWriter, ps_restarted, set_back, start_written

if TYPE_CHECKING:
    from psflow.train.session import MonitoredTrainingSession

__all__ = ["SummarySaverHook"]

log = logging.getLogger("psflow.hooks")


def _global_step_of(checkpoint: str) -> int | None:
    try:
        return read_manifest(checkpoint).global_step
    except CheckpointError:  # deleted since (rotation)
        return None


def _generation(client: ParameterClient, snapshot: dict[int, dict[str, Any]]) -> int | None:
    """The generation of the cluster's last restore (0: none within the run): ps task 0's where it is ready; where
    its ``Stats`` could not be read or it is not ready, the one every other task read is ready at (a restore makes
    every task ready at its generation, ps task 0 last); None where not known.

    A ps task 0 not ready says nothing of it: restarted and not loaded yet (generation 0, as a cluster never
    restored), or in a restore (the new generation: its ``BeginRestore`` came, its loads and ``SetReady`` not yet)."""
    head = snapshot.get(client.step_task)
    if head is not None and head.get("ready"):
        generation = head.get("generation")
        return generation if isinstance(generation, int) else None
    ready = {s.get("generation") for task, s in snapshot.items() if s.get("ready") and task != client.step_task}
    generation = ready.pop() if len(ready) == 1 else None
    return generation if isinstance(generation, int) else None


def _restore_mark(client: ParameterClient, snapshot: dict[int, dict[str, Any]]) -> str | None:
    """What the START of the cluster's last restore within the run says (its ``msg``): its generation (a restore's
    wall clock in ms: unique); None before any (generation 0: a fresh or resumed cluster), or unknown."""
    generation = _generation(client, snapshot)
    return _mark_of(generation)


def _mark_of(generation: int | None) -> str | None:
    return f"psflow restore at generation {generation}" if generation else None


def _restored_from(client: ParameterClient, snapshot: dict[int, dict[str, Any]]) -> tuple[str | None, int] | None:
    """(checkpoint, its global_step) the cluster's last restore loaded, as the ps tasks at its generation name it
    (each task's ``LoadShard`` told it: :mod:`psflow.ps.restore_gate`), ps task 0 first; None where none does (ps
    tasks too old to say, or none read)."""
    generation = _generation(client, snapshot)
    for _, stats in sorted(snapshot.items(), key=lambda item: item[0] != client.step_task):
        record = restore_record(stats) if stats.get("generation") == generation else None
        if record is not None:
            return record
    return None


class SummarySaverHook(SessionRunHook):
    """Writes loss, rates and per-ps request/byte rates every N global steps (default 100), and at the end.

    Chief only. See :mod:`psflow.train.summary` for the tags. A rate is never made up across a break: an
    interval in which a ps task restarted (its counters start again from zero) has no rates for that task, and
    one in which the cluster was restored from a checkpoint (examples and global_step set back) no
    ``train/examples_per_sec`` or ``train/global_step_per_sec``, as the console's progress line has none.
    A session that restored a checkpoint when it joined first writes a SessionLog START, as TF's chief does
    (:meth:`~psflow.train.summary.SummaryWriter.session_start`: TensorBoard drops older steps past that one); so does
    a chief whose join left the restore to the lease holder (``JoinResult.restore_pending``: restored None, step 0,
    the model not restored yet), before its first step, once that restore ended: at the step of the checkpoint that
    holder restored; and so does the chief after a restore within its session
    (:meth:`after_restore`, from :class:`~psflow.train.recovery.ClusterRecovery`), before its next step. Each
    START is at the checkpoint's step, also where global_step went on past the steps lost (the journal's, or ps
    task 0 kept it): TensorBoard then drops the lost steps' points, which described a model no longer trained.
    The restored checkpoint and its step are the ps tasks' (their ``Stats``: what the restore of their generation
    loaded), not the newest checkpoint in the directory, which any save since the restore moved past them (a START
    there dropped none of the lost steps' points): the START's step does not depend on whether the checkpoint saver
    ran first. Only ps tasks too old to name it leave the newest checkpoint's step, read when the START is written.

    One START per restore within the run, by the first worker to hold the duties after it, before any point: it
    names the restore's generation (``msg``; ps task 0's, or, where its ``Stats`` cannot be read, the one every other
    task is ready at), and a worker taking the duties (:meth:`after_create_session`) writes
    it where the directory holds none (no worker held them as the cluster settled: their holder was the task lost,
    or its lease lapsed; or this worker joined since), while :meth:`after_restore` writes none where it is there
    already (a second START would drop the points written since the restore).

    Where the restore generation cannot be told as a worker takes the duties (ps task 0 not ready or not read, and
    the other tasks not ready at one generation: a restore or a ps task's restart under way), the START owed is not
    decided then: the hook asks again before each point it writes (and at its end), and writes it once known. The
    points written meanwhile come before it (steps that completed before the restore: TensorBoard drops those past
    its step). Its final point is at the session's global_step where ps task 0 is not ready (a restarted ps task 0's
    global_step is 0).
    """

    duty = "summaries"

    def __init__(self, writer: SummaryWriter, *, save_steps: int = 100) -> None:
        self.writer = writer
        self._timer = StepTimer(None, save_steps, "summary saver")
        self._last: dict[int, dict[str, Any]] = {}
        self._last_time = time.monotonic()
        self._loss = float("nan")
        self._start_pending = False
        self._start_unchecked = False  # the restore generation was not known as it took the duties: asked again

    def after_create_session(self, session: MonitoredTrainingSession) -> None:
        # Also on taking the duties over (LeaderOnlyHook): after the points of the worker that held them till now
        self.writer.continue_last()
        snapshot = self._snapshot(session.client)  # the first rates' start
        generation = _generation(session.client, snapshot)
        mark = _mark_of(generation)
        joined = session.join_result
        if joined is not None and joined.restored is not None and session.global_step == joined.global_step:
            # At the checkpoint's step: a restore within the run goes on past every step value handed out
            # (psflow.train.within_run), and a START at that step dropped none of the lost steps past the checkpoint.
            restored_step = _global_step_of(joined.restored)
            self.writer.session_start(joined.global_step if restored_step is None else restored_step, joined.restored,
                                      mark)
        # At the session's start only: a chief elected later, steps on (LeaderOnlyHook calls this then), restored nothing
        self._start_pending = joined is not None and joined.restore_pending and session.global_step == joined.global_step
        self._timer.mark(session.global_step)
        self._last, self._last_time = snapshot, time.monotonic()
        self._start_unchecked = not self._start_pending and generation is None
        if self._start_unchecked:
            log.info("summary: the restore generation is not known now (a ps task restarted or restored): the "
                     "SessionLog START it may owe is checked before the next point")
        elif not self._start_pending:
            self._owed_start(session, snapshot)

    def _owed_start(self, session: MonitoredTrainingSession, snapshot: dict[int, dict[str, Any]]) -> None:
        mark = _restore_mark(session.client, snapshot)
        if mark is not None and not start_written(self.writer.logdir, mark):
            # The cluster's last restore has no START: it settled while no worker held the duties (their holder
            # lost, its lease lapsed), or this worker joined since (an in-graph client's own restore before its
            # session: told to the hooks after this). Nobody wrote a point since: each holder writes the START first.
            # Its step is the ps tasks' (what the restore loaded), whatever was saved since.
            log.warning("summary: the restore at generation %s has no SessionLog START (no worker held the chief "
                        "duties as it settled, or it came before this session): writing it",
                        _generation(session.client, snapshot))
            self.after_restore(session, None, None)

    def _check_start(self, session: MonitoredTrainingSession) -> None:
        """(Before a point) the START owed, where the restore generation was not known as this worker took the
        duties: written once known; while not, nothing (the point is written: a START owed comes after it)."""
        if not self._start_unchecked:
            return
        snapshot = self._snapshot(session.client)
        if _generation(session.client, snapshot) is not None:
            self._start_unchecked = False
            self._owed_start(session, snapshot)

    def before_run(self, context: RunContext) -> None:
        if self._start_pending:  # the restore its join waited for has ended: the first step trains on its model
            self.after_restore(context.session, None, None)

    def after_restore(self, session: MonitoredTrainingSession, checkpoint: str | None, step: int | None) -> None:
        """The cluster was set back to ``checkpoint`` at ``step`` (None: the one the ps tasks name, which their
        restore loaded): a START there, before the next step's summaries, whether or not global_step went back.
        Once per restore: the START names the restore's generation, and none is written where the directory
        holds that generation's already (a worker taking the duties after the holder that wrote it, which
        :class:`~psflow.train.leader_hooks.LeaderOnlyHook` tells of a restore it heard of while not holding them:
        a second START would drop that holder's points since the restore); this hook's next points then go to a file
        read after it (:meth:`~psflow.train.summary.SummaryWriter.continue_last`: two workers may hold the duties at
        once for a while, the lease on a restarted ps task 0 lost and a new one won before the old holder renewed)."""
        self._start_pending = self._start_unchecked = False  # (a chief whose join waited for it: this is its START)
        snapshot = self._snapshot(session.client)  # not the empty tasks': the next rates' start
        mark = _restore_mark(session.client, snapshot)
        if mark is not None and start_written(self.writer.logdir, mark):
            log.info("summary: the restore's SessionLog START (%s) is written already", mark)
            self.writer.continue_last()  # (another holder's writer may have: the next points are read after it)
            self._last, self._last_time = snapshot, time.monotonic()
            return
        if step is None:
            checkpoint, step = _restored_from(session.client, snapshot) or self._newest(session)
        if step is None:  # rotated away since: the step the restore left is the nearest known (ps task 0 restarted
            checkpoint, step = None, end_step(session)  # again, not ready, says 0: the session's last step then)
        self.writer.session_start(step, checkpoint, mark)
        self._timer.mark(step)
        self._last, self._last_time = snapshot, time.monotonic()

    @staticmethod
    def _newest(session: MonitoredTrainingSession) -> tuple[str | None, int | None]:
        """The newest checkpoint and its step: the restored one where the ps tasks are too old to name theirs and
        nothing was saved since the restore; (None, None) where not known."""
        try:
            checkpoint = latest_checkpoint(session.checkpoint_dir) if session.checkpoint_dir else None
        except CheckpointError as e:  # not listed now (CheckpointListingError): the START all the same
            log.warning("summary: the restored checkpoint is not known (%s): SessionLog START at global_step", e)
            return None, None
        return checkpoint, _global_step_of(checkpoint) if checkpoint is not None else None

    def _snapshot(self, client: ParameterClient) -> dict[int, dict[str, Any]]:
        stats = {}  # each with "read_at": this process's monotonic clock once it was read (ps_restarted)
        for task in sorted(client.channels):
            try:
                stats[task] = {**client.stats(task), "read_at": time.monotonic()}
            except RpcError as e:
                log.warning("summary: stats of /job:ps/task:%d unavailable: %s", task, e)
        return stats

    def after_run(self, context: RunContext, values: RunValues) -> None:
        self._loss = values.loss
        if self._timer.due(values.step):
            self._check_start(context.session)
            self._write(context.session.client, values.step)

    def end(self, session: MonitoredTrainingSession) -> None:
        self._check_start(session)
        step = end_step(session)  # (a restarted ps task 0, not ready, says 0: the session's last step then)
        if step != self._timer.last_step:
            self._write(session.client, step)
        self.writer.flush()

    def _write(self, client: ParameterClient, step: int) -> None:
        now = time.monotonic()
        seconds = max(now - self._last_time, 1e-9)
        stats = self._snapshot(client)
        out: dict[str, float] = {"train/loss": self._loss}
        head = stats.get(client.step_task)
        prev_head = self._last.get(client.step_task)
        rate: dict[str, float] = {}
        if head is not None and isinstance(head.get("learning_rate"), (int, float)):
            rate["learning_rate"] = float(head["learning_rate"])  # in force: the next update's, as ps task 0 reads it
        if head is not None and prev_head is not None:
            if not set_back(prev_head, head, ("examples", "global_step")):
                out["train/examples_per_sec"] = (head["examples"] - prev_head["examples"]) / seconds
                out["train/global_step_per_sec"] = (head["global_step"] - prev_head["global_step"]) / seconds
            if head.get("loss_ema") is not None:
                out["train/loss_ema"] = float(head["loss_ema"])
        for task, s in stats.items():
            prev = self._last.get(task)
            if prev is None or ps_restarted(prev, s):  # its counters start again from zero
                continue
            for key in REQUEST_COUNTERS:
                out[f"ps/{task}/{key}_per_sec"] = (s[key] - prev[key]) / seconds
        self.writer.scalars(out, step)
        if rate:  # labelled with the step the schedule read it at (other workers' pushes may be ahead of `step`)
            rate_step = head.get("learning_rate_step") if head is not None else None
            self.writer.scalars(rate, rate_step if isinstance(rate_step, int) else step)
        self._last, self._last_time = stats, now
        self._timer.mark(step)
