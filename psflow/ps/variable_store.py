"""The variables of one ps task: the registered layout, optimizer and update mode, the partitions this task
holds (:class:`~psflow.ps.store.ParameterStore`: values, optimizer slots, dynamic tables) and their moving
averages.

Registration (``Register``, :class:`~psflow.ps.protocol.RegisterRequest`):
only the chief's call creates the partitions, from their initializers: the
one initialization of this task (a bad spec leaves nothing created). Once a
layout is recorded, every later call is compared with it and refused with
FAILED_PRECONDITION naming the first differing variable (or the optimizer, or
the update mode). A chief call on a task that is registered but not yet ready
with no restore in progress (a chief died while initializing it or restoring
it at start, which sends no ``BeginRestore``) creates the partitions again. While a restore is in
progress (``BeginRestore`` until ``SetReady``, :attr:`~psflow.ps.restore_gate.RestoreGate.restoring`)
a chief call creates nothing: what ``LoadShard`` loaded stays, so the restore
never makes the task ready holding initial values. Nor does a late copy of the chief's call that created them
once a load wrote them, nor one of an earlier call or process of that chief
(:meth:`~psflow.ps.restore_gate.RestoreGate.superseded`: a resent call's first copy served last). Registrations
are serialized; each partition has its own lock for updates and reads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from psflow.optim import OptimizerSpec
from psflow.placement import VariablePlacement, layout_mismatch
from psflow.ps.averages import MovingAverages
from psflow.ps.dynamic import DynamicTable, share_spec
from psflow.ps.optimizers import make_optimizer
from psflow.ps.protocol import RegisterRequest
from psflow.ps.store import ParameterStore, PartitionState, StoreError
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import InvalidRequest, PreconditionFailed

__all__ = ["VariableStore"]

log = logging.getLogger("psflow.ps.service")


class VariableStore:
    """Layout, optimizer, update mode, partitions and moving averages of one ps task."""

    def __init__(self, task_index: int, *, holds_global_step: bool) -> None:
        """Args:
            task_index: this ps task (partitions placed on it are created here).
            holds_global_step: global_step lives here (its averages never skip a step).
        """
        self.task_index = task_index
        self.task_name = f"/job:ps/task:{task_index}"
        self._holds_step = holds_global_step
        self._lock = threading.Lock()
        #: The partitions this task holds (replaced, whole, by each initialization).
        self.partitions = ParameterStore()
        #: The moving averages' clock; off the step task (async) they catch up the steps with no push here.
        self.averages = MovingAverages(self.task_name, catch_up=not holds_global_step)
        self._layout: list[VariablePlacement] | None = None
        self._optimizer: OptimizerSpec | None = None
        #: The registered update mode (async until registered).
        self.sync = SyncConfig()
        #: How many times this process initialized the variables (the chief's calls that created them).
        self.init_count = 0
        self._cpu_at_init = 0.0

    @property
    def registered(self) -> bool:
        """Whether the chief has registered (and created) the variables here."""
        return self._layout is not None

    @property
    def optimizer(self) -> OptimizerSpec | None:
        """The run's optimizer (None before registration)."""
        return self._optimizer

    def register(self, request: RegisterRequest, *, ready: Callable[[], bool], restoring: Callable[[], bool],
                 created: Callable[[], None], superseded: Callable[[], str | None] | None = None) -> bool:
        """A client's ``Register``: True if this call created the partitions.

        ``ready`` says whether the task is ready, ``restoring`` whether a restore is in progress (a registered
        task that is either is never initialized again: its values are trained or being loaded); ``superseded``
        why a chief's call on a registered task that is neither creates nothing all the same (a late copy of the
        creating call, loaded on since, or of an earlier call of its client: logged, WARNING), None where it may;
        ``created`` runs after a creation, still inside the registration (before any other call registers).

        Raises:
            InvalidRequest: a variable's spec cannot be built (names it); nothing is created.
            PreconditionFailed: the layout, optimizer or update mode differs from the registered one.
        """
        layout, client = list(request.layout), request.client
        with self._lock:
            if self._layout is None and not request.chief:
                return False
            if self._layout is not None:
                diff = layout_mismatch(self._layout, layout)
                if diff is not None:
                    raise PreconditionFailed(f"{client} has a different model layout: {diff}")
                if self._optimizer != request.optimizer:
                    registered = self._optimizer.to_json() if self._optimizer else None
                    raise PreconditionFailed(f"{client} uses optimizer {request.optimizer.to_json()}, "
                                             f"registered: {registered}")
                if request.sync != self.sync:
                    raise PreconditionFailed(f"{client} uses update mode {request.sync.to_json()}, registered: "
                                             f"{self.sync.to_json()}")
                if ready() or restoring() or not request.chief:
                    return False
                late = superseded() if superseded is not None else None
                if late is not None:
                    log.warning("%s", late)
                    return False
            self.partitions = self._create(layout, request.optimizer)
            # Every task applies every step in sync mode: its averages never skip one.
            self.averages = MovingAverages(self.task_name, catch_up=not self._holds_step and request.sync.mode != "sync")
            self._layout, self._optimizer, self.sync = layout, request.optimizer, request.sync
            self.init_count += 1
            self._cpu_at_init = time.process_time()
            created()
            log.info("%s: initialized %d partitions for %s", self.task_name, len(self.partitions.keys()), client)
            return True

    def _create(self, layout: list[VariablePlacement], default: OptimizerSpec) -> ParameterStore:
        """This task's partitions of ``layout``, built whole first, so a bad spec leaves the store as it was."""
        fresh = ParameterStore()
        for placement in layout:
            var = placement.var
            try:
                spec = OptimizerSpec.from_json(var.optimizer) if var.optimizer else default
                opt = make_optimizer(spec) if var.trainable else None
                for part in placement.partitions:
                    if part.task != self.task_index:
                        continue
                    if var.dynamic is not None:
                        share = share_spec(var.name, var.shape[1], var.dynamic, optimizer=spec if var.trainable else None,
                                           initializer=var.initializer, num_shares=len(placement.partitions))
                        fresh.create_dynamic(DynamicTable(share), part.index, opt)
                    else:
                        fresh.create(var.name, part.index, tuple(var.shape), part.row_start, part.row_stop,
                                     var.dtype, dict(var.initializer), opt,
                                     average_decay=var.moving_average_decay if opt is not None else None)
            except ValueError as e:
                raise InvalidRequest(f"variable {var.name!r}: {e}") from e
        return fresh

    def part(self, key: object) -> PartitionState:
        """The partition named ``key``.

        Raises:
            InvalidRequest: no such partition here (names it).
        """
        if not isinstance(key, str):
            raise InvalidRequest(f"variable name must be a string, got {key!r:.40}")
        try:
            return self.partitions.get(key)
        except StoreError as e:
            raise InvalidRequest(str(e)) from e

    def registration(self) -> RegisterRequest | None:
        """The registered layout, optimizer and update mode as a chief's request (None before registration):
        what a replicated shard's backup registers with (:mod:`psflow.ps.replication`)."""
        with self._lock:
            if self._layout is None or self._optimizer is None:
                return None
            return RegisterRequest(tuple(self._layout), self._optimizer, self.sync, self.task_name, chief=True)

    def forget(self) -> None:
        """Drops the registration and the partitions (a replicated shard's member rebuilding from its
        primary's snapshot)."""
        with self._lock:
            self._layout, self._optimizer, self.sync = None, None, SyncConfig()
            self.partitions = ParameterStore()

    def cpu_seconds_since_init(self) -> float | None:
        """CPU seconds of this process since the newest initialization (None before the first)."""
        return time.process_time() - self._cpu_at_init if self.init_count else None

    def learning_rate(self, step: int) -> float | None:
        """The run's optimizer's learning rate at ``step`` (None before registration). Variables with an
        optimizer of their own may use other rates."""
        spec = self._optimizer
        return None if spec is None else spec.learning_rate_at(step)
