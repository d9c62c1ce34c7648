"""The evaluator task: TensorFlow's ``evaluator``, which evaluates each new checkpoint on held-out data.

A TFJob, or a ``TF_CONFIG`` written by hand, may give one task the type
``evaluator``. As in TensorFlow, that task is not part of the training
cluster (the cluster has no ``evaluator`` job; no ps task or worker ever
calls it). ``psflow server`` runs it as follows:

1. Every ``--eval-poll-secs`` (default 5 s) it looks for the newest complete
   checkpoint in ``--checkpoint-dir``
   (:func:`psflow.checkpoint.pointer.latest_checkpoint`).
2. When that checkpoint is newer than the last one evaluated, the evaluator
   reads it from the files (variables only, partitions joined), rebuilds the
   model from the checkpoint's manifest (a user's ``package.module:Class``
   only if the evaluator's own ``--model`` names it), and evaluates it on ``--eval``
   (with ``--eval-moving-averages``: the variables' moving averages, which
   the checkpoint must hold, in place of the variables). The
   eval data is read once, as the chief's in-training evaluation reads it. Checkpoints written during an evaluation are
   skipped, and the next evaluation takes the newest, as TensorFlow's
   evaluator does.
3. It logs one line per evaluation (``evaluator: step=S auc=... (ckpt-...)``).
   With ``--summary-dir`` it also writes ``eval/<metric>`` scalars at the
   checkpoint's global_step into ``SUMMARY_DIR/eval``, so TensorBoard shows
   them beside the training curves.
4. It exits with status 0 once it has evaluated the run's final checkpoint
   (:attr:`psflow.checkpoint.manifest.Manifest.final`, written when training
   ends normally), or a checkpoint at or past ``--max-steps``. A stop
   (SIGTERM, SIGINT) ends it sooner, with ``128 + n``.
5. A final checkpoint is not the end while a run *resumed* from it is going:
   one whose lock of the directory (``checkpoint.lock``,
   :class:`~psflow.checkpoint.lock.CheckpointDirLock`, taken by ``psflow train``'s
   launcher before any task starts and by a ``psflow server`` chief before it
   joins; released when the run ends) is of another run than the checkpoint's
   writer, or was taken after the checkpoint was written, and whose process is
   not known to be gone. The evaluator says so once and waits for that run's
   checkpoints; it ends on the resumed run's final one, or on the same final
   checkpoint once the lock is released without a newer one (a run resumed with
   nothing left to train). Nor is a final checkpoint the end once a newer one is in
   the directory: a resumed run wrote it, and may have ended and released the lock
   while the evaluator was still reading the old final one; the evaluator goes on to
   the newest (the lock is read before the directory, and a run writes its last
   checkpoint before it releases the lock). The lock's ``since`` and the manifest's ``created``
   are the two chiefs' clocks. A holder on another host is never judged gone
   (its pid means nothing here): a resumed run that crashed there leaves its
   lock, and the evaluator waits until the lock file is deleted, as its line
   says. Non-guarantee: an evaluator that has evaluated
   the old final checkpoint before the resumed run took the lock cannot know
   that run is coming and exits; start it once the run has started.
6. Waiting on a checkpoint that is not final while no run is writing the
   directory (no lock: the run ended without its final checkpoint, or crashed;
   or a lock whose process is gone) says so once, in a WARNING naming the
   checkpoint and how to end the wait (resume the run, or stop the evaluator):
   the evaluator waits for a newer checkpoint until stopped, and a crashed run
   writes none. A lock whose process is gone may still be a live run's: with
   chief election, when the worker that took it dies, the others train on and
   the one holding the chief duties takes the lock over at its next save; the
   line says so (it said the run was gone). A lock held on another host (whose
   process psflow cannot see) is taken for a live run until no newer checkpoint came for
   :data:`UNSEEN_HOLDER_QUIET` s; the line then also names the lock file to
   delete once that run is over.

The evaluator reads files and opens no channel to any task, so it cannot slow
training. It does need to see the checkpoint directory: a shared file system,
or on Kubernetes a volume that the chief writes to. If rotation deletes a
checkpoint while it is being read, the evaluator logs that and moves on to the
next newest; it never evaluates a partial checkpoint. A checkpoint still there
that cannot be read (a shard damaged or missing) is named once, in a WARNING
with the file and why, and not read again: the evaluator waits for a newer one.
When that checkpoint is the run's last (final, or at ``--max-steps``), nothing
newer will come, and the evaluator fails with a :class:`CheckpointError` naming it.

7. A checkpoint directory that does not answer (a store's outage, its endpoint
   unreachable; a network file system gone) is transient: the evaluator says so
   once per outage, in a WARNING naming the directory and the error, and polls on;
   a checkpoint whose read met the outage is read again once the store answers, not
   taken for a damaged one. It ends only on the run's last checkpoint or a stop.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, replace

from psflow.checkpoint.lock import LOCK_NAME, describe_holder, holder_alive
from psflow.checkpoint.manifest import Manifest, read_json, read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import averaged_variables
from psflow.data import Batch, read_all
from psflow.errors import CheckpointError
from psflow.export import load_checkpoint_model
from psflow.train.build import data_options
from psflow.train.config import ConfigError, TrainConfig
from psflow.train.evaluation import ArrayParameters, evaluate
from psflow.train.hooks import format_metrics
from psflow.train.summary import SummaryWriter

__all__ = ["EVALUATOR_JOB", "UNSEEN_HOLDER_QUIET", "Evaluation", "run_evaluator"]

log = logging.getLogger("psflow.evaluator")

#: The task type TensorFlow (and a TFJob) gives the evaluator.
EVALUATOR_JOB = "evaluator"

#: Seconds without a newer checkpoint after which a run whose lock names another host (its process unseen) may
#: have crashed, as the evaluator then says once: a live run saves every --save-checkpoints-secs (600 s by default).
UNSEEN_HOLDER_QUIET = 1800.0


@dataclass(frozen=True)
class Evaluation:
    """One evaluated checkpoint."""

    checkpoint: str
    global_step: int
    metrics: dict[str, float]
    final: bool


def run_evaluator(config: TrainConfig, *, poll_secs: float = 5.0, stop: threading.Event | None = None,
                  search_path: str | None = None) -> list[Evaluation]:
    """Evaluates each new checkpoint of ``config.checkpoint.dir`` on ``config.data.eval`` until training ended.

    Blocks until the final checkpoint (or one at or past ``config.data.max_steps``) has been evaluated,
    or ``stop`` is set (then it returns what it evaluated so far). See the module docstring.

    Raises:
        ConfigError: no ``checkpoint_dir`` or no ``eval`` data; ``--eval-moving-averages`` and a checkpoint
            without moving averages.
        DataError: the eval data cannot be read (names the file and record).
        CheckpointError: the run's final checkpoint cannot be read (names it and the file).
        ModelError: a checkpoint's model cannot be rebuilt (names the checkpoint), or is a user's module
            that this task's --model does not name (a manifest is data: it does not choose code to run).
    """
    if not config.checkpoint.dir:
        raise ConfigError("the evaluator needs --checkpoint-dir (the directory the chief checkpoints into)")
    if not config.data.eval:
        raise ConfigError("the evaluator needs --eval (the data it evaluates each checkpoint on)")
    if poll_secs <= 0:
        raise ConfigError(f"--eval-poll-secs must be > 0, got {poll_secs}")
    stop = stop if stop is not None else threading.Event()
    batch = read_all(list(config.data.eval), config.data.format, **data_options(config))  # as the chief's EvalHook reads it
    writer = SummaryWriter(os.path.join(config.report.summary_dir, "eval")) if config.report.summary_dir else None
    done: list[Evaluation] = []
    unreadable: tuple[str, int] | None = None  # the newest checkpoint, found damaged: not read again
    going, stalled = _ResumedRun(config.checkpoint.dir), _Stalled(config.checkpoint.dir)
    outage = _Outage(config.checkpoint.dir, poll_secs)
    log.info("evaluator: watching %s every %.1f s; evaluating on %s", config.checkpoint.dir, poll_secs,
             ", ".join(config.data.eval))
    try:
        while not stop.is_set():
            try:
                newest = _newest(config.checkpoint.dir)
            except OSError as e:  # the store (or a network file system) did not answer: an outage passes
                outage.met(e)
                stop.wait(poll_secs)
                continue
            outage.over()
            if newest is not None and newest[:2] == unreadable:
                if _ends_training(newest, config.data.max_steps, going):  # marked final since: nothing newer comes
                    raise CheckpointError(f"evaluator: the final checkpoint {newest[0]} cannot be read (see the "
                                          "WARNING above); nothing newer will come")
                stop.wait(poll_secs)
                continue
            if newest is None or (done and newest[:2] == (done[-1].checkpoint, done[-1].global_step)):
                if newest is not None and newest[2] and not going(newest[0]):  # marked final after it was
                    if not done[-1].final:  # evaluated (the last save's step)
                        log.info("evaluator: %s is the final checkpoint", os.path.basename(newest[0]))
                        done[-1] = replace(done[-1], final=True)
                    break
                if newest is not None and not newest[2]:
                    stalled(newest[0], newest[1])
                stop.wait(poll_secs)
                continue
            try:
                result = _evaluate(newest[0], batch, search_path, config.report.eval_moving_averages,
                                   config.model.name)
            except (CheckpointError, OSError) as e:
                if _unreachable(e):  # not a damaged checkpoint: read it again once the store answers
                    outage.met(e)
                    stop.wait(poll_secs)
                    continue
                if _newest(config.checkpoint.dir) != newest:  # deleted by rotation while read: take the newest
                    log.info("evaluator: skipped %s (%s)", newest[0], e)
                    continue
                if _ends_training(newest, config.data.max_steps, going):
                    raise CheckpointError(f"evaluator: the final checkpoint {newest[0]} cannot be read: {e}; "
                                          "nothing newer will come") from e
                log.warning("evaluator: cannot read checkpoint %s, skipped: %s; waiting for a newer one",
                            newest[0], e)
                unreadable = newest[:2]
                continue
            done.append(result)
            log.info("evaluator: step=%d %s (%s%s)", result.global_step, format_metrics(result.metrics),
                     os.path.basename(result.checkpoint), ", final" if result.final else "")
            if writer is not None:
                writer.scalars({f"eval/{k}": v for k, v in result.metrics.items() if k != "examples"},
                               result.global_step)
            if _ends_training((result.checkpoint, result.global_step, result.final), config.data.max_steps, going):
                break
    finally:
        if writer is not None:
            writer.close()
    if done and not stop.is_set():  # the loop ended by its break: the final checkpoint or --max-steps
        log.info("evaluator: training ended at step %d; done after %d evaluations", done[-1].global_step, len(done))
    return done


def _newest(directory: str) -> tuple[str, int, bool] | None:
    """(path, global_step, final) of the newest complete checkpoint in ``directory``, or None."""
    path = latest_checkpoint(directory)
    if path is None:
        return None
    try:
        manifest = read_manifest(path)
    except CheckpointError:  # deleted by rotation since
        return None
    return path, manifest.global_step, manifest.final


def _unreachable(error: BaseException | None) -> bool:
    """Whether ``error`` (or an error it was raised from) says the store did not answer: an outage, which
    passes, not a damaged checkpoint."""
    while error is not None:
        if isinstance(error, (ConnectionError, TimeoutError)):
            return True
        error = error.__cause__
    return False


class _Outage:
    """Says once per outage, in a WARNING, that the checkpoint directory's store does not answer and that the
    evaluator polls on (module docstring, 7.); and, in an INFO line, when it answers again."""

    def __init__(self, directory: str, poll_secs: float) -> None:
        self.directory, self.poll_secs = directory, poll_secs
        self.down = False

    def met(self, error: BaseException) -> None:
        if not self.down:
            self.down = True
            log.warning("evaluator: cannot look for checkpoints in %s: %s; polling on every %.1f s until it "
                        "answers (stop the evaluator with SIGTERM or Ctrl-C to end the wait)", self.directory,
                        " ".join(str(error).split()) or type(error).__name__, self.poll_secs)

    def over(self) -> None:
        if self.down:
            self.down = False
            log.info("evaluator: %s answers again", self.directory)


def _ends_training(newest: tuple[str, int, bool], max_steps: int | None, going: _ResumedRun) -> bool:
    """Whether checkpoint ``newest`` (path, global_step, final) is the last one the run writes: final (and no
    run resumed from it is going), or at or past ``max_steps``."""
    return (newest[2] and not going(newest[0])) or (max_steps is not None and newest[1] >= max_steps)


class _ResumedRun:
    """Whether a run resumed from a final checkpoint is going (module docstring, 5.); says so once per run."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lock = os.path.join(directory, LOCK_NAME)
        self.said: set[tuple[str, str]] = set()

    def __call__(self, path: str) -> bool:
        holder = read_json(self.lock)  # None: no lock (the run ended), or unreadable
        try:
            manifest = read_manifest(path)
        except CheckpointError:  # deleted by rotation since: a newer one is there
            return True
        alive = holder_alive(holder) if holder is not None else False
        if holder is None or not _taken_after(holder, manifest) or alive is False:
            # Read after the lock: a run writes its last checkpoint before it releases the lock, so a run that
            # resumed from ``path`` and ended meanwhile has left its newer checkpoints here.
            return self._newer_than(path)
        run = str(holder.get("run_id"))
        if (run, path) not in self.said:
            self.said.add((run, path))
            unknown = (f"; psflow cannot tell from this host whether it still runs: if it is over (it crashed), "
                       f"delete {self.lock} to end the wait" if alive is None else "")
            log.info("evaluator: %s is final, but run %s took the checkpoint directory since (%s, pid %s on %s): "
                     "waiting for its checkpoints%s", os.path.basename(path), run, holder.get("since_text"),
                     holder.get("pid"), holder.get("host"), unknown)
        return True

    def _newer_than(self, path: str) -> bool:
        """Whether a checkpoint newer than ``path`` is in the directory: a run resumed from it wrote it (and may
        have ended and released the lock while ``path`` was being evaluated), so ``path`` is not the end."""
        try:
            newest = latest_checkpoint(self.directory)
        except OSError:  # the store did not answer: not the end yet; the next poll meets the outage and says so
            return True
        return newest is not None and newest != path


