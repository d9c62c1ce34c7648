"""A push applied to one ps task's state: admitted, checked whole, applied (async, ssp) or aggregated (sync), counted.

:class:`PushApplier` is the ``Push`` half of :class:`~psflow.ps.service.ParameterService` (and of a
replicated primary's, :mod:`psflow.ps.replication.data_calls`), over the service's parts. Guarantees of
:meth:`PushApplier.apply`, in this order:

1. **Admission.** The worker's process (:meth:`~psflow.ps.worker_ledger.WorkerLedger.admit`: an earlier
   incarnation is refused), then its generation (:meth:`~psflow.ps.restore_gate.RestoreGate.admit`: a push
   from before a restore is refused). Both are released when the call ends, whatever it raised.
2. **All or nothing.** Every gradient is checked against its partition (shape, rows, dtype) before any is
   applied; a refused push (:class:`~psflow.rpc.api.InvalidRequest`, naming the task and the variable)
   changes nothing.
3. **Async and ssp.** Each gradient is applied under its partition's lock at the step before this push's
   increment (a schedule's step, the dynamic tables' clock); then global_step is incremented once (``step``
   set: the task holding it) and the moving averages move; the dynamic tables the push touched drop rows past
   their ``ttl_steps`` (a bounded slice each); the push is counted (rows, bytes, loss, apply time, the
   worker's examples and reader position). An ssp push that steps global_step must carry its worker's clock
   (checked before anything is applied); once applied it advances that clock and returns the slowest worker's
   (blocking while this worker is too far ahead: :mod:`psflow.ps.staleness`) -- or, with ``wait=False`` (a
   replicated primary, which records the push first), leaves that to :meth:`PushApplier.wait_for_slowest`.
4. **Sync.** The push is handed to the :class:`~psflow.ps.sync.SyncAggregator` (SyncReplicas semantics, which
   may block it: :mod:`psflow.ps.sync`) and counted when accepted, unless the update mode counts at the step.

Thread-safe: each part holds its own lock; no lock of this class.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from psflow.optim.spec import OptimizerError
from psflow.ps.counters import ServiceCounters
from psflow.ps.protocol import PushReply, PushRequest
from psflow.ps.restore_gate import RestoreGate
from psflow.ps.staleness import Waited
from psflow.ps.step_clock import StepClock
from psflow.ps.store import PartitionState, StoreError
from psflow.ps.sync import Contribution
from psflow.ps.update_mode import UpdateMode
from psflow.ps.variable_store import VariableStore
from psflow.ps.worker_ledger import WorkerLedger
from psflow.rpc.api import InvalidRequest

__all__ = ["Planned", "PushApplier"]

#: One partition's part of a push: the partition, its rows (None: dense) and the gradient.
Planned = tuple[PartitionState, np.ndarray | None, np.ndarray]


class PushApplier:
    """Applies pushes to one ps task's parts (the module docstring states the guarantees)."""

    def __init__(self, *, variables: VariableStore, clock: StepClock, workers: WorkerLedger, gate: RestoreGate,
                 mode: UpdateMode, counters: ServiceCounters) -> None:
        self._variables, self._clock, self._workers = variables, clock, workers
        self._gate, self._mode, self._counters = gate, mode, counters

    def apply(self, request: PushRequest, *, wait: bool = True) -> PushReply:
        """Admits the push (its worker's process, then its generation), applies it, releases it.

        Blocks in sync mode until the push's step is applied, and in ssp mode while its worker is too far ahead
        (``wait``; False: returns once applied, ``min_clock`` unset, and the caller calls
        :meth:`wait_for_slowest` -- a replicated primary records the push in between, so no entry holds an
        ssp push's rows without its dedup record).

        Raises:
            InvalidRequest: a gradient that does not fit its partition, a step asked of a task without
                global_step, or a sync or ssp push without the fields its mode needs; nothing was applied.
            PreconditionFailed: (from the worker ledger or the gate) an earlier process's push, or one of an
                earlier generation, or one before the task is ready.
        """
        worker = request.worker.worker
        self._workers.admit(worker, request.worker.incarnation)
        try:
            self._gate.admit(request.worker.generation)
        except BaseException:
            self._workers.release(worker)
            raise
        try:
            return self._apply(request, wait)
        finally:
            self._gate.release()
            self._workers.release(worker)

    def count(self, request: PushRequest, plan: list[Planned], seconds: float = 0.0) -> None:
        """Counts an applied push: its rows, bytes, loss and apply time; its worker's examples and position."""
        rows = sum(g.shape[0] if r is not None else 0 for _, r, g in plan)
        nbytes = sum(g.nbytes + (r.nbytes if r is not None else 0) for _, g, r in request.grads)
        self._counters.pushed(rows, nbytes, request.loss, seconds)
        self._workers.record_push(request.worker.worker, request.worker.position, request.examples)

    def wait_for_slowest(self, request: PushRequest) -> Waited | None:
        """(ssp) Advances the pushing worker's clock to the push's and blocks while it is more than
        ``staleness`` ahead of the slowest live worker; returns the slowest worker's clock then, or
        held: it waited ``timeout`` s while that worker saves a checkpoint (:mod:`psflow.ps.staleness`).
        Idempotent (a clock never goes back), so a push answered again (a resend) waits the same way. None at
        once: not an ssp push that steps global_step on this task.

        Raises:
            InvalidRequest: the push's worker is not one of the run's workers, or it carries no clock.
            PreconditionFailed: (``on_timeout="fail"``) the slowest worker made no progress in time.
        """
        staleness = self._mode.staleness
        if (self._mode.config.mode != "ssp" or staleness is None or not request.step
                or self._clock.global_step is None):
            return None
        clock_value = request.steps.clock
        if clock_value is None:
            raise InvalidRequest("an ssp push must carry the worker's clock")
        return staleness.advance(_worker(request.worker.worker), clock_value)

    def _apply(self, request: PushRequest, wait: bool) -> PushReply:
        variables, clock = self._variables, self._clock
        store = variables.partitions
        plan: list[Planned] = []
        for key, grad, rows in request.grads:  # every gradient checked before any is applied
            part = variables.part(key)
            try:
                if rows is None:
                    store.check_dense(part, grad)
                else:
                    store.check_sparse(part, rows, grad)
            except StoreError as e:
                raise InvalidRequest(str(e)) from e
            plan.append((part, rows, grad))
        if request.step and clock.global_step is None:
            raise InvalidRequest("global_step does not live on this task (it is on /job:ps/task:0)")
        mode = self._mode.config.mode
        if not plan and not request.step and mode != "sync":
            return PushReply(None)  # the pull-only half of a PushPull
        if mode == "sync":
            return self._push_sync(request, plan)
        if mode == "ssp" and request.step and request.steps.clock is None and self._mode.staleness is not None:
            raise InvalidRequest("an ssp push must carry the worker's clock")  # before anything is applied
        staleness = self._mode.staleness
        if mode == "ssp" and wait and request.step and staleness is not None:
            again, took = staleness.resent(_worker(request.worker.worker), request.steps.clock,
                                           request.worker.incarnation)
            if again:  # sent again after a held answer: applied and counted then; its wait goes on
                return self._waited(PushReply(took), request, took)
        read_step = request.steps.read_step
        clock.hear(request.steps.step_hint)
        started = time.perf_counter()
        table_step = clock.table_step()  # before this push's increment: a schedule's step, the tables' clock
        _check_rates(plan, table_step)
        variables.averages.catch_up(store.partitions(), table_step)  # steps without a push here (psflow.ps.averages)
        for part, rows, grad in plan:
            if rows is None:
                store.apply_dense(part, grad, step=table_step)
            else:
                store.apply_sparse(part, rows, grad, step=table_step)
        step = clock.global_step.increment() if request.step and clock.global_step is not None else None
        variables.averages.move(store.partitions(), step if step is not None else table_step + 1)
        applied = time.perf_counter() - started
        self._sweep_tables(plan)
        self.count(request, plan, applied)
        if step is not None and read_step is not None:
            self._counters.stale_by(step - 1 - read_step)
        return self._waited(PushReply(step), request, step) if wait and mode == "ssp" else PushReply(step)

    def _waited(self, reply: PushReply, request: PushRequest, step: int | None) -> PushReply:
        """(ssp, unreplicated) ``reply`` once the push's wait for the slowest worker ended, or held."""
        waited = self.wait_for_slowest(request)
        if waited is None:
            return reply
        if waited.held and self._mode.staleness is not None:
            self._mode.staleness.held(_worker(request.worker.worker), request.steps.clock or 0, step,
                                      request.worker.incarnation)
        return dataclasses.replace(reply, min_clock=waited.min_clock, held=waited.held)

    def _push_sync(self, request: PushRequest, plan: list[Planned]) -> PushReply:
        aggregator = self._mode.aggregator
        if aggregator is None:
            raise InvalidRequest("variables are not registered yet")
        tag = request.steps.sync_tag
        if tag is None:
            raise InvalidRequest("a sync push must carry the step it was computed from ('tag')")
        self._clock.hear(tag)
        _check_rates(plan, self._mode.schedule_step())
        result = aggregator.contribute(tag, Contribution(_worker(request.worker.worker), plan, request))
        # A push answered held is counted then (its gradient is in the step, and its client may be gone before it
        # sends it again); sent again, it is not counted again (psflow.ps.save_hold).
        if result.accepted and not result.counted and not self._mode.counts_at_step:  # (else counted with its step)
            self.count(request, plan)
        return PushReply(result.step, result.accepted, result.completed, aggregated=True, held=result.held)

    def _sweep_tables(self, plan: list[Planned]) -> None:
        """Drops rows past their ttl_steps from the dynamic tables this push touched (a bounded slice each)."""
        for part, _, _ in plan:
            if part.table is not None and part.table.spec.ttl_steps is not None:
                part.table.evict(self._clock.table_step())


def _check_rates(plan: list[Planned], step: int) -> None:
    """Refuses the push before anything is applied if a partition's optimizer refuses its scheduled rate at ``step``
    (FTRL's rate decayed below float32's smallest normal number: :meth:`~psflow.ps.optimizer_base.Optimizer.learning_rate`).

    Raises:
        InvalidRequest: naming the optimizer, the schedule, its flag and the step.
    """
    for part, _, _ in plan:
        if part.optimizer is not None and part.optimizer.schedule is not None:
            try:
                part.optimizer.learning_rate(step)
            except OptimizerError as e:
                raise InvalidRequest(str(e)) from e


def _worker(worker: str | None) -> str:
    """The pushing worker's task name, which sync and ssp pushes must carry."""
    if worker is None:
        raise InvalidRequest("push must name its worker task")
    return worker
