"""ParameterService: the RPC handlers of a ps task.

Methods (each takes and returns a frame holding one message of :mod:`psflow.ps.protocol`; the
fields below are those messages'):

``Register``
    ``meta = {"layout": [VariablePlacement JSON...], "optimizer": OptimizerSpec JSON, "client": task,
    "chief": bool, "defer_ready": bool}``. Only the chief's call initializes:
    it records the layout and creates this task's partitions from their
    initializers (the one initialization of this task), and marks the task
    ready unless ``defer_ready`` (the chief then restores a checkpoint with
    ``LoadShard`` and sends ``SetReady``). A non-chief call before that gets
    ``{"ready": false}`` (retryable: the client waits with bounded backoff);
    once a layout is recorded, every later call compares its layout with it
    and is refused with FAILED_PRECONDITION naming the first differing
    variable. A chief call on a task that is registered but not yet ready
    (the chief died mid-restore) initializes again. Idempotent otherwise.
``SaveShard``, ``LoadShard``, ``SetReady``, ``ReaderPositions``
    checkpoints and the chief's protocol: :mod:`psflow.ps.checkpointing`.
    A push whose meta has ``worker`` and ``position`` (ReaderPosition JSON)
    records it as that worker's reader position.
``Pull``
    ``meta = {"vars": [[key, rows_array_name | null], ...], "create": bool, "averages": bool}`` -> arrays
    ``{key: values}`` (``averages``: an averaged partition's moving average instead of its value).
    A dynamic table's partition (:mod:`psflow.ps.dynamic`) is read by ids only:
    ids without a row read as zeros; with ``create`` (a training lookup) the
    ids' sightings are counted and admitted ids get rows (possibly evicting
    others to stay within the table's capacity).
``Push``
    ``meta = {"grads": [[key, "dense" | "sparse"], ...], "step": bool, "examples": n, "loss": x}``,
    arrays ``g/<key>`` (values) and ``i/<key>`` (sparse rows). Every gradient is
    validated before any is applied; then each is applied under its
    partition's lock; then, if ``step`` is set (only on the task holding
    global_step), global_step is incremented once and the new value returned.
    A dynamic table's gradient applies to the ids that have a row (the others
    are dropped and counted); after the push, rows older than the table's
    ``ttl_steps`` are swept (a bounded slice of the table per push).

Dynamic tables keep time in global steps: on the task holding global_step,
its value; elsewhere the newest ``step_hint`` a client sent (the newest step it
heard of) -- so a row's age is never over-estimated.
Learning-rate schedules (:mod:`psflow.ps.schedules`) read the same clock when a
push is applied: on the task holding global_step, its value before the push's
increment (TF's order); elsewhere the newest step the clients reported, which
is that value when one worker pushes, and may lag it by the pushes in flight
when several do (as TF's workers read global_step for the rate before their
updates land). In sync mode a schedule is read at the aggregated step (each
task counts its applied steps), once per step.
Moving averages (:mod:`psflow.ps.averages`) move after each applied step, on
every task holding an averaged partition, at the step after the increment:
ps task 0's counter, one past the newest reported step elsewhere, the
aggregated step in sync mode. A pull with ``"averages": true`` (evaluation)
reads each averaged partition's moving average instead of its value.
``BeginRestore``
    recovery after a ps task died (:mod:`psflow.ps.checkpointing`): stops
    accepting pushes of the old *generation* and waits for the ones in flight.
``Stats``
    counters for progress lines and metrics (``ready``, ``registered``,
    ``generation``, ``global_step`` tell a worker whether a restore happened;
    ``step_floor`` bounds every step an earlier process of this task handed out;
    ``finished`` lists the workers whose ``Leave`` arrived since the last restore;
    ``dynamic_tables``, when there are any: each share's rows and counters, by partition key;
    ``learning_rate``: the run's optimizer's learning rate at the step the next update is applied at).
``Leave``
    ``meta = {"worker": task}``: that worker finished its data (sync and ssp
    stop waiting for it).

Generations: every restore from a checkpoint after a ps death gives the
cluster a new generation number (``SetReady`` carries it). A push that
carries ``generation`` is refused with FAILED_PRECONDITION, before anything
is applied, when the task is not ready (being restored) or holds another
generation: the worker's data position belongs to a model state that was
rewound, so it must re-read its position first (see :mod:`psflow.train.recovery`).

Incarnations: each worker process picks one (``time.time_ns()`` at start, so a
restarted worker's is higher) and sends it with every push and with its
``ReaderPositions`` request (``meta = {"worker": task, "incarnation": n}``).
A task refuses, with FAILED_PRECONDITION and before anything is applied, a
push carrying a lower incarnation than the highest it saw for that worker; a
``ReaderPositions`` request with an incarnation records it and first waits
(at most 5 s) for that worker's pushes in flight. So a push of a replaced worker
process that the network delivers late (its socket's data sent after a link
heals) is never applied after the new process read its position: each record
stays counted once.
``Shutdown``
    asks the task to stop serving (its ``Server.join()`` returns).

Guarantees: a refused request (INVALID_ARGUMENT, naming the task and the
variable) leaves every variable unchanged; the server keeps serving.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from psflow.coord.api import FencedError
from psflow.coord.fence import FenceGuard
from psflow.placement import VariablePlacement, layout_mismatch
from psflow.ps.averages import MovingAverages
from psflow.ps.checkpointing import CheckpointHandlers
from psflow.ps.dynamic import DynamicTable, share_spec
from psflow.ps.global_step import GlobalStep, StepJournal
from psflow.ps.optimizers import OptimizerSpec, make_optimizer
from psflow.ps.protocol import (
    Ack,
    FenceReply,
    FenceRequest,
    LeaveRequest,
    PullReply,
    PullRequest,
    PushPullReply,
    PushPullRequest,
    PushReply,
    PushRequest,
    RegisterReply,
    RegisterRequest,
    StatsReply,
)
from psflow.ps.store import ParameterStore, PartitionState, StoreError
from psflow.ps.sync import Contribution, StalenessClock, SyncAggregator, SyncConfig
from psflow.rpc.api import Handler, InvalidRequest, PreconditionFailed, Reply
from psflow.rpc.framing import Frame

__all__ = ["ParameterService"]

log = logging.getLogger(__name__)

_LOSS_EMA = 0.05


class ParameterService:
    """State and handlers of one ps task."""

    def __init__(self, task_index: int, *, holds_global_step: bool, on_shutdown: Callable[[], None] | None = None,
                 step_journal: StepJournal | None = None, checkpoint_root: str | None = None,
                 confine_shards: bool = False) -> None:
        """Creates an empty service.

        Args:
            task_index: this ps task's index (partitions with this ``task`` are created here).
            holds_global_step: whether global_step lives here (ps task 0).
            on_shutdown: called (once) when a Shutdown request arrives.
            step_journal: where global_step's bound survives a restart of this
                task (see :mod:`psflow.ps.global_step`); ignored unless it holds global_step.
            checkpoint_root: with ``confine_shards``, the only directory under
                which ``SaveShard`` writes (``None``: it writes no file).
            confine_shards: enforce ``checkpoint_root`` (a served task, see
                :class:`psflow.server.Server`); False (an in-process service no
                peer can reach): ``SaveShard`` writes where its caller says.

        Raises:
            StepJournalError: the journal file is damaged.
        """
        self.task_index = task_index
        self.task_name = f"/job:ps/task:{task_index}"
        self.store = ParameterStore()
        self.global_step = GlobalStep(journal=step_journal) if holds_global_step else None
        self._layout: list[VariablePlacement] | None = None
        self._optimizer: OptimizerSpec | None = None
        self.sync_config = SyncConfig()
        # In sync mode every task counts its own applied steps (ps 0's counter is global_step).
        self._sync_step = self.global_step if self.global_step is not None else GlobalStep()
        self.aggregator: SyncAggregator | None = None
        self.staleness_clock: StalenessClock | None = None
        # Shadows of the averaged partitions move after each step; off the step task they catch up skipped steps.
        self.averages = MovingAverages(self.task_name, catch_up=not holds_global_step)
        # staleness (global_step at apply - step the worker read) -> pushes, on the task holding global_step
        self.staleness_histogram: dict[int, int] = {}
        self._register_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._on_shutdown = on_shutdown
        self._checkpoint_root, self._confine_shards = checkpoint_root, confine_shards
        # Highest chief epoch seen; fenced writes (checkpoints) check it (psflow.coord.fence).
        self.fence = FenceGuard(self.task_name)
        self.init_count = 0
        self._cpu_at_init = 0.0
        # Set once the chief has initialized or restored this task (see register).
        self.ready = False
        # Restore generation (0 until a restore after a ps death); pushes naming another one are refused.
        self.generation = 0
        # Pushes being applied, so a restore can wait for them (BeginRestore); guarded by _gate.
        self._gate = threading.Condition(threading.Lock())
        self._inflight = 0
        self._inflight_of: dict[str, int] = {}  # worker task -> its pushes being applied (or waiting, in sync)
        # worker task -> highest incarnation (process) seen; pushes of an earlier one are refused. Guarded by _gate.
        self._incarnations: dict[str, int] = {}
        # client task -> newest ReaderPosition JSON it pushed with (task holding global_step).
        self._positions: dict[str, str] = {}
        # Workers that told this task (the one holding global_step) they finished their data, since
        # the last restore; a restore clears it, as it rewinds every worker to the checkpoint.
        self._finished: set[str] = set()
        self.stats: dict[str, float] = {
            "pulls": 0, "pushes": 0, "rows_pulled": 0, "rows_pushed": 0,
            # loss_ema: the pushes' losses, moving average; last_loss: the newest push's (the last step's)
            "examples": 0, "loss_ema": float("nan"), "last_loss": float("nan"), "bytes_in": 0, "bytes_out": 0,
            # time this task spent gathering pulled rows and applying async pushes (profile_wd_step.py)
            "read_seconds": 0.0, "apply_seconds": 0.0,
        }
        self.started = time.time()
        # Newest global_step a client reported ("step_hint"): the dynamic tables' clock off the step task.
        self._heard_step = 0

    def handlers(self) -> dict[str, Handler]:
        """Method name -> handler, for a carrier's server (:func:`psflow.rpc.registry.serve`)."""
        return {
            "Register": self.register,
            "Pull": self.pull,
            "Push": self.push,
            "PushPull": self.push_pull,
            "Stats": self.get_stats,
            "Leave": self.leave,
            "Shutdown": self.shutdown,
            "Fence": self.fence_call,
            **CheckpointHandlers(self, checkpoint_root=self._checkpoint_root,
                                 confine=self._confine_shards).handlers(),
        }

    # ---- Register ----------------------------------------------------------
    def register(self, frame: Frame) -> Reply:
        request = RegisterRequest.from_frame(frame)
        layout, optimizer, sync = list(request.layout), request.optimizer, request.sync
        client, chief = request.client, request.chief
        with self._register_lock:
            if self._layout is None and not chief:
                return _reply(RegisterReply(False, False, self.init_count))
            if self._layout is not None:
                diff = layout_mismatch(self._layout, layout)
                if diff is not None:
                    raise PreconditionFailed(f"{client} has a different model layout: {diff}")
                if self._optimizer != optimizer:
                    registered = self._optimizer.to_json() if self._optimizer else None
                    raise PreconditionFailed(f"{client} uses optimizer {optimizer.to_json()}, registered: {registered}")
                if sync != self.sync_config:
                    raise PreconditionFailed(f"{client} uses update mode {sync.to_json()}, registered: {self.sync_config.to_json()}")
                if self.ready or not chief:
                    return _reply(RegisterReply(False, self.ready, self.init_count))
            self._create(layout, optimizer)
            self._layout, self._optimizer = layout, optimizer
            self._set_sync(sync)
            self.init_count += 1
            self._cpu_at_init = time.process_time()
            self.ready = not request.defer_ready
            log.info("%s: initialized %d partitions for %s", self.task_name, len(self.store.keys()), client)
            return _reply(RegisterReply(True, self.ready, self.init_count))

    def _create(self, layout: list[VariablePlacement], default: OptimizerSpec) -> None:
        # Build everything first so a bad spec leaves the store empty.
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
        self.store = fresh
        self.averages.restored(None)

    # ---- Pull --------------------------------------------------------------
    def _part(self, key: Any) -> PartitionState:
        if not isinstance(key, str):
            raise InvalidRequest(f"variable name must be a string, got {key!r:.40}")
        try:
            return self.store.get(key)
        except StoreError as e:
            raise InvalidRequest(str(e)) from e

    def pull(self, frame: Frame) -> Reply:
        request = PullRequest.from_frame(frame)
        self._hear_step(request.step_hint)
        step, out = self._read(self._pull_entries(request), create=request.create, averages=request.averages)
        return _reply(PullReply(step, out))

    def push_pull(self, frame: Frame) -> Reply:
        """A push, then a pull, in one call: the pull part is validated first,
        the push applied (as :meth:`push`), then the rows read."""
        request = PushPullRequest.from_frame(frame)
        wanted = self._pull_entries(request.pull)
        pushed = self._push_tagged(request.push)
        step, out = self._read(wanted, create=request.pull.create)
        return _reply(PushPullReply(pushed, PullReply(step, out)))

    def _pull_entries(self, request: PullRequest) -> list[tuple[PartitionState, np.ndarray | None]]:
        wanted: list[tuple[PartitionState, np.ndarray | None]] = []
        for key, rows in request.parts:
            part = self._part(key)
            if rows is None and part.table is not None:
                raise InvalidRequest(f"{part.describe} is read by ids, never whole")
            if rows is not None:
                try:
                    self.store.check_rows(part, rows, "row")
                except StoreError as e:
                    raise InvalidRequest(str(e)) from e
            wanted.append((part, rows))
        return wanted

    def _read(self, wanted: list[tuple[PartitionState, np.ndarray | None]], *,
              create: bool = False, averages: bool = False) -> tuple[int | None, dict[str, np.ndarray]]:
        """The step the values belong to (read first) and the values (``create``: a training lookup;
        ``averages``: the moving averages of the averaged partitions)."""
        step = self.global_step.value if self.global_step is not None else None
        started = time.perf_counter()
        table_step = self.table_step()
        if averages:  # the steps since this task's last push moved them too (psflow.ps.averages)
            self.averages.catch_up(self.store.partitions(), table_step)
        out = {part.key: self.store.read(part, rows, step=table_step, create=create, average=averages)
               for part, rows in wanted}
        if wanted:
            with self._stats_lock:
                self.stats["read_seconds"] += time.perf_counter() - started
                self.stats["pulls"] += 1
                self.stats["rows_pulled"] += sum(v.shape[0] for v in out.values())
                self.stats["bytes_out"] += sum(v.nbytes for v in out.values())
        return step, out

    # ---- Push --------------------------------------------------------------
    def push(self, frame: Frame) -> Reply:
        return _reply(self._push_tagged(PushRequest.from_frame(frame)))

    def _push_tagged(self, request: PushRequest) -> PushReply:
        tag = request.worker
        generation = tag.generation
        with self._gate:
            self._check_incarnation(tag.worker, tag.incarnation)
            if generation is not None:
                if not self.ready:
                    raise PreconditionFailed(f"{self.task_name} is not ready (being restored from a checkpoint)")
                if generation != self.generation:
                    raise PreconditionFailed(f"{self.task_name}: push of generation {generation!r:.20} refused: "
                                             f"the cluster was restored (generation {self.generation})")
            self._inflight += 1
            worker = tag.worker or ""
            self._inflight_of[worker] = self._inflight_of.get(worker, 0) + 1
        try:
            return self._push(request)
        finally:
            with self._gate:
                self._inflight -= 1
                self._inflight_of[worker] -= 1
                if not self._inflight_of[worker]:
                    del self._inflight_of[worker]
                    self._gate.notify_all()
                if not self._inflight:
                    self._gate.notify_all()

    def _check_incarnation(self, worker: Any, incarnation: Any) -> None:
        """Records ``worker``'s incarnation, refusing an earlier one (caller holds _gate)."""
        if incarnation is None:
            return
        if type(incarnation) is not int or incarnation < 0 or not isinstance(worker, str):
            raise InvalidRequest(f"'incarnation' must be a non-negative integer sent with 'worker', got "
                                 f"{incarnation!r:.40} for {worker!r:.100}")
        highest = self._incarnations.get(worker, 0)
        if incarnation < highest:
            log.warning("%s: push from an earlier process of %s (incarnation %d < %d) refused: the worker "
                        "was restarted", self.task_name, worker, incarnation, highest)
            raise PreconditionFailed(f"{self.task_name}: push from an earlier process of {worker} (incarnation "
                                     f"{incarnation} < {highest}) refused: the worker was restarted")
        self._incarnations[worker] = incarnation

    def incarnation_of(self, worker: str) -> int:
        """The highest incarnation (process) of ``worker`` seen in a push or claim here; 0: none."""
        with self._gate:
            return self._incarnations.get(worker, 0)

    def claim_worker(self, worker: Any, incarnation: Any, drain_timeout: float = 5.0) -> None:
        """A (re)started worker process: records its incarnation (earlier ones are refused from now
        on) and waits up to ``drain_timeout`` s for that worker's pushes in flight (only its own: in
        sync mode the others' wait for this one), so that the reader position read next is not
        changed by a push of an earlier process."""
        with self._gate:
            self._check_incarnation(worker, incarnation)
            self._gate.wait_for(lambda: worker not in self._inflight_of, timeout=drain_timeout)

    def begin_restore(self, generation: int, drain_timeout: float) -> bool:
        """Marks this task not ready at ``generation`` (pushes of any other are refused from now on)
        and waits up to ``drain_timeout`` s for the pushes in flight; True if they all finished."""
        with self._gate:
            self.ready = False
            self.generation = generation
            with self._stats_lock:
                self._finished.clear()
            if self.aggregator is not None:  # sync pushes waiting for a step give up (their workers recover)
                self.aggregator.abort(f"{self.task_name}: the cluster is being restored (generation {generation}); "
                                      f"sync step abandoned")
            return self._gate.wait_for(lambda: self._inflight == 0, timeout=drain_timeout)

    def restored_at(self, step: int | None) -> None:
        """A checkpoint of global step ``step`` was loaded here (None: unknown): the moving averages belong
        to it, and in sync mode this task's count of aggregated steps starts over there (ps task 0's is
        global_step itself, set by the load), so the workers' gradients of step ``step`` are this task's too."""
        self.averages.restored(step)
        if step is not None and self.aggregator is not None and self.global_step is None:
            self._sync_step.set(step)
            self.aggregator.reset()

    def finish_restore(self, generation: int, step: int | None) -> None:
        """Takes the restore's ``generation`` (the caller then marks the task ready); in sync
        mode, the sync step starts over at the restored global_step ``step``."""
        if step is not None and self.aggregator is not None:
            if self.global_step is None:  # ps task 0's counter is global_step itself, set by LoadShard
                self._sync_step.set(step)
            self.aggregator.reset()
        self.generation = generation

    def _push(self, request: PushRequest) -> PushReply:
        plan: list[tuple[PartitionState, np.ndarray | None, np.ndarray]] = []
        for key, grad, rows in request.grads:
            part = self._part(key)
            try:
                if rows is None:
                    self.store.check_dense(part, grad)
                else:
                    self.store.check_sparse(part, rows, grad)
            except StoreError as e:
                raise InvalidRequest(str(e)) from e
            plan.append((part, rows, grad))
        want_step = request.step
        if want_step and self.global_step is None:
            raise InvalidRequest("global_step does not live on this task (it is on /job:ps/task:0)")
        mode = self.sync_config.mode
        if not plan and not want_step and mode != "sync":
            return PushReply(None)  # the pull-only half of a PushPull
        if mode == "sync":
            return self._push_sync(request, plan)
        read_step = request.steps.read_step
        self._hear_step(request.steps.step_hint)
        started = time.perf_counter()
        table_step = self.table_step()  # before this push's increment: a schedule's step, the tables' clock
        self.averages.catch_up(self.store.partitions(), table_step)  # steps without a push here (psflow.ps.averages)
        for part, rows, grad in plan:
            if rows is None:
                self.store.apply_dense(part, grad, step=table_step)
            else:
                self.store.apply_sparse(part, rows, grad, step=table_step)
        step = self.global_step.increment() if want_step and self.global_step is not None else None
        self.averages.move(self.store.partitions(), step if step is not None else table_step + 1)
        applied = time.perf_counter() - started
        self._sweep_tables(plan)
        self._count_push(request, plan, apply_seconds=applied)
        if step is not None and read_step is not None:
            self._record_staleness(step - 1 - read_step)
        min_clock = None
        if mode == "ssp" and step is not None and self.staleness_clock is not None:
            worker, clock = _worker(request.worker.worker), request.steps.clock
            if clock is None:
                raise InvalidRequest("an ssp push must carry the worker's clock")
            min_clock = self.staleness_clock.advance(worker, clock)
        return PushReply(step, min_clock=min_clock)

    def _push_sync(self, request: PushRequest, plan: list[tuple[PartitionState, np.ndarray | None, np.ndarray]]
                   ) -> PushReply:
        if self.aggregator is None:
            raise InvalidRequest("variables are not registered yet")
        tag = request.steps.sync_tag
        if tag is None:
            raise InvalidRequest("a sync push must carry the step it was computed from ('tag')")
        self._hear_step(tag)
        result = self.aggregator.contribute(tag, Contribution(_worker(request.worker.worker), plan))
        if result.accepted:
            self._count_push(request, plan)
        return PushReply(result.step, result.accepted, result.completed, aggregated=True)

    def _hear_step(self, step: int | None) -> None:
        if step is not None and step > self._heard_step:
            self._heard_step = step  # a benign race: a concurrent smaller hint may win, the next one corrects it

    def table_step(self) -> int:
        """The dynamic tables' clock: global_step here, else the newest step a client reported."""
        return self.global_step.value if self.global_step is not None else self._heard_step

    def learning_rate(self) -> float | None:
        """The run's optimizer's learning rate at the step the next update is applied at (None before
        the variables are registered). Variables with an optimizer of their own may use other rates."""
        spec = self._optimizer
        if spec is None:
            return None
        return spec.learning_rate_at(self._sync_step.value if self.aggregator is not None else self.table_step())

    def _sweep_tables(self, plan: list[tuple[PartitionState, np.ndarray | None, np.ndarray]]) -> None:
        """Drops rows past their ttl_steps from the dynamic tables this push touched (a bounded slice each)."""
        for part, _, _ in plan:
            if part.table is not None and part.table.spec.ttl_steps is not None:
                part.table.evict(self.table_step())

    def dynamic_stats(self) -> dict[str, dict[str, int]]:
        """Each dynamic table share's counters (rows, admitted, rejected, dropped, evicted, memory), by partition key."""
        return {part.key: dataclasses.asdict(part.table.stats()) for part in self.store.partitions() if part.table is not None}

    def _set_sync(self, sync: SyncConfig) -> None:
        self.sync_config = sync
        if sync.mode == "sync":  # every task applies every step: its averages never skip one
            self.averages = MovingAverages(self.task_name, catch_up=False)
            self.aggregator = SyncAggregator(sync, self.store, task_name=self.task_name,
                                             advance=self._advance_sync_step, current=lambda: self._sync_step.value)
        elif sync.mode == "ssp" and self.global_step is not None:
            self.staleness_clock = StalenessClock(sync, task_name=self.task_name)

    def _advance_sync_step(self) -> int:
        """A sync step was applied (every partition's update of it): the step advances, then the moving
        averages move at the new step (called by the aggregator, under its lock)."""
        step = self._sync_step.increment()
        self.averages.move(self.store.partitions(), step)
        return step

    def _record_staleness(self, staleness: int) -> None:
        with self._stats_lock:
            self.staleness_histogram[staleness] = self.staleness_histogram.get(staleness, 0) + 1

    def leave(self, frame: Frame) -> Reply:
        worker = LeaveRequest.from_frame(frame).worker
        if self.global_step is not None:
            with self._stats_lock:
                self._finished.add(worker)
        if self.aggregator is not None:
            self.aggregator.leave(worker)
        if self.staleness_clock is not None:
            self.staleness_clock.leave(worker)
        return _reply(Ack())

    def _count_push(self, request: PushRequest, plan: list[tuple[PartitionState, np.ndarray | None, np.ndarray]],
                    *, apply_seconds: float = 0.0) -> None:
        loss = request.loss
        with self._stats_lock:
            s = self.stats
            s["pushes"] += 1
            s["apply_seconds"] += apply_seconds
            s["rows_pushed"] += sum(g.shape[0] if r is not None else 0 for _, r, g in plan)
            s["bytes_in"] += sum(g.nbytes + (r.nbytes if r is not None else 0) for _, g, r in request.grads)
            s["examples"] += request.examples
            position, worker = request.worker.position, request.worker.worker
            if position is not None and worker is not None and self.global_step is not None:
                self._positions[worker] = position
            if loss is not None and np.isfinite(loss):
                prev = s["loss_ema"]
                s["loss_ema"] = float(loss) if np.isnan(prev) else (1 - _LOSS_EMA) * prev + _LOSS_EMA * float(loss)
                s["last_loss"] = float(loss)

    # ---- Stats / Shutdown --------------------------------------------------
    def get_stats(self, frame: Frame) -> Reply:
        return _reply(self.stats_reply())

    def stats_reply(self) -> StatsReply:
        """This task's state and counters (the ``Stats`` reply)."""
        with self._stats_lock:
            stats: dict[str, Any] = dict(self.stats)
            finished = sorted(self._finished)
        for key in ("loss_ema", "last_loss"):
            stats[key] = None if np.isnan(stats[key]) else stats[key]
        stats.update(
            partitions={p.key: list(p.value.shape) for p in self.store.partitions()},
            parameter_bytes=self.store.parameter_bytes(),
            uptime=time.time() - self.started,
            cpu_seconds=time.process_time(),  # of the whole ps process
            cpu_seconds_since_init=time.process_time() - self._cpu_at_init if self.init_count else None,
            staleness_histogram={str(k): v for k, v in sorted(self.staleness_histogram.items())},
        )
        dynamic = self.dynamic_stats()
        if dynamic:
            stats["dynamic_tables"] = dynamic
        if self.aggregator is not None:
            stats.update(self.aggregator.stats())
        if self.staleness_clock is not None:
            stats.update(self.staleness_clock.stats())
        holds_step = self.global_step is not None
        return StatsReply(
            self.task_name, self.global_step.value if self.global_step is not None else None,
            self.global_step.floor if self.global_step is not None else None, self.init_count, self._layout is not None,
            self.ready, self.generation, self.sync_config.mode, tuple(finished) if holds_step else None,
            self.learning_rate(), stats)

    def fence_call(self, frame: Frame) -> Reply:
        """The ``Fence`` call: the leader's epoch checked against (and recorded in) this task's fence."""
        request = FenceRequest.from_frame(frame)
        try:
            self.fence.check(request.token, scope=request.scope, holder=request.holder)
        except FencedError as e:
            raise PreconditionFailed(str(e)) from e
        return _reply(FenceReply(request.token))

    @property
    def registered(self) -> bool:
        """Whether the chief has registered (and created) the variables here."""
        return self._layout is not None

    def reader_positions(self) -> dict[str, str]:
        """A copy of client task -> newest reported ReaderPosition JSON."""
        with self._stats_lock:
            return dict(self._positions)

    def set_reader_positions(self, positions: dict[str, str], examples: int | None = None) -> None:
        """Replaces the recorded reader positions (restore from a checkpoint), and the
        count of examples applied with them when given."""
        with self._stats_lock:
            self._positions = dict(positions)
            if examples is not None:
                self.stats["examples"] = examples

    def data_progress(self) -> tuple[dict[str, str], int]:
        """The reader positions and the examples pushed with them, read together (one consistent pair)."""
        with self._stats_lock:
            return dict(self._positions), int(self.stats["examples"])

    def shutdown(self, frame: Frame) -> Reply:
        if self._on_shutdown is not None:
            threading.Thread(target=self._on_shutdown, name="psflow-shutdown", daemon=True).start()
        return _reply(Ack())


def _reply(message: Ack | FenceReply | PullReply | PushPullReply | PushReply | RegisterReply | StatsReply) -> Reply:
    frame = message.to_frame()
    return frame.meta, frame.arrays


def _worker(worker: str | None) -> str:
    """The pushing worker's task name, which sync and ssp pushes must carry."""
    if worker is None:
        raise InvalidRequest("push must name its worker task")
    return worker