class _Stalled:
    """Says once per checkpoint, in a WARNING, that the evaluator waits past a checkpoint that is not final while
    no run is seen writing the directory, and how to end the wait (module docstring, 6.)."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.lock = os.path.join(directory, LOCK_NAME)
        self.first_seen: dict[str, float] = {}  # when the evaluator began waiting past each checkpoint
        self.said: set[str] = set()

    def __call__(self, path: str, step: int) -> None:
        if path in self.said:
            return
        first = self.first_seen.setdefault(path, time.monotonic())
        holder = read_json(self.lock)  # None: no lock (the run ended or crashed), or unreadable
        alive = holder_alive(holder) if holder is not None else False
        if alive is True or (alive is None and time.monotonic() - first < UNSEEN_HOLDER_QUIET):
            return
        self.said.add(path)
        if holder is None:
            why = f"no run holds the directory (no {LOCK_NAME}: the run that wrote it ended or crashed)"
        elif alive is False:
            why = (f"the process that holds it is gone: {describe_holder(holder)} (the whole run, or only that process: "
                   "the worker holding the chief duties takes the lock over at its next save)")
        else:
            why = (f"none came for {UNSEEN_HOLDER_QUIET / 60:.0f} min from {describe_holder(holder)}, "
                   "whose process psflow cannot see from this host")
        delete = f", or delete {self.lock} once that run is over" if alive is None else ""
        log.warning("evaluator: waiting for a checkpoint newer than %s (global_step %d, not final) in %s, but %s: "
                    "if that run crashed, none comes until it is resumed with this --checkpoint-dir; stop the "
                    "evaluator (SIGTERM or Ctrl-C) to end the wait%s", os.path.basename(path), step, self.directory,
                    why, delete)


def _taken_after(holder: dict[str, object], manifest: Manifest) -> bool:
    """Whether lock ``holder`` is another run's than the checkpoint's writer, or was taken after it was written."""
    writer = (manifest.run or {}).get("run_id")
    since = holder.get("since")
    return (writer is not None and holder.get("run_id") != writer) or (
        isinstance(since, (int, float)) and since > manifest.created)


def _evaluate(path: str, batch: Batch, search_path: str | None, moving_averages: bool, model: str) -> Evaluation:
    """Evaluates checkpoint ``path``.

    Raises:
        CheckpointError, OSError: it cannot be read (gone since, or damaged: the message names the file).
    """
    manifest = read_manifest(path)
    if moving_averages and not averaged_variables(manifest):  # every later checkpoint would lack them too
        raise ConfigError(f"evaluator: --eval-moving-averages, but checkpoint {path} holds no moving averages "
                          "(train with --moving-average-decay)")
    # The manifest is data: a user's module it names is imported only if this task's --model names it too.
    loaded = load_checkpoint_model(path, search_path=search_path, moving_averages=moving_averages, model=model)
    final = manifest.final
    metrics = evaluate(loaded.model, ArrayParameters(loaded.values, what=path), batch)
    return Evaluation(path, loaded.global_step, metrics, final)
