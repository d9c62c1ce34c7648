"""Session hooks: code that runs around the training steps of a session.

The hook interface (:class:`SessionRunHook`, :class:`RunContext`, :class:`RunValues`), the order in which a
session calls its hooks and what an exception skips are in :mod:`psflow.train.hook_api`; those names are
exported from here too.

Built-in hooks: :class:`CheckpointSaverHook`, :class:`SummarySaverHook` (in :mod:`psflow.train.summary_hook`),
:class:`StopAtStepHook`, :class:`StopAfterEpochsHook`,
:class:`StepCounterHook` (step rate and loss logging),
:class:`WorkerProgressHook` (a worker's ``step=S`` lines),
:class:`NanLossHook`, :class:`EvalHook`. Users write their own by
subclassing :class:`SessionRunHook` and overriding any of the methods.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from psflow.checkpoint.bounded_save import BoundedSaves, SaveAbandonedError
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.publish_checks import UnaskedTasksError, await_routes
from psflow.checkpoint.save import CheckpointFencedError, CheckpointManager, CheckpointSavesFailedError, FinalCheckpointError
from psflow.data import BatchSource
from psflow.errors import CheckpointError, TrainingError
from psflow.ps.client import ParameterClient
from psflow.rpc.api import DeadlineExceededError, RpcError, TaskUnavailableError
from psflow.train.hook_api import RunContext, RunValues, SessionRunHook, StepTimer, end_step
from psflow.train.ready_eval import EvaluationNotDone
from psflow.train.summary import SummaryWriter
from psflow.train.summary_hook import SummarySaverHook

if TYPE_CHECKING:
    from psflow.train.session import MonitoredTrainingSession

__all__ = [
    "RunContext",
    "RunValues",
    "SessionRunHook",
    "CheckpointSaverHook",
    "SummarySaverHook",
    "StopAtStepHook",
    "StopAfterEpochsHook",
    "StepCounterHook",
    "WorkerProgressHook",
    "NanLossHook",
    "NanLossError",
    "nan_loss_message",
    "EvalHook",
    "NotDone",
    "format_metrics",
]

log = logging.getLogger("psflow.hooks")
#: The worker's progress lines keep the worker's logger (as when the loop wrote them).
log_worker = logging.getLogger("psflow.worker")


def format_metrics(metrics: Mapping[str, float]) -> str:
    """``"auc=0.9012 logloss=0.3210 accuracy=0.8490"``: every metric but the example count, for log lines."""
    return " ".join(f"{k}={v:.4f}" for k, v in metrics.items() if k != "examples")


class NanLossError(TrainingError, RuntimeError):
    """The training loss became NaN or infinite (raised by :class:`NanLossHook`).

    The message is one line naming the worker, the global step and the batch's
    source (files and record ranges, :class:`~psflow.data.BatchSource`).
    """


class CheckpointSaverHook(SessionRunHook):
    """Saves the initial checkpoint, a checkpoint every N seconds (default 600) or N global steps, and one at
    the end.

    The initial checkpoint, as TF's saver does at step 0, so a ps task that dies at any later step can be
    restored: written when the chief initialized a fresh cluster (:meth:`after_initialize`), before the ps
    tasks are made ready, so it holds the initial values at global_step 0 and no other worker's push. A
    chief that did not initialize the cluster (it restored a checkpoint, or found the ps tasks ready) writes
    none, unless the directory has no checkpoint at all: then it saves when its session is created (or, with
    chief election, when it takes the lease), at the step the cluster is at (a chief restarted after its
    predecessor's initial save failed; one elected after the configured chief could not take the lease).

    Chief only. A save blocks this worker's loop while the ps tasks write their shards (other workers keep
    training; the initial one: they wait for it), for at most ``--save-timeout`` (:mod:`psflow.checkpoint.bounded_save`).
    """

    duty = "checkpoint save"

    def __init__(self, manager: CheckpointManager, *, save_secs: float | None = None, save_steps: int | None = None,
                 optimizer: Mapping[str, Any] | None = None, model: Mapping[str, Any] | None = None,
                 fence: Callable[[], tuple[int, str] | None] | None = None, final_must_succeed: bool = True) -> None:
        """Args:
            manager: writes the checkpoints.
            save_secs, save_steps: the period (one of them; default 600 s).
            optimizer: recorded in each manifest.
            model: the model's name, config and data settings, recorded in each
                manifest (``psflow export`` reads them).
            fence: the elected chief's ``(lease epoch, holder)``, or None once
                it lost the lease; its saves are fenced with that epoch (and
                skipped without a lease). None: saves are not fenced.
            final_must_succeed: a failed final save raises :class:`FinalCheckpointError` (see :meth:`end`);
                False (``--max-failed-saves 0``): it is logged as an error, like a periodic one.
        """
        self.manager = manager
        self._bounded = BoundedSaves(manager)  # each save (and the final one's work) within --save-timeout
        self._fence = fence
        self._final_must_succeed = final_must_succeed
        self._timer = StepTimer(600.0 if save_secs is None and save_steps is None else save_secs, save_steps, "checkpoint saver")
        self._optimizer = optimizer
        self._model = model
        self._session: MonitoredTrainingSession | None = None
        self._initial_failed = False
        self.saved: list[tuple[str, int]] = []

    def after_initialize(self, session: MonitoredTrainingSession) -> None:
        """Writes the initial checkpoint if the directory has none, before any other worker can push. A failure
        raises as a periodic save's does (the manager counted it) and is not tried again when the session is
        created: the next period saves. The only save of ps tasks not ready (``initial``): any other fails there."""
        if latest_checkpoint(self.manager.directory) is None:
            try:
                self._save(session, initial=True)
            except BaseException:
                self._initial_failed = True
                raise

    def after_create_session(self, session: MonitoredTrainingSession) -> None:
        self._session = session
        self._timer.mark(session.global_step)
        if not self._initial_failed and latest_checkpoint(self.manager.directory) is None:
            # The cluster was initialized without this hook (see the class docstring): the first checkpoint now.
            self._save(session)

    def after_run(self, context: RunContext, values: RunValues) -> None:
        """Saves when the period is due. A save that fails raises (the manager counted it) and is tried again
        at this chief's next step (a full disk stops the run within ``--max-failed-saves`` steps), except one
        that failed because a ps task was unreachable (:func:`_ps_task_unreachable`: it died, the cluster's restore
        deals with it, or its host went silent past the call's deadline): the save waits for the next period.
        Otherwise a chief with steps in flight (``--steps-in-flight`` 3 or more), whose results of pushes
        acknowledged before the death still come back, failed one save per result and reached
        ``--max-failed-saves`` before the restore could begin."""
        if self._timer.due(values.step):
            try:
                self._save(context.session)
            except (CheckpointError, RpcError) as e:
                if _ps_task_unreachable(e) or isinstance(e, SaveAbandonedError):  # (given up: the store may be stuck)
                    self._timer.mark(values.step)
                raise

    def end(self, session: MonitoredTrainingSession) -> None:
        """Writes the final checkpoint (:attr:`Manifest.final`; an evaluator stops after it). Runs only when
        training ended normally (see :class:`SessionRunHook`). A checkpoint already at this step and still
        current (this chief's periodic save, or another chief's save at the last step) is marked final (and,
        with election, taken over by this chief's epoch: :meth:`CheckpointManager.mark_final`), not saved again;
        one that is no longer current when marked is saved anew. The step is :func:`~psflow.train.hook_api.end_step`'s
        (a restarted ps task 0, not ready, says 0: the session's last step then). Without the lease any more, nothing is written
        (logged: the chief holding it writes it). A save whose check at its pointer switch could not ask a
        replicated shard's primary (gone silent or dying just then: :class:`~psflow.checkpoint.publish_checks.
        UnaskedTasksError`) is made once more, once that shard's routing settled (its backup promoted, or its
        primary answering again: :func:`~psflow.checkpoint.publish_checks.await_routes`; waited for at most half
        the time left of the same ``--save-timeout``, the rest for the second save): the shard's state lives on
        there, and nothing was restored (the second save's own checks say so, or it fails).

        Raises:
            CheckpointFencedError: a newer chief's epoch refused it (that chief writes it; the guards log this).
            FinalCheckpointError: anything else failed (a file not written, a ps task unreachable): there is no
                next period to save, so the session, the worker and the run fail, naming the directory and the
                cause, rather than end with an older checkpoint as the newest. Without ``final_must_succeed``
                (``--max-failed-saves 0``: no failed save fails the run): logged as an error instead.
            CheckpointSavesFailedError: that was the ``max_failed_saves``-th failed save in a row (a first attempt
                whose check could not ask a replicated shard is counted, but the run ends only if its retry is not
                made or fails too: the final model lives on the shard's backup).
        """
        step: int | None = None
        deadline = time.monotonic() + session.client.config.save_timeout  # (the bound of the final work below)
        try:
            step = end_step(session)  # (a restarted ps task 0, not ready, says 0: the session's last step then)
            self._bounded.run(session.client, "the final checkpoint's save",
                              functools.partial(self._final, session, step, deadline))
        except CheckpointFencedError:
            raise
        except (CheckpointError, RpcError, OSError) as e:
            message = (f"{session.client.client_name}: the final checkpoint (global_step {step}) could not be written "
                       f"into {self.manager.directory}: {e}")
            if not self._final_must_succeed:  # --max-failed-saves 0: no failed save ends the run, this one neither
                log.error("%s (--max-failed-saves 0: the run does not fail for it)", message)
                return
            raise FinalCheckpointError(message) from e

    def _final(self, session: MonitoredTrainingSession, step: int, deadline: float, client: ParameterClient) -> None:
        latest = latest_checkpoint(self.manager.directory)
        if latest is not None and _global_step_of(latest) == step and self._mark_final(latest):
            return
        try:
            self._save(session, final=True, client=client)  # (inside the final work's bound already, on its client)
        except (UnaskedTasksError, CheckpointSavesFailedError) as failed:
            # (that attempt may have been the --max-failed-saves-th failure in a row: the retry, part of the same
            # final save, still comes first, or the final model the backup holds is lost; a failed retry is the
            # next failure in a row and raises CheckpointSavesFailedError itself)
            e = failed if isinstance(failed, UnaskedTasksError) else failed.__cause__
            if not isinstance(e, UnaskedTasksError):
                raise
            left = (deadline - time.monotonic()) / 2  # (the other half: the save again)
            try:
                settled = await_routes(client, e, left)
            except RpcError as again:
                unsettled = (f"{failed}; the shard's routing did not settle within {left:.1f} s (half of what was left "
                             f"of the final save's --save-timeout): {again}")
                raise (CheckpointError(unsettled) if failed is e else CheckpointSavesFailedError(unsettled)) from e
            if not settled:
                raise
            log.warning("%s: the final checkpoint was not made current (%s); the shard's routing settled: saving it "
                        "again", client.client_name, e)
            self._save(session, final=True, client=client)

    def _mark_final(self, latest: str) -> bool:
        """Marks ``latest`` final under this chief's fence; False if it must be saved anew (no longer current)."""
        fence = self._fence() if self._fence is not None else None
        if self._fence is not None and fence is None:
            log.warning("checkpoint %s not marked final: no longer the chief", latest)
            return True  # the chief holding the lease writes it
        epoch, holder = fence if fence is not None else (None, "")
        try:
            self.manager.mark_final(latest, epoch=epoch, holder=holder)
        except CheckpointFencedError:
            raise
        except CheckpointError as e:  # a fenced chief took its checkpoint back, or it was deleted: save anew
            log.warning("checkpoint %s not marked final (%s): saving the final checkpoint anew", latest, e)
            return False
        return True

    def _save(self, session: MonitoredTrainingSession, *, final: bool = False, initial: bool = False,
              client: ParameterClient | None = None) -> None:
        """Saves a checkpoint: bounded by ``--save-timeout`` on a client of its own (:class:`BoundedSaves`), or
        on ``client`` as it is (already inside a bounded call); ``initial``: :meth:`after_initialize`'s."""
        epoch, holder = None, ""
        if self._fence is not None:
            lease = self._fence()
            if lease is None:
                log.warning("%s: checkpoint skipped: no longer the chief", session.client.client_name)
                return
            epoch, holder = lease
        save = functools.partial(self.manager.save, optimizer=self._optimizer, model=self._model,
                                 epoch=epoch, holder=holder, final=final, initial=initial)
        saved = self._bounded.run(session.client, "the checkpoint save", save) if client is None else save(client)
        self.saved.append((saved.path, saved.global_step))
        self._timer.mark(saved.global_step)


def _ps_task_unreachable(error: BaseException) -> bool:
    """Whether ``error`` or an error it was raised from is a ps task that could not be reached: refused the
    connection (dead) or did not answer within the call's deadline (a host gone silent: the chief cannot tell it
    from a dead one, and trying again at the next step would wait out the same deadline)."""
    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, (TaskUnavailableError, DeadlineExceededError)):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def _global_step_of(checkpoint: str) -> int | None:
    try:
        return read_manifest(checkpoint).global_step
    except CheckpointError:  # deleted since (rotation)
        return None


class StopAtStepHook(SessionRunHook):
    """Stops once global_step reaches ``last_step`` (or ``num_steps`` after the session started).

    Steps done before a restore count: after restoring at step S with
    ``last_step=N``, training stops at N, having done N - S more steps.
    The stop's reason (a worker's ``stop_reason``) is
    ``"global_step reached max_steps=N"`` after a step, or
    ``"stopped at global_step S (max_steps=N)"`` before one (another worker's push reached N).
    """

    def __init__(self, *, last_step: int | None = None, num_steps: int | None = None) -> None:
        if (last_step is None) == (num_steps is None):
            raise ValueError(f"StopAtStepHook: give exactly one of last_step ({last_step}) and num_steps ({num_steps})")
        self._last_step, self._num_steps = last_step, num_steps

    def after_create_session(self, session: MonitoredTrainingSession) -> None:
        if self._num_steps is not None:
            self._last_step = session.global_step + self._num_steps

    @property
    def last_step(self) -> int | None:
        return self._last_step

    def before_run(self, context: RunContext) -> None:
        if self._last_step is not None and context.session.global_step >= self._last_step:
            context.request_stop(f"stopped at global_step {context.session.global_step} (max_steps={self._last_step})")

    def after_run(self, context: RunContext, values: RunValues) -> None:
        if self._last_step is not None and values.step >= self._last_step:
            context.request_stop(f"global_step reached max_steps={self._last_step}")


class StopAfterEpochsHook(SessionRunHook):
    """Stops once this worker has finished ``num_epochs`` passes over its data."""

    def __init__(self, num_epochs: int) -> None:
        if num_epochs < 1:
            raise ValueError(f"StopAfterEpochsHook: num_epochs must be >= 1, got {num_epochs}")
        self.num_epochs = num_epochs

    def after_run(self, context: RunContext, values: RunValues) -> None:
        if values.epochs_completed is not None and values.epochs_completed >= self.num_epochs:
            context.request_stop()


class StepCounterHook(SessionRunHook):
    """Logs global_step/s, examples/s and the loss every ``every_steps`` local steps."""

    def __init__(self, *, every_steps: int = 100, name: str = "") -> None:
        self.every_steps, self.name = every_steps, name
        self._t0, self._s0, self._examples = time.monotonic(), 0, 0
        self.rates: list[tuple[int, float, float]] = []

    def after_create_session(self, session: MonitoredTrainingSession) -> None:
        self._t0, self._s0 = time.monotonic(), session.global_step

    def after_run(self, context: RunContext, values: RunValues) -> None:
        self._examples += values.examples
        if (context.local_step + 1) % self.every_steps:
            return
        now = time.monotonic()
        seconds = max(now - self._t0, 1e-9)
        steps_per_sec, examples_per_sec = (values.step - self._s0) / seconds, self._examples / seconds
        self.rates.append((values.step, steps_per_sec, examples_per_sec))
        log.info("%s: global_step/s=%.1f examples/s=%.0f loss=%.4f (step %d)", self.name or "session",
                 steps_per_sec, examples_per_sec, values.loss, values.step)
        self._t0, self._s0, self._examples = now, values.step, 0


class WorkerProgressHook(SessionRunHook):
    """A worker's progress lines (the one place that decides them).

    ``worker I: step=S loss=L <metrics> examples/s=R`` when this worker's push owns global step S
    and ``S % every_steps == 0``, so each multiple is logged once across the cluster (the rate:
    this worker's examples since its previous such line); with ssp, ``worker I: clock=C min_clock=M``
    every ``every_steps`` local steps (C: this worker's local steps).
    """

    def __init__(self, task_index: int, *, every_steps: int) -> None:
        if every_steps < 1:
            raise ValueError(f"WorkerProgressHook: every_steps must be >= 1, got {every_steps}")
        self.task_index, self.every_steps = task_index, every_steps
        self._window_start, self._window_examples = time.monotonic(), 0

    def after_create_session(self, session: MonitoredTrainingSession) -> None:
        self._window_start, self._window_examples = time.monotonic(), 0

    def after_run(self, context: RunContext, values: RunValues) -> None:
        self._window_examples += values.examples
        clock = context.local_step + 1
        if values.min_clock is not None and clock % self.every_steps == 0:
            log_worker.info("worker %d: clock=%d min_clock=%d", self.task_index, clock, values.min_clock)
        if values.completed and values.step % self.every_steps == 0:
            now = time.monotonic()
            rate = self._window_examples / max(now - self._window_start, 1e-9)
            log_worker.info("worker %d: step=%d loss=%.4f %s examples/s=%.0f", self.task_index, values.step,
                            values.loss, format_metrics(values.metrics), rate)
            self._window_start, self._window_examples = now, 0


class NanLossHook(SessionRunHook):
    """Stops when the loss is NaN or infinite: raises :class:`NanLossError` or, with ``fail=False``, requests stop.

    The error (or the log line) names the worker, the global step and the batch's files and record ranges.
    The batch is where the loss stopped being finite, not necessarily where the harm began: a record with
    extreme values can push parameters to extremes that a later batch's loss overflows on.
    """

    def __init__(self, *, fail: bool = True) -> None:
        self.fail = fail

    def after_run(self, context: RunContext, values: RunValues) -> None:
        if math.isfinite(values.loss):
            return
        message = nan_loss_message(context.session.client.client_name, values.loss, values.step, values.source)
        if self.fail:
            raise NanLossError(message)
        log.error("%s; stopping", message)
        context.request_stop()


def nan_loss_message(worker: str, loss: float, step: int, source: BatchSource | None) -> str:
    """``"/job:worker/task:1: loss is nan at global_step 31, on the batch of a9a lines 1409-1536, epoch 1"``."""
    where = f"on the batch of {source.describe()}" if source is not None else "on a batch of unknown source"
    return (f"{worker}: loss is {loss} at global_step {step}, {where}; look for extreme feature values or labels "
            "there or in the batches before it, or lower --learning-rate (or the rates of --learning-rate-schedule)")


class NotDone(NamedTuple):
    """An evaluation not done (:attr:`EvalHook.not_done`): at global_step ``step``, the session's end's (``final``)
    or a periodic one, and why (the :class:`~psflow.train.ready_eval.EvaluationNotDone`'s words, or ``failed: `` and
    the error that ended it)."""

    step: int
    final: bool
    why: str


class EvalHook(SessionRunHook):
    """Evaluates the current parameters every N global steps and at the end (the model's metrics), that one at
    :func:`~psflow.train.hook_api.end_step` (ps task 0's global_step where it is ready, else the session's last step:
    a restarted ps task 0 not loaded yet says 0), unless the last periodic evaluation was of that step. An
    evaluation that raises :class:`~psflow.train.ready_eval.EvaluationNotDone` (no ready model read in its time: a ps
    task being restored) is reported as not done, with the reason, never as a number (:meth:`evaluated`); one that
    fails (an ``RpcError``: a ps task unreachable) raises, as before. Both are kept in :attr:`not_done` (a worker's
    result file and metrics.json's ``eval_not_done`` list them: :mod:`psflow.train.worker_result`).

    A periodic evaluation is tried once per period: one not done or failed is tried again at the next period's
    step, not at the next step. A try beside a ps task being restored waits up to
    :data:`~psflow.train.ready_eval.WAIT_SECONDS`, and the restore it awaits is mostly this chief's own, made once
    the evaluation returns: a try at every step cost every step that wait (a worker whose ps task was restarting lost
    up to 5 s a step) and put that restore off. The next period, not a backoff: a backoff would be a second clock
    beside the period the user chose, whose steps are where the points are expected. The evaluation at the end is
    made whatever the periodic ones did (its wait for a restore as before).

    Args:
        evaluate: returns the model's metrics of the current parameters
            (e.g. ``{"auc", "logloss", "accuracy", "examples"}``); see
            :func:`psflow.train.evaluation.evaluate`.
        every_steps: period in global steps; None: only at the end.
        writer: where ``eval/<metric>`` summaries go (optional).
    """

    duty = "evaluation"

    def __init__(self, evaluate: Callable[[], dict[str, float]], *, every_steps: int | None,
                 writer: SummaryWriter | None = None) -> None:
        self.evaluate = evaluate
        self._timer = StepTimer(None, every_steps or 1 << 62, "eval")  # None: a period never reached, the end only
        self.writer = writer
        self.history: list[tuple[int, dict[str, float]]] = []
        #: each evaluation not done or failed, in order (:meth:`evaluated`)
        self.not_done: list[NotDone] = []

    def after_create_session(self, session: MonitoredTrainingSession) -> None:
        self._timer.mark(session.global_step)

    def after_run(self, context: RunContext, values: RunValues) -> None:
        if self._timer.due(values.step):
            self._timer.mark(values.step)  # this period's try, done or not (the class docstring)
            self.report_made(values.step)

    def end(self, session: MonitoredTrainingSession) -> None:
        step = end_step(session)  # (a restarted ps task 0, not ready, says 0: the session's last step then)
        if not self.history or self.history[-1][0] != step:
            self.report_made(step, final=True)

    def evaluated(self, step: int, *, final: bool = False) -> dict[str, float] | None:
        """The metrics of an evaluation made now (at the session's end: ``final``), or None where it was not done
        (:class:`~psflow.train.ready_eval.EvaluationNotDone`: no ready model read in time): recorded in
        :attr:`not_done` with the reason, logged (WARNING), no number reported. One that fails (``RpcError``) is
        recorded there too, then raises."""
        try:
            return self.evaluate()
        except EvaluationNotDone as e:
            self.not_done.append(NotDone(step, final, str(e)))
            log.warning("eval step=%d not done, no metrics: %s", step, e)
            return None
        except RpcError as e:
            self.not_done.append(NotDone(step, final, f"failed: {e}"))
            raise

    def report_made(self, step: int, *, final: bool = False) -> None:
        """Evaluates now and reports the metrics at ``step`` (:meth:`report`), unless it was not done."""
        metrics = self.evaluated(step, final=final)
        if metrics is not None:
            self.report(step, metrics)

    def report(self, step: int, metrics: dict[str, float]) -> None:
        """Keeps ``metrics`` (the model's at global_step ``step``) in :attr:`history`, logs them, writes them."""
        self.history.append((step, metrics))
        log.info("eval step=%d %s", step, format_metrics(metrics))
        if self.writer is not None:
            self.writer.scalars({f"eval/{k}": v for k, v in metrics.items() if k != "examples"}, step)
            self.writer.flush()
        self._timer.mark(step)
