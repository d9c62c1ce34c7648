"""The hook interface of a session: :class:`SessionRunHook` and what its methods receive.

Lifecycle of every hook of a :class:`~psflow.train.session.MonitoredTrainingSession`,
in this order (hooks are called in the order given, for each call):

1. ``begin()`` -- once, before the session joins the cluster; no RPCs yet.
2. ``after_initialize(session)`` -- the chief only, and only when its session
   initialized a fresh cluster (created the variables and loaded their
   initial or warm-start values; no checkpoint restored, the cluster not
   ready before): once, *before* the ps tasks are made ready, so no other
   worker has joined or pushed yet (global_step is 0 in a new run). The
   checkpoint saver writes the initial checkpoint here.
3. ``after_create_session(session)`` -- once, after the variables are
   initialized or restored and the cluster is ready; ``session.global_step``
   is valid. (A chief whose join left the restore within the run to the lease
   holder, ``session.join_result.restore_pending``: before that restore, with
   global_step 0; it waits for the restore before its first ``before_run``.
   With a chief election, a chief duty's hook gets this call again, steps on,
   when its worker gains the lease: :class:`~psflow.train.leader_hooks.LeaderOnlyHook`.)
4. for each step:
   a. ``before_run(context)`` -- a hook may call ``context.request_stop()``;
      if any hook did, the step is *not* run and the loop ends;
   b. the step runs (pull, compute, push);
   c. ``after_run(context, values)`` -- ``values`` is what the step produced;
      ``request_stop()`` here ends the loop after this step.

   Between two steps, after a restore within the run (a ps task lost its state; the worker waited for the
   cluster to be set back to a checkpoint: :class:`~psflow.train.recovery.ClusterRecovery`):
   ``after_restore(session, checkpoint, step)``, before the next ``before_run``.
5. ``end(session)`` -- once, when the loop ends normally (data exhausted or a
   stop requested). Checkpoint and summary hooks save their last state here.
   The session stops at the first ``end()`` that raises: the hooks after it are
   skipped, except those whose :attr:`~SessionRunHook.ends_always` is set (one
   releasing what the session took: the run's checkpoint-directory lock), whose
   ``end()`` still runs; the first exception propagates, a later one is logged.

On an exception (from the step or from a hook) no further hook method runs
(but, after an ``end()`` that raised, the ``ends_always`` hooks' ``end()``):
``end()`` is skipped, so nothing is saved from a failed step, and the
exception propagates out of the session. A hook that raises in ``begin``,
``after_initialize`` or ``after_create_session`` stops the session from
starting; one that raises in ``after_initialize`` leaves the ps tasks not ready
(the chief's next process initializes them again).

Users write their own hooks by subclassing :class:`SessionRunHook` and overriding any of the methods;
the built-in ones are in :mod:`psflow.train.hooks`, which also exports these names.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from psflow.data import BatchSource

if TYPE_CHECKING:
    from psflow.train.session import MonitoredTrainingSession

__all__ = ["RunContext", "RunValues", "SessionRunHook", "StepTimer", "WrappingHook", "duty_of", "end_step"]


@dataclass
class RunContext:
    """Passed to ``before_run``/``after_run``; lets a hook stop the loop.

    Attributes:
        session: the session running the step.
        local_step: steps this session has run before this one.
    """

    session: MonitoredTrainingSession
    local_step: int
    stop_requested: bool = False
    stop_reason: str | None = None

    def request_stop(self, reason: str | None = None) -> None:
        """Ends the loop (before this step in ``before_run``, after it in ``after_run``).

        ``reason``: why, in words (the session's :attr:`~psflow.train.session.MonitoredTrainingSession.stop_reason`,
        a worker's result); the first reason given in a session is kept.
        """
        self.stop_requested = True
        if self.stop_reason is None:
            self.stop_reason = reason


@dataclass(frozen=True)
class RunValues:
    """What one step produced.

    Attributes:
        step: the global_step this step's push produced.
        loss: the batch's mean loss.
        examples: examples in the batch.
        metrics: the model's metrics of the batch (e.g. ``auc``, ``accuracy``;
            see :meth:`psflow.models.Model.metrics`), computed on first access.
        epochs_completed: epochs of this worker's data finished after this
            step, or None if unknown.
        source: where the step's batch came from (files and record ranges),
            or None if unknown.
        completed: this step's push owns ``step`` (sync: it completed the
            aggregation), so only it logs the step.
        min_clock: ssp: the slowest live worker's clock when this one was let go.
    """

    step: int
    loss: float
    examples: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    epochs_completed: int | None = None
    source: BatchSource | None = None
    completed: bool = True
    min_clock: int | None = None


class SessionRunHook:
    """Base class: every method does nothing. See the module docstring for the order. ``duty``: what the hook does
    for the run, in a line that says it was skipped (a chief duty's: :class:`~psflow.train.leader_hooks.LeaderOnlyHook`);
    empty: the class's name."""

    duty: ClassVar[str] = ""

    def begin(self) -> None:
        """Called once before the session joins the cluster."""

    def after_initialize(self, session: MonitoredTrainingSession) -> None:
        """Called on the chief once it initialized a fresh cluster, before the ps tasks are made ready."""

    def after_create_session(self, session: MonitoredTrainingSession) -> None:
        """Called once the cluster is ready (variables initialized or restored)."""

    def after_restore(self, session: MonitoredTrainingSession, checkpoint: str | None, step: int | None) -> None:
        """Called after the cluster was restored within the session (a ps task lost its state: every ps task
        set back to ``checkpoint``, the model of global_step ``step``; None: not known), before the next step;
        global_step itself need not go back (:mod:`psflow.train.recovery`)."""

    def before_run(self, context: RunContext) -> None:
        """Called before each step."""

    def after_run(self, context: RunContext, values: RunValues) -> None:
        """Called after each step that ran."""

    def end(self, session: MonitoredTrainingSession) -> None:
        """Called once when the loop ends without an exception."""

    #: Whether ``end()`` runs also after an earlier hook's ``end()`` raised (a release of what the session took).
    ends_always: bool = False


def duty_of(hook: SessionRunHook) -> str:
    """What ``hook`` does for the run (its :attr:`SessionRunHook.duty`), looked for through
    the hooks that wrap it (``inner``: :class:`~psflow.train.final_eval.FinalEvalOnce`, ...); the innermost hook's
    class name where none says."""
    while not hook.duty and isinstance(getattr(hook, "inner", None), SessionRunHook):
        hook = hook.inner  # type: ignore[attr-defined]
    return hook.duty or type(hook).__name__


class WrappingHook(SessionRunHook):
    """A hook that runs each call of the hook it wraps (``inner``) as that hook does; a subclass changes the calls
    it overrides only (e.g. :class:`~psflow.train.final_eval.FinalEvalOnce`'s ``end()``)."""

    def __init__(self, inner: SessionRunHook) -> None:
        self.inner = inner

    def begin(self) -> None:
        self.inner.begin()

    def after_initialize(self, session: MonitoredTrainingSession) -> None:
        self.inner.after_initialize(session)

    def after_create_session(self, session: MonitoredTrainingSession) -> None:
        self.inner.after_create_session(session)

    def after_restore(self, session: MonitoredTrainingSession, checkpoint: str | None, step: int | None) -> None:
        self.inner.after_restore(session, checkpoint, step)

    def before_run(self, context: RunContext) -> None:
        self.inner.before_run(context)

    def after_run(self, context: RunContext, values: RunValues) -> None:
        self.inner.after_run(context, values)

    def end(self, session: MonitoredTrainingSession) -> None:
        self.inner.end(session)


class StepTimer:
    """Fires every ``every_secs`` seconds or every ``every_steps`` global steps (the built-in hooks' periods)."""

    def __init__(self, every_secs: float | None, every_steps: int | None, what: str) -> None:
        if (every_secs is None) == (every_steps is None):
            raise ValueError(f"{what}: give exactly one of every_secs ({every_secs}) and every_steps ({every_steps})")
        if (every_secs is not None and every_secs <= 0) or (every_steps is not None and every_steps < 1):
            raise ValueError(f"{what}: the period must be positive (secs={every_secs}, steps={every_steps})")
        self.every_secs, self.every_steps = every_secs, every_steps
        self.last_time, self.last_step = time.monotonic(), 0

    def due(self, step: int) -> bool:
        if self.every_steps is not None:
            return step // self.every_steps > self.last_step // self.every_steps
        return time.monotonic() - self.last_time >= (self.every_secs or 0.0)

    def mark(self, step: int) -> None:
        self.last_time, self.last_step = time.monotonic(), step


def end_step(session: MonitoredTrainingSession) -> int:
    """The global_step a hook's ``end()`` records its last point or evaluation at: ps task 0's where it is ready;
    where it is not (restarted and not loaded yet: its global_step 0, a restore to follow; or in a restore), the
    last step this session knows (:attr:`~psflow.train.session.MonitoredTrainingSession.global_step`), never the
    restarted task's 0.

    Raises:
        RpcError: ps task 0's ``Stats`` could not be read (as :meth:`~psflow.ps.client.ParameterClient.global_step`).
    """
    head = session.client.ps_stats()
    return head.global_step if head.ready and head.global_step is not None else session.global_step
