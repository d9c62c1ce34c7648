"""ParameterService: the RPC handlers of a ps task, a table of handlers over separate parts.

The parts, each owning its state and its lock (see :class:`ParameterService`):
the variables (:mod:`psflow.ps.variable_store`), the clocks
(:mod:`psflow.ps.step_clock`), the workers (:mod:`psflow.ps.worker_ledger`),
the restore gate (:mod:`psflow.ps.restore_gate`), the update mode
(:mod:`psflow.ps.update_mode`), the counters, the fence, the checkpoint ledger
and the run's end (:mod:`psflow.ps.run_end`). A push goes through the worker
ledger (its process), then the gate (its generation), is applied to the
variables under each partition's lock, steps the clock, and is counted
(:mod:`psflow.ps.push_apply`).

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
    with no restore in progress (a chief died while initializing it or
    restoring it at start, which sends no ``BeginRestore``) initializes again; during a restore (``BeginRestore`` until ``SetReady``)
    it creates nothing and replies ``{"created": false, "ready": false}``,
    so what ``LoadShard`` loaded stays. A chief's call asks and creates under the restore mutex
    (:meth:`~psflow.ps.restore_gate.RestoreGate.creating`): a ``BeginRestore``, load or ``SetReady`` coming
    while it creates waits for it, never finds its fresh partitions replacing loaded ones. Idempotent otherwise. On the task holding
    global_step a chief's ``step_run`` (its run id) is recorded in the global_step
    journal; a journal that cannot be written refuses the call with FAILED_PRECONDITION
    naming the task and the file (one ERROR line here, no traceback; the variables it
    created stay, not ready, as after a chief that died before its ``SetReady``).
``SaveShard``, ``LoadShard``, ``SetReady``, ``ReaderPositions``, ``CheckpointStatus``
    checkpoints and the chief's protocol: :mod:`psflow.ps.checkpointing`.
    A push whose meta has ``worker`` and ``position`` (ReaderPosition JSON)
    records it as that worker's reader position.
``Pull``
    ``meta = {"vars": [[key, rows_array_name | null], ...], "create": bool, "averages": bool}`` -> arrays
    ``{key: values}`` (``averages``: an averaged partition's moving average instead of its value; ``require_ready``:
    an evaluation's, refused unless this task is ready, :mod:`psflow.ps.ready_read`).
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
    A refused push (bad input, an earlier process, one from before a restore,
    a sync step that timed out) changes no counter of ``Stats`` of its own:
    the step's timeout itself is counted once (``sync_timeouts``), its
    contributors stay listed (``sync_contributed``) until a restore, and
    ``sync_failed`` says why it failed (the refusal's words; it then waits for
    nobody: ``sync_waiting_for`` is empty); nothing
    of the failed step is applied, not even once the worker missing from it
    leaves.
``PushPull``
    A push, then a pull, in one call (:meth:`ParameterService.push_pull`): its
    lookup is made only once the push is applied, so a refused push's lookup
    is not made and counts nothing. A ``Pull``'s lookup counts once made,
    whether or not the step's push lands later (docs/dynamic_tables.md).

Dynamic tables keep time in global steps: on the task holding global_step,
its value; elsewhere the newest ``step_hint`` a client sent (the newest step it
heard of) -- so a row's age is never over-estimated.
Learning-rate schedules (:mod:`psflow.optim.schedules`) read the same clock when a
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
    ``step_floor`` bounds every step an earlier process of this task handed out, ``step_run`` names the run
    that handed them out where the journal says (the chief's ``Register`` names its run: ``GlobalStep.claim``);
    ``finished`` lists the workers whose ``Leave`` arrived since the last restore;
    ``dynamic_tables``, when there are any: each share's rows and counters, by partition key;
    ``learning_rate``: the run's optimizer's learning rate at the step the next update is applied at,
    ``learning_rate_step``: that step).
``Leave``
    ``meta = {"worker": task}``: that worker finished its data (sync and ssp
    stop waiting for it).
``Done``
    (a served task, with its training workers) a worker's session ended:
    :mod:`psflow.ps.run_end`. A worker that registers again must finish again.
``Fence``
    the chief's epoch, checked against this task's fence (:mod:`psflow.coord.fence`).
``SaveNotice``
    ``meta = {"writer", "saving_into", "step", "active"}``: the chief's checkpoint save started, goes on or ended;
    a sync step it is missing from does not time out meanwhile (:mod:`psflow.ps.save_hold`). Replies
    ``{"renew_every": seconds | null}``.

Generations: every restore from a checkpoint after a ps death gives the
cluster a new generation number (``SetReady`` carries it); a push of another
generation is refused before anything is applied (:mod:`psflow.ps.restore_gate`).

Incarnations: a push from an earlier process of a worker than the newest seen
here is refused before anything is applied, and a restarted worker reading its
position first waits for its pushes in flight (:mod:`psflow.ps.worker_ledger`).
``Shutdown``
    asks the task to stop serving (its ``Server.join()`` returns).

Guarantees: a refused request (INVALID_ARGUMENT, naming the task and the
variable) leaves every variable unchanged; the server keeps serving.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from psflow.coord.api import FencedError
from psflow.coord.fence import FenceGuard
from psflow.ps.averages import MovingAverages
from psflow.ps.checkpointing import CheckpointHandlers
from psflow.ps.counters import ServiceCounters
from psflow.ps.global_step import GlobalStep, StepJournal, StepJournalError
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
    SaveNoticeReply,
    SaveNoticeRequest,
    StatsReply,
    WorkerTag,
)
from psflow.ps.push_apply import PushApplier
from psflow.ps.push_order import PushOrder
from psflow.ps.ready_read import ready_read
from psflow.ps.restore_gate import RestoreGate
from psflow.ps.run_end import RunLedger
from psflow.ps.save_ledger import SaveLedger
from psflow.ps.step_clock import StepClock
from psflow.ps.store import ParameterStore, PartitionState, StoreError
from psflow.ps.update_mode import UpdateMode
from psflow.ps.variable_store import VariableStore
from psflow.ps.worker_ledger import WorkerLedger
from psflow.rpc.api import FencedOff, Handler, InvalidRequest, PreconditionFailed, Reply
from psflow.rpc.framing import Frame

__all__ = ["ParameterService"]

log = logging.getLogger(__name__)

class ParameterService:
    """The handlers of one ps task, each over the parts of the task's state it reads or changes.

    Parts (each owns its state and its lock; the handlers and the checkpoint
    handlers get the parts, never the service):

    * :attr:`variables` (:class:`~psflow.ps.variable_store.VariableStore`): the
      registered layout, optimizer and update mode, the partitions, the moving averages;
    * :attr:`clock` (:class:`~psflow.ps.step_clock.StepClock`): global_step and its
      journal, the newest step the clients reported, the sync step count;
    * :attr:`workers` (:class:`~psflow.ps.worker_ledger.WorkerLedger`): incarnations,
      pushes in flight per worker, reader positions, finished workers;
    * :attr:`order` (:class:`~psflow.ps.push_order.PushOrder`): a worker process's numbered pushes,
      applied in the order made (more than one push in flight per worker);
    * :attr:`gate` (:class:`~psflow.ps.restore_gate.RestoreGate`): readiness,
      restore generation, pushes in flight;
    * :attr:`mode` (:class:`~psflow.ps.update_mode.UpdateMode`): the sync aggregator or ssp clock;
    * :attr:`pushes` (:class:`~psflow.ps.push_apply.PushApplier`): a push admitted, applied and counted,
      over the parts above;
    * :attr:`counters`, :attr:`fence`, :attr:`saves` (the checkpoint ledger) and, on a
      served task, :attr:`run_ledger` (the workers' ``Done``, :mod:`psflow.ps.run_end`).
    """

    def __init__(self, task_index: int, *, holds_global_step: bool, on_shutdown: Callable[[], None] | None = None,
                 step_journal: StepJournal | None = None, checkpoint_root: str | None = None,
                 confine_shards: bool = False, training_workers: Sequence[str] | None = None,
                 on_run_over: Callable[[str], None] | None = None,
                 extra_stats: Callable[[], Mapping[str, Any]] | None = None,
                 save_ledger_file: str | None = None) -> None:
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
            training_workers: serve ``Done`` for these workers (:func:`psflow.ps.run_end.training_workers`;
                None: no ``Done``, e.g. an in-process service).
            on_run_over: with ``training_workers``, called once when the last one's ``Done`` arrived.
            extra_stats: more counters for ``Stats`` (the server's: authentication, the TCP carrier's).
            save_ledger_file: where the checkpoint ledger outlives a restart of this task
                (:class:`~psflow.ps.save_ledger.SaveLedger`); None: in memory only.

        Raises:
            StepJournalError: the journal file is damaged.
        """
        self.task_index = task_index
        self.task_name = f"/job:ps/task:{task_index}"
        self.clock = StepClock(holds_global_step=holds_global_step, journal=step_journal)
        self.variables = VariableStore(task_index, holds_global_step=holds_global_step)
        self.mode = UpdateMode(self.task_name, self.clock, self.variables)
        self.workers = WorkerLedger(self.task_name, records_positions=holds_global_step)
        self.order = PushOrder(self.task_name)
        self.gate = RestoreGate(self.task_name)
        self.counters = ServiceCounters()
        self.pushes = PushApplier(variables=self.variables, clock=self.clock, workers=self.workers, gate=self.gate,
                                  mode=self.mode, counters=self.counters)
        # Highest chief epoch seen; fenced writes (checkpoints) check it (psflow.coord.fence).
        self.fence = FenceGuard(self.task_name)
        self.saves = SaveLedger(save_ledger_file)
        self.run_ledger = None if training_workers is None else RunLedger(
            self.task_name, training_workers, incarnation_of=self.workers.incarnation_of, on_over=on_run_over)
        self._checkpoints = CheckpointHandlers(
            variables=self.variables, clock=self.clock, workers=self.workers, gate=self.gate, mode=self.mode,
            fence=self.fence, saves=self.saves, checkpoint_root=checkpoint_root, confine=confine_shards)
        self._on_shutdown, self._extra_stats = on_shutdown, extra_stats
        # Its age, as ``Stats`` ``uptime``: monotonic, so a duration other processes compare with theirs (a worker's
        # restart check: psflow.train.recovery, psflow.train.summary), whatever this host's wall clock does.
        self.started = time.monotonic()

    def handlers(self) -> dict[str, Handler]:
        """Method name -> handler, for a carrier's server (:func:`psflow.rpc.registry.serve`)."""
        table: dict[str, Handler] = {
            RegisterRequest.METHOD: self.register,
            PullRequest.METHOD: self.pull,
            PushRequest.METHOD: self.push,
            PushPullRequest.METHOD: self.push_pull,
            "Stats": self.get_stats,
            LeaveRequest.METHOD: self.leave,
            "Shutdown": self.shutdown,
            FenceRequest.METHOD: self.fence_call,
            SaveNoticeRequest.METHOD: self.save_notice,
            **self._checkpoints.handlers(),
        }
        if self.run_ledger is not None:
            table.update(self.run_ledger.handlers())
        return table

    # ---- views of the parts, for callers and tests --------------------------------------------------
    @property
    def store(self) -> ParameterStore:
        """The partitions this task holds."""
        return self.variables.partitions

    @property
    def averages(self) -> MovingAverages:
        return self.variables.averages

    @property
    def global_step(self) -> GlobalStep | None:
        """global_step, on the task holding it."""
        return self.clock.global_step

    @property
    def registered(self) -> bool:
        """Whether the chief has registered (and created) the variables here."""
        return self.variables.registered

    @property
    def ready(self) -> bool:
        """Whether the chief has initialized or restored this task."""
        return self.gate.ready

    @property
    def init_count(self) -> int:
        return self.variables.init_count

    def data_progress(self) -> tuple[dict[str, str], int]:
        """The reader positions and the examples pushed with them, read together."""
        return self.workers.progress()

    # ---- Register -------------------------------------------------------------------------------------
    def register(self, frame: Frame) -> Reply:
        request = RegisterRequest.from_frame(frame)
        if self.run_ledger is not None:  # a worker registering after its Done was restarted
            self.run_ledger.joined(request.client)

        by = (request.client, request.incarnation, request.attempt)

        def created() -> None:  # inside the registration: before any other call registers
            self.mode.configure(request.sync)
            self.gate.initialized(ready=not request.defer_ready, by=by)

        # A chief's, which may create the variables, asks and creates under the restore mutex: no BeginRestore, load
        # or SetReady between its ask (not ready, no restore in progress) and its fresh partitions.
        with self.gate.creating() if request.chief else contextlib.nullcontext():
            made = self.variables.register(request, ready=lambda: self.gate.ready,
                                           restoring=lambda: self.gate.restoring, created=created,
                                           superseded=lambda: self.gate.superseded(*by))
        if request.chief and request.run is not None and self.clock.global_step is not None:
            self._claim(self.clock.global_step, request.run, request.client)
        # A new process: its earlier one's save is over; the saving process's own (again) ends nothing (save_hold).
        self.mode.registered(request.client, request.incarnation)
        return _reply(RegisterReply(made, self.gate.ready if self.variables.registered else False,
                                    self.variables.init_count))

    def _claim(self, step: GlobalStep, run: str, client: str) -> None:
        """The values handed out from now on are run ``run``'s (its chief ``client`` registered).

        Raises:
            PreconditionFailed: the global_step journal cannot be written (names this task and the file): the
                user's disk or directory, not a bug, so one line here and to the chief, no traceback.
        """
        try:
            step.claim(run)
        except StepJournalError as e:
            log.error("%s: Register of %s (run %s) refused: %s", self.task_name, client, run, e)
            raise PreconditionFailed(f"{e}; run {run} not registered: {self.task_name} must record it there before "
                                     "it hands out the run's global_step values") from e

    # ---- Pull -----------------------------------------------------------------------------------------
    def pull(self, frame: Frame) -> Reply:
        request = PullRequest.from_frame(frame)
        self.clock.hear(request.step_hint)
        with ready_read(self.gate, request.require_ready):  # an evaluation's: of a ready task only (ready_read)
            step, out = self._read(self._pull_entries(request), create=request.create, averages=request.averages)
        return _reply(PullReply(step, out, request.stack))

    def push_pull(self, frame: Frame) -> Reply:
        """A push, then a pull, in one call: the pull part is validated first,
        the push applied (as :meth:`push`), then the rows read. A numbered push (``seq``) does all of it
        in its turn (:mod:`psflow.ps.push_order`)."""
        request = PushPullRequest.from_frame(frame)
        if request.push.worker.seq is None:
            return self._push_pull(request)
        with self._turn(request.push.worker):
            return self._push_pull(request)

    def _push_pull(self, request: PushPullRequest) -> Reply:
        wanted = self._pull_entries(request.pull)
        pushed = self.pushes.apply(request.push)
        if pushed.held:  # the step is not applied yet: the same call comes again (psflow.ps.save_hold)
            return _reply(PushPullReply(pushed, PullReply(None, {}, request.pull.stack)))
        step, out = self._read(wanted, create=request.pull.create)
        return _reply(PushPullReply(pushed, PullReply(step, out, request.pull.stack)))

    @contextlib.contextmanager
    def _turn(self, tag: WorkerTag) -> Iterator[None]:
        """Holds a numbered push until its turn and passes the turn on once it was handled (refused: the
        process's later pushes are refused too); see :mod:`psflow.ps.push_order`."""
        if tag.worker is None or tag.incarnation is None or tag.stream is None or tag.seq is None:
            raise InvalidRequest("a numbered push ('seq') must carry 'worker', 'incarnation' and 'stream'")  # (the protocol refuses it)
        if not self.order.enter(tag.worker, tag.incarnation, tag.stream, tag.seq):
            yield  # an earlier process's push: the ledger refuses it
            return
        try:
            yield
        except BaseException as e:
            self.order.leave(tag.worker, tag.incarnation, tag.stream, tag.seq, ok=False, why=str(e))
            raise
        self.order.leave(tag.worker, tag.incarnation, tag.stream, tag.seq, ok=True)

    def _pull_entries(self, request: PullRequest) -> list[tuple[PartitionState, np.ndarray | None]]:
        wanted: list[tuple[PartitionState, np.ndarray | None]] = []
        store = self.variables.partitions
        for key, rows in request.parts:
            part = self.variables.part(key)
            if rows is None and part.table is not None:
                raise InvalidRequest(f"{part.describe} is read by ids, never whole")
            if rows is not None:
                try:
                    store.check_rows(part, rows, "row")
                except StoreError as e:
                    raise InvalidRequest(str(e)) from e
            wanted.append((part, rows))
        return wanted

    def _read(self, wanted: list[tuple[PartitionState, np.ndarray | None]], *,
              create: bool = False, averages: bool = False) -> tuple[int | None, dict[str, np.ndarray]]:
        """The step the values belong to (read first) and the values (``create``: a training lookup;
        ``averages``: the moving averages of the averaged partitions)."""
        global_step, variables = self.clock.global_step, self.variables
        step = global_step.value if global_step is not None else None
        started = time.perf_counter()
        table_step = self.clock.table_step()
        store = variables.partitions
        if averages:  # the steps since this task's last push moved them too (psflow.ps.averages)
            variables.averages.catch_up(store.partitions(), table_step)
        built = store.materialize_together(wanted)  # a request's new lazy rows, built in one pass
        out = {part.key: store.read(part, rows, step=table_step, create=create, average=averages,
                                    built=part.key in built) for part, rows in wanted}
        if wanted:
            self.counters.pulled(sum(v.shape[0] for v in out.values()), sum(v.nbytes for v in out.values()),
                                 time.perf_counter() - started)
        return step, out

    # ---- Push -----------------------------------------------------------------------------------------
    def push(self, frame: Frame) -> Reply:
        """Applies the push (:class:`~psflow.ps.push_apply.PushApplier`); a numbered one in its turn."""
        request = PushRequest.from_frame(frame)
        if request.worker.seq is None:
            return _reply(self.pushes.apply(request))
        with self._turn(request.worker):
            return _reply(self.pushes.apply(request))

    # ---- Leave / Stats / Fence / Shutdown --------------------------------------------------------------
    def leave(self, frame: Frame) -> Reply:
        worker = LeaveRequest.from_frame(frame).worker
        self.workers.finish(worker)
        self.mode.leave(worker)
        return _reply(Ack())

    def get_stats(self, frame: Frame) -> Reply:
        return _reply(self.stats_reply())

    def stats_reply(self) -> StatsReply:
        """This task's state and counters (the ``Stats`` reply)."""
        counters = self.counters.snapshot()
        store, global_step = self.variables.partitions, self.clock.global_step
        counters.update(
            examples=self.workers.examples,
            partitions={p.key: list(p.value.shape) for p in store.partitions()},
            parameter_bytes=store.parameter_bytes(),
            uptime=time.monotonic() - self.started,
            cpu_seconds=time.process_time(),  # of the whole ps process
            cpu_seconds_since_init=self.variables.cpu_seconds_since_init(),
        )
        dynamic = {part.key: dataclasses.asdict(part.table.stats()) for part in store.partitions()
                   if part.table is not None}
        if dynamic:  # each dynamic table share's rows and counters, by partition key
            counters["dynamic_tables"] = dynamic
        counters.update(self.mode.stats())
        if self.run_ledger is not None:
            counters["run_end"] = self.run_ledger.stats()
        if self._extra_stats is not None:
            counters.update(self._extra_stats())
        finished = self.workers.finished()
        # The rate and the step it is the schedule's at, read once: the chief labels its summary with that step.
        counters["learning_rate_step"] = rate_step = self.mode.schedule_step()
        generation, restored_from, restored_step = self.gate.restored_from()  # read together
        return StatsReply(
            self.task_name, global_step.value if global_step is not None else None,
            global_step.floor if global_step is not None else None, self.variables.init_count,
            self.variables.registered, self.gate.ready, generation, self.mode.config.mode,
            tuple(finished) if finished is not None else None,
            self.variables.learning_rate(rate_step), counters,
            global_step.floor_run if global_step is not None else None, restored_from, restored_step)

    def fence_call(self, frame: Frame) -> Reply:
        """The ``Fence`` call: the leader's epoch checked against (and recorded in) this task's fence."""
        request = FenceRequest.from_frame(frame)
        try:
            self.fence.check(request.token, scope=request.scope, holder=request.holder)
        except FencedError as e:
            raise FencedOff(str(e)) from e
        return _reply(FenceReply(request.token))

    def save_notice(self, frame: Frame) -> Reply:
        """The ``SaveNotice`` call: the chief's checkpoint save started, goes on or ended (:mod:`psflow.ps.save_hold`)."""
        return _reply(SaveNoticeReply(self.mode.save_notice(SaveNoticeRequest.from_frame(frame))))

    def shutdown(self, frame: Frame) -> Reply:
        if self._on_shutdown is not None:
            threading.Thread(target=self._on_shutdown, name="psflow-shutdown", daemon=True).start()
        return _reply(Ack())


def _reply(message: Ack | FenceReply | PullReply | PushPullReply | PushReply | RegisterReply | SaveNoticeReply
           | StatsReply) -> Reply:
    frame = message.to_frame()
    return frame.meta, frame.arrays

