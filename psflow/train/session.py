"""MonitoredTrainingSession: a training loop's session, with hooks and chief duties.

Use as a context manager::

    with MonitoredTrainingSession(client, optimizer, is_chief=chief, checkpoint_dir=ckpt,
                                  hooks=[...]) as session:
        while not session.should_stop():
            batch = next(batches)
            session.run(functools.partial(step, batch))   # step = TrainStep(model, client)

In order:
    1. ``__enter__``: every hook's ``begin()``; then the session joins the
       cluster (:func:`psflow.train.chief.join_cluster`): the chief
       initializes the variables or restores the newest checkpoint in
       ``checkpoint_dir``, other workers wait for it (bounded backoff). A chief
       that initialized a fresh cluster runs every hook's
       ``after_initialize(session)`` before it makes the ps tasks ready (the
       initial checkpoint: no other worker has pushed yet); then every hook's
       ``after_create_session(session)``.
    2. :meth:`run`: ``before_run`` hooks (a stop requested there skips the
       step), the step, ``after_run`` hooks (a stop requested there ends the
       loop after this step). :meth:`should_stop` says whether to go on and
       :attr:`stop_reason` why not: the hooks decide when a loop stops
       (``max_steps`` is :class:`~psflow.train.hooks.StopAtStepHook`'s), the
       loop only reads their decision.
    3. ``__exit__`` without an exception: every hook's ``end(session)``
       (final checkpoint and summaries), up to the first that raises; after it,
       only the hooks whose ``ends_always`` is set (the release of the run's
       checkpoint-directory lock: :mod:`psflow.train.duties`), their errors
       logged; the first exception propagates. With an exception: no hook runs;
       the exception propagates.

Chief-only hooks (``chief_only_hooks``) are dropped on non-chief workers, as
TensorFlow's MonitoredTrainingSession does. Not thread-safe: one session per
training thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Protocol, TypeVar

import numpy as np

from psflow.coord import Lease
from psflow.data import BatchSource
from psflow.optim import OptimizerSpec
from psflow.ps.client import ParameterClient
from psflow.train.chief import JoinResult, join_cluster
from psflow.train.hooks import RunContext, RunValues, SessionRunHook

__all__ = ["MonitoredTrainingSession", "StepReport"]

log = logging.getLogger("psflow.session")


class StepReport(Protocol):
    """What the session reads from a step function's result for its hooks (:class:`~psflow.train.hooks.RunValues`):
    e.g. :class:`psflow.train.step.StepResult` (a worker's step),
    :class:`psflow.train.in_graph_client.InGraphStepResult` (an in-graph client's batch)."""

    @property
    def step(self) -> int: ...
    @property
    def loss(self) -> float: ...
    @property
    def examples(self) -> int: ...
    @property
    def metrics(self) -> Mapping[str, float]: ...
    @property
    def completed(self) -> bool: ...
    @property
    def min_clock(self) -> int | None: ...


R = TypeVar("R", bound=StepReport)


class MonitoredTrainingSession:
    """Runs training steps between hooks; see the module docstring for the lifecycle."""

    def __init__(
        self,
        client: ParameterClient,
        optimizer: OptimizerSpec,
        *,
        is_chief: bool,
        checkpoint_dir: str | None = None,
        hooks: Sequence[SessionRunHook] = (),
        chief_only_hooks: Sequence[SessionRunHook] = (),
        ready_timeout: float | None = None,
        warm_start: str | None = None,
        initial_values: Callable[[], Mapping[str, np.ndarray]] | None = None,
        leader: Callable[[], Lease | None] | None = None,
        run: str | None = None,
    ) -> None:
        """Args:
            client: a connected client (not yet registered).
            optimizer: the model's optimizer (registered by the session).
            is_chief: whether this worker is the chief.
            checkpoint_dir: where the chief restores from (hooks save there).
            hooks: hooks run on every worker.
            chief_only_hooks: hooks run only on the chief.
            ready_timeout: seconds a non-chief waits for the chief to initialize.
            warm_start: (chief) variables loaded when it initializes a fresh cluster
                (see :func:`psflow.train.chief.join_cluster`).
            initial_values: (chief) the model's own initial values, loaded when
                it initializes a fresh cluster (see :func:`psflow.train.chief.join_cluster`).
            leader: (chief) its lease now, and ``run`` the run's id: a restore adopts the checkpoint it reads
                at the lease's epoch (see :func:`psflow.train.chief.join_cluster`).
            run: the run's id.
        """
        self.client = client
        self.is_chief = is_chief
        self.checkpoint_dir = checkpoint_dir
        self.hooks: list[SessionRunHook] = [*hooks, *(chief_only_hooks if is_chief else ())]
        self._optimizer = optimizer
        self._ready_timeout = ready_timeout
        self._warm_start = warm_start
        self._initial_values = initial_values
        self._leader, self._run = leader, run
        self._stop = False
        self._stop_reason: str | None = None
        self._local_step = 0
        self.global_step = 0
        self.join_result: JoinResult | None = None

    @property
    def reader_position(self) -> str | None:
        """This worker's ReaderPosition JSON to resume its data from, or None (valid after ``__enter__``)."""
        return self.join_result.reader_position if self.join_result else None

    @property
    def reader_positions(self) -> Mapping[str, str]:
        """Every client's ReaderPosition JSON the ps tasks held when this session joined, by client name
        (valid after ``__enter__``; empty before)."""
        return self.join_result.reader_positions if self.join_result else {}

    def __enter__(self) -> MonitoredTrainingSession:
        for hook in self.hooks:
            hook.begin()
        self.join_result = join_cluster(self.client, self._optimizer, chief=self.is_chief,
                                        checkpoint_dir=self.checkpoint_dir, ready_timeout=self._ready_timeout,
                                        warm_start_from=self._warm_start, initial_values=self._initial_values,
                                        leader=self._leader, run=self._run,
                                        initialized=self._initialized if self.is_chief else None)
        self.global_step = self.join_result.global_step
        for hook in self.hooks:
            hook.after_create_session(self)
        return self

    def restored(self, checkpoint: str | None, step: int | None) -> None:
        """Every hook's ``after_restore``: the cluster was restored within this session, from ``checkpoint`` (None:
        not known) at ``step`` (:class:`~psflow.train.recovery.ClusterRecovery` calls it, before the next step)."""
        for hook in self.hooks:
            hook.after_restore(self, checkpoint, step)

    def _initialized(self) -> None:
        """(Chief, fresh cluster, not yet ready) every hook's ``after_initialize``."""
        for hook in self.hooks:
            hook.after_initialize(self)

    def should_stop(self) -> bool:
        """True once a hook requested a stop (the loop ends; :attr:`stop_reason` says why)."""
        return self._stop

    @property
    def stop_reason(self) -> str | None:
        """Why the session stopped, as the first hook that stopped it said (None: not stopped, or no reason
        given; e.g. :class:`~psflow.train.hooks.StopAtStepHook`'s ``"global_step reached max_steps=N"``)."""
        return self._stop_reason

    def request_stop(self, reason: str | None = None) -> None:
        """Ends the loop before the next step; the first ``reason`` given is :attr:`stop_reason`."""
        self._stop = True
        if self._stop_reason is None:
            self._stop_reason = reason

    def run(self, step_fn: Callable[[], R | None], *, epochs_completed: int | None = None,
            source: BatchSource | None = None) -> R | None:
        """Runs one step between the hooks.

        Args:
            step_fn: runs the step (pull, compute, push) and returns its result; or None when no step
                completed in this call (:class:`psflow.train.pipeline.PipelinedStep` filling up): then no
                ``after_run`` hook runs.
            epochs_completed: epochs of this worker's data done after the result's batch
                (for :class:`~psflow.train.hooks.StopAfterEpochsHook`).
            source: where the result's batch came from (:attr:`psflow.data.Batch.source`),
                for the hooks (:class:`~psflow.train.hooks.NanLossHook` names it).

        Returns:
            What ``step_fn`` returned, or None if a ``before_run`` hook stopped the loop.
        """
        context = RunContext(self, self._local_step)
        for hook in self.hooks:
            hook.before_run(context)
        if context.stop_requested:
            self.request_stop(context.stop_reason)
            return None
        result = step_fn()
        if result is not None:
            self._after(context, result, epochs_completed, source)
        return result

    def report(self, result: StepReport, *, epochs_completed: int | None = None,
               source: BatchSource | None = None) -> None:
        """Runs the ``after_run`` hooks for a step that completed outside :meth:`run` (the pushes a
        pipelined step collects at the end of the loop, :meth:`psflow.train.pipeline.PipelinedStep.drain`).
        A stop a hook requests is recorded as in :meth:`run`."""
        self._after(RunContext(self, self._local_step), result, epochs_completed, source)

    def _after(self, context: RunContext, result: StepReport, epochs_completed: int | None,
               source: BatchSource | None) -> None:
        values = RunValues(result.step, result.loss, result.examples, result.metrics, epochs_completed, source,
                           result.completed, result.min_clock)
        self._local_step += 1
        self.global_step = max(self.global_step, values.step)
        for hook in self.hooks:
            hook.after_run(context, values)
        if context.stop_requested:
            self.request_stop(context.stop_reason)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is not None:
            log.warning("%s: session ended by %s; hooks' end() skipped", self.client.client_name, exc_type.__name__)
            return
        rest = iter(self.hooks)
        try:
            for hook in rest:
                hook.end(self)
        finally:  # one raised: the hooks left that end always (a lock's release), that error propagating
            for hook in (h for h in rest if h.ends_always):
                try:
                    hook.end(self)
                except Exception as e:  # noqa: BLE001 - the first error is the one raised
                    log.error("%s: %s's end() failed too: %s", self.client.client_name, type(hook).__name__, e)
