"""The ps side of checkpoints and of the chief's initialization protocol.

Handlers (added to :meth:`psflow.ps.service.ParameterService.handlers`), each over the parts of the task
it reads or changes (:class:`CheckpointHandlers` gets the parts, not the service):

``SaveShard``
    ``meta = {"path": str | null, "shard": i, "num_shards": n}``. Snapshots
    every partition this task holds (value and optimizer slots, and the
    moving average of an averaged one as the slot ``ExponentialMovingAverage``
    (:data:`psflow.ps.averages.AVERAGE_SLOT`), each partition under its own lock), plus global_step and the workers' reader
    positions on the task holding global_step, and serializes them as one
    safetensors file. With ``path`` the task writes the file itself (temp
    file, fsync, rename; the directory must be reachable from this task; a
    URL of an object store, ``s3://`` or ``gs://``, is written with one put
    through :mod:`psflow.storage`, with this task's own credentials);
    without it the bytes come back in the reply (array ``shard``, uint8) and
    the caller writes them, so no shared filesystem is needed. A served ps
    task writes only under its checkpoint root (``psflow server
    --checkpoint-root``; symlinks resolved; a URL must lie under a root URL
    of the same store): a path elsewhere (absolute,
    ``..``, a symlink out) is refused with INVALID_ARGUMENT naming the path,
    before anything is written. The reply's
    meta describes the shard (partitions, slot names, sha256, byte size), and
    on the task holding global_step the reader positions with the count of
    examples pushed with them (read together). With ``epoch`` (the chief's
    lease epoch) the write is fenced: refused with ABORTED (:class:`~psflow.rpc.api.FencedOff`) if a
    newer chief's epoch was seen, and no newer epoch is accepted meanwhile. Refused with FAILED_PRECONDITION
    while a restore is in progress (``BeginRestore`` came, ``SetReady`` not yet) or when one began during the
    snapshot (:meth:`~psflow.ps.restore_gate.RestoreGate.check_save`): the shard would hold part of the restore
    (not ABORTED: no newer chief fenced the save; the chief counts it as a failed save). The reply's ``generation``
    is the task's restore generation of the snapshot: a save whose shards differ there straddled a restore (refused);
    ``ready`` whether the task was ready: a save of ready and not ready tasks (a restarted one registered by a restore
    that has not sent its ``BeginRestore`` yet, holding initial values) is refused too.
    On a replicated shard's primary (:attr:`CheckpointHandlers.push_count` set) the reply's
    ``pushes_applied`` is the count of the pushes the snapshot holds and ``pushes_applied_by`` that of each
    client process (``[[worker, incarnation, n], ...]``): read with it while no push is applied
    (:meth:`PushCount.holding`); an unreplicated task sends neither.
``LoadShard``
    ``meta = {"parts": [key, ...], "global_step": S | null, "positions": {...} | null, "examples": n | null}``,
    arrays ``v/<key>`` (values) and ``s/<key>/<slot>`` (slots). Every array
    is checked against the partition's shape and dtype and every slot name
    against the partition's slots before anything changes; then each
    partition is overwritten under its lock. Used by the chief to restore.
    ``"generation": g`` (the restore's) is refused with ABORTED (the restore fence), nothing changed, unless the task
    holds ``g`` and is not ready (:meth:`~psflow.ps.restore_gate.RestoreGate.check_load`): a deposed restorer's
    late load; a first restore with no ``BeginRestore`` sends 0. Without it the load is not checked. Asked at
    the start and again where the load changes the task (:meth:`~psflow.ps.restore_gate.RestoreGate.loading`,
    which ``BeginRestore`` and ``SetReady`` wait for): a restore begun while the arrays were checked (the
    partitions: :mod:`psflow.ps.shard_load`) refuses it there, and no load's values, global_step, positions or
    lineage land after a newer restore's. A load whose partitions were created anew meanwhile (a chief's
    ``Register`` on a task not ready with no restore in progress: a load at start; a replicated member rebuilt) is
    refused there with FAILED_PRECONDITION, nothing changed: it never writes into partitions the task no longer holds.
    global_step is set first: where its journal cannot record it (a full disk) the load is refused with
    FAILED_PRECONDITION naming the task, the generation and the file, nothing changed.
    A lazy partition's checkpoint holding only its built rows comes as ``b/<key>`` (its saved local rows,
    sorted; ``v/<key>`` and ``s/<key>/<slot>`` hold those rows), ``i/<key>/<slot>`` (each slot's initial row)
    and ``meta["initializers"][key] = {"initializer", "shape"}``: a lazy partition of the same initial content
    stays lazy, its rows not saved unbuilt (:func:`psflow.ps.built_rows.load_built`).
    ``"lineage": str`` (the task holding global_step) sets the ledger's
    lineage (see ``CheckpointStatus``).
    With ``"values_only": true`` (a warm start) only the values are loaded:
    slots keep their initial values and no slot array may be sent; a moving
    average starts at the loaded value (as it starts at the initial value).
    A values-only load may send a partition as its saved rows (``b/<key>``, no ``i/``): a lazy partition of
    that initializer and shape builds only those rows (:func:`psflow.ps.built_rows.warm_built`).
    An averaged partition's moving average is its slot ``ExponentialMovingAverage``.
    ``"restored_step": S`` (every task; the task holding global_step reads
    ``global_step`` without it) is the checkpoint's global_step: the moving
    averages belong to it (:class:`psflow.ps.averages.MovingAverages`), and in
    sync mode a task's count of aggregated steps starts over there. ``"restored_from"``, ``"restored_from_step"``:
    the checkpoint and its own step, kept with the generation for ``Stats`` (:mod:`psflow.ps.restore_gate`).
    ``"pushes_applied": n`` (a replicated shard's checkpoint) sets the shard's count of applied pushes
    to the checkpoint's in a restore within the run (this task got ``BeginRestore``: the run's worker
    processes go on, and so do their counts of acknowledged pushes), so ``updates_lost`` counts exactly
    the acknowledged pushes the checkpoint lacks (``"pushes_applied_by": [[worker, incarnation, n], ...]``, each
    client process's count of them, sets those: the loss is counted per process). A fresh cluster's first load (a new run resuming a
    checkpoint) leaves it at 0, where the new workers' counts start; a load without it (an older
    checkpoint, or an unreplicated task) leaves the count as it is.
    A dynamic table's partition is loaded from the arrays ``d/<key>/<name>``
    of a :meth:`~psflow.ps.dynamic.DynamicTable.snapshot` (``ids``, ``values``,
    ``slot/*``, ``state/*``, ``last_step``, ``frequency``, ``step``): every row
    of the share is replaced (rows beyond its capacity evicted by policy).
``SetReady``
    marks this task ready: the chief finished initializing or restoring it,
    so non-chief clients' ``Register`` calls stop answering "not ready".
    ``meta.generation`` (after a restore) must be the generation this task's
    ``BeginRestore`` set (else ABORTED, the restore fence, nothing changed: a deposed
    restorer's late ``SetReady`` while a newer restore goes on, or after it: asked again with the step's restart,
    :meth:`~psflow.ps.restore_gate.RestoreGate.opening`), and
    ``meta.global_step`` the step a sync run starts over at (see
    :meth:`psflow.ps.sync.SyncAggregator.reset`). The task holding global_step
    first records its journal's next block (:meth:`~psflow.ps.global_step.GlobalStep.reserve`),
    so the first push does not wait for that write.
``BeginRestore``
    ``meta = {"generation": g, "epoch": e | null, "holder": str}``: the chief
    is about to restore every ps task (a ps task died). Fenced by ``epoch``
    like ``SaveShard``; marks this task not ready at generation ``g`` (pushes
    of other generations are refused from now on) and waits (at most 10 s)
    for pushes in flight. Replies ``{global_step, step_floor, registered, drained}``.
``ReaderPositions``
    ``{"positions": {client: ReaderPosition JSON}}``, the newest position each
    worker reported with its pushes (only on the task holding global_step).
``CheckpointStatus``
    the cluster's checkpoint ledger (kept on the task holding global_step, so
    every chief of the run, the launcher and the tools see one): the
    *lineage* of the model state (born at the first save of a freshly
    initialized cluster, carried through checkpoints: ``LoadShard``'s
    ``lineage`` sets it on a restore) and the save outcomes. ``meta =
    {"lineage_if_unset": str}`` sets the lineage only if none is set;
    ``{"outcome": {"saved": bool, "global_step": S, "path": str, "error": str,
    "writer": str, "report_id": str}}`` counts one save (once per
    ``report_id``: a resent report is not counted again). Replies ``{lineage, saved, failed,
    failed_in_a_row, last_saved_step, last_saved_path, failures: [{seq,
    global_step, error, writer, time}]}`` (the newest 20 failures, ``seq``
    counting from 1). The ledger lives in the process's memory: a restarted
    task starts from zero (the restore sets the lineage again). With
    replicated shards it is replicated with its shard (a change is answered
    once the backups hold it; :mod:`psflow.ps.replication.save_ledger`), so a
    promoted backup serves it whole.

Guarantees: a refused ``LoadShard`` (INVALID_ARGUMENT naming the task, the
partition and the array; ABORTED, the restore fence) changes nothing; ``SaveShard`` never leaves a
partial file under its final name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

import numpy as np
from safetensors.numpy import save as safetensors_save

from psflow import storage
from psflow.coord.api import FencedError
from psflow.coord.fence import FenceGuard
from psflow.ps.global_step import GlobalStep, StepJournalError
from psflow.ps.protocol import (
    BeginRestoreReply,
    BeginRestoreRequest,
    CheckpointStatusReply,
    CheckpointStatusRequest,
    LoadShardReply,
    LoadShardRequest,
    ReaderPositionsReply,
    ReaderPositionsRequest,
    SaveShardReply,
    SaveShardRequest,
    SetReadyReply,
    SetReadyRequest,
)
from psflow.ps.restore_gate import RestoreGate
from psflow.ps.save_ledger import SaveLedger
from psflow.ps.shard_load import plan_load
from psflow.ps.shard_snapshot import (
    DYNAMIC_SEPARATOR,
    SLOT_SEPARATOR,
    dynamic_tensor_names,
    non_finite,
    shard_tensor_names,
    shard_tensors,
)
from psflow.ps.step_clock import StepClock
from psflow.ps.update_mode import UpdateMode
from psflow.ps.variable_store import VariableStore
from psflow.ps.worker_ledger import WorkerLedger
from psflow.rpc.api import FencedOff, Handler, InvalidRequest, PreconditionFailed, Reply
from psflow.rpc.framing import Frame

__all__ = ["CheckpointHandlers", "HeldPushes", "PushCount", "DYNAMIC_SEPARATOR", "SLOT_SEPARATOR", "shard_tensor_names",
           "dynamic_tensor_names"]

log = logging.getLogger(__name__)

#: Seconds BeginRestore waits for pushes in flight (a sync push may wait for its step that long).
_DRAIN_TIMEOUT = 10.0


class HeldPushes(NamedTuple):
    """The pushes a replicated shard's state holds: ``total`` in all, ``by_process`` per client process
    (``[[worker, incarnation, count], ...]``)."""

    total: int
    by_process: list[list[Any]]


class PushCount(Protocol):
    """A replicated shard's count of applied pushes, carried by its checkpoints (``SaveShard``, ``LoadShard``)."""

    def holding(self) -> AbstractContextManager[HeldPushes]:
        """No push is applied while held (a snapshot within holds exactly the pushes counted); gives the counts."""

    def restored(self, count: int, by_process: list[list[Any]] | None) -> None:
        """The shard's state was restored within the run from a checkpoint holding ``count`` pushes,
        ``by_process`` of each client process (None: not in the checkpoint)."""


class CheckpointHandlers:
    """SaveShard / LoadShard / SetReady / ReaderPositions of one ps task. ``push_count``: set on a replicated
    shard's member (:mod:`psflow.ps.replication`; None: unreplicated, no count saved or loaded)."""

    push_count: PushCount | None = None

    def __init__(self, *, variables: VariableStore, clock: StepClock, workers: WorkerLedger, gate: RestoreGate,
                 mode: UpdateMode, fence: FenceGuard, saves: SaveLedger, checkpoint_root: str | None = None,
                 confine: bool = False) -> None:
        """Args:
            variables: the task's variables (saved and loaded).
            clock: its global_step (saved, set by a load) and the steps its averages catch up to.
            workers: the reader positions and examples saved and loaded; the worker claiming its position.
            gate: readiness and generation (``SetReady``, ``BeginRestore``).
            mode: the sync step a restore starts over.
            fence: the chief's epoch a write is fenced with.
            saves: the checkpoint ledger (``CheckpointStatus``, ``LoadShard``'s lineage).
            checkpoint_root: with ``confine``, the only directory under which
                SaveShard writes (``None``: no file at all).
            confine: enforce ``checkpoint_root`` (False: an in-process service
                no peer can reach; SaveShard writes where its caller says).
        """
        self._variables, self._clock, self._workers, self._gate = variables, clock, workers, gate
        self._mode, self._fence, self._saves = mode, fence, saves
        self.task_name = variables.task_name
        self._root, self._confine = checkpoint_root, confine

    def handlers(self) -> dict[str, Handler]:
        """Method name -> handler."""
        return {
            "SaveShard": self.save_shard,
            "LoadShard": self.load_shard,
            "SetReady": self.set_ready,
            "ReaderPositions": self.reader_positions,
            "BeginRestore": self.begin_restore,
            "CheckpointStatus": self.checkpoint_status,
        }

    def _fenced(self, epoch: int | None, holder: str) -> Any:
        """The fence held for a write carrying the chief's ``epoch`` (a no-op context without one)."""
        if epoch is None:
            return contextlib.nullcontext()
        try:
            self._fence.check(epoch, holder=holder)
        except FencedError as e:
            raise FencedOff(str(e)) from e
        return self._fence.hold(epoch, holder=holder)

    # ---- SaveShard ---------------------------------------------------------
    def save_shard(self, frame: Frame) -> Reply:
        request = SaveShardRequest.from_frame(frame)
        path = request.path
        if path is not None and "\0" in path:  # no file system takes it: refused, not failed (INTERNAL) at open()
            raise InvalidRequest(f"refused to write checkpoint shard {path!r:.300}: it holds a NUL byte")
        if path is not None and self._confine:
            path = self._confined(path)
        with self._fenced(request.epoch, request.holder):
            return _reply(self._save_shard(path, request.since))

    def _confined(self, path: str) -> str:
        """``path`` with symlinks resolved, if it lies under the checkpoint root; else InvalidRequest."""
        if self._root is None:
            raise InvalidRequest(f"refused to write checkpoint shard {path!r:.300}: this ps task has no checkpoint "
                                 "root (start it with --checkpoint-root DIR, or save with --checkpoint-transport rpc)")
        if storage.is_remote(path) or storage.is_remote(self._root):  # an object store: the URL's prefix
            if not storage.is_under(self._root, path):
                raise InvalidRequest(f"refused to write checkpoint shard {path!r:.300}: it is outside this task's "
                                     f"checkpoint root {self._root}")
            return path
        try:
            root = os.path.realpath(self._root)
            directory = os.path.realpath(os.path.dirname(os.path.abspath(path)))
        except (ValueError, OSError) as e:  # e.g. a NUL byte
            raise InvalidRequest(f"checkpoint shard path {path!r:.300}: {e}") from e
        name = os.path.basename(path)
        if name in ("", ".", "..") or os.path.commonpath([root, directory]) != root:
            raise InvalidRequest(f"refused to write checkpoint shard {path!r:.300}: it is outside this task's "
                                 f"checkpoint root {root}")
        return os.path.join(directory, name)

    def _save_shard(self, path: str | None, since: dict[str, Any] | None) -> SaveShardReply:
        counter, generation = self.push_count, self._gate.check_save()  # no shard holding part of a restore
        ready = self._gate.ready  # not ready: initial values, or those of a restore not begun here yet
        with counter.holding() if counter is not None else contextlib.nullcontext(None) as held:
            step, positions, examples, tensors, parts, marks = self._snapshot(since)
        self._gate.check_save(generation)  # nor one begun during the snapshot
        bad = non_finite(tensors)
        if bad:  # a diverged model: a checkpoint of it would rotate away the good ones (nothing is written)
            held_by = ", ".join(f"{name} holds {n} non-finite value{'s' if n > 1 else ''}" for name, n in bad[:5])
            of = f"the checkpoint shard of global_step {step}" if step is not None else "its checkpoint shard"
            raise InvalidRequest(f"{self.task_name}: refused to save {of}: "
                                 f"{held_by}{f' (and {len(bad) - 5} more)' if len(bad) > 5 else ''} (NaN or infinite): "
                                 "the model diverged; the checkpoints already saved are kept")
        data = safetensors_save(tensors, metadata={"task": self.task_name, "partitions": json.dumps(parts)})
        reply = SaveShardReply(self.task_name, parts, step, positions, examples, len(data),
                               hashlib.sha256(data).hexdigest(), pushes_applied=held.total if held else None,
                               marks=marks, pushes_applied_by=held.by_process if held else None, generation=generation,
                               ready=ready)
        if path is None:
            return dataclasses.replace(reply, data=np.frombuffer(data, dtype=np.uint8))
        try:
            storage.write_atomically(path, data)
        except OSError as e:
            raise InvalidRequest(f"cannot write checkpoint shard {path}: {e}") from e
        at = f", step {step}" if step is not None else ""  # only the shard holding global_step knows it
        log.info("%s: wrote checkpoint shard %s (%d bytes%s)", self.task_name, path, len(data), at)
        return reply

    def _snapshot(self, since: dict[str, Any] | None
                  ) -> tuple[int | None, dict[str, str], int, dict[str, np.ndarray], list[dict[str, Any]], dict[str, Any]]:
        """(global_step, reader positions, examples, the shard's tensors, its partitions' manifest records, the
        snapshot's marks ``{"token", "epoch"}``); ``since``: the base snapshot's marks (an increment) or None."""
        variables, global_step = self._variables, self._clock.global_step
        step = global_step.value if global_step is not None else None
        # the averages moved over the steps with no push here
        variables.averages.catch_up(variables.partitions.partitions(), self._clock.table_step())
        positions, examples = self._workers.progress()
        clock = variables.partitions.marks
        marks = {"token": clock.token, "epoch": clock.advance()}  # before any partition is read
        tensors, parts = shard_tensors(variables.partitions.partitions(), since)
        return step, positions, examples, tensors, parts, marks

    # ---- LoadShard ---------------------------------------------------------
    def load_shard(self, frame: Frame) -> Reply:
        global_step = self._clock.global_step
        request = LoadShardRequest.from_frame(frame)
        self._gate.check_load(request.generation)  # a deposed restorer's late load: refused before it is read
        store = self._variables.partitions
        plan = plan_load(request, store)  # every array checked, nothing changed
        step, positions, examples, lineage = request.global_step, request.positions, request.examples, request.lineage
        if step is not None and global_step is None:
            raise InvalidRequest(f"global_step {step!r:.40} cannot be set on this task")
        # The fence asked again, no BeginRestore or SetReady until the task changed: a restore begun while the
        # arrays were checked refuses this load (nothing changed), never lets it write over that restore's state.
        with self._gate.loading(request.generation):
            if self._variables.partitions is not store:  # created anew meanwhile: the plan's are no longer held
                self._replaced(request.generation)
            if step is not None and global_step is not None:  # first: its journal write is all that can fail
                self._set_step(global_step, step, request.generation)
            plan.write(self.task_name)
            if not plan.values_only:  # the averages (and, in sync mode, the step count) belong to the restored step
                self._variables.averages.restored(request.restored_step)
                self._mode.restored_at(request.restored_step)
                self._gate.loaded(request.restored_from, request.restored_from_step, request.generation)  # for Stats
            if positions is not None:
                self._workers.restore(dict(positions), examples)
            if lineage is not None:
                self._saves.set_lineage(lineage, only_if_unset=False)
            counter = self.push_count
            if counter is not None and request.pushes_applied is not None and self._gate.generation > 0:
                counter.restored(request.pushes_applied, request.pushes_applied_by)  # a restore within the run
        log.info("%s: loaded %d partitions%s", self.task_name, plan.count,
                 f", global_step {step}" if step is not None else "")
        return _reply(LoadShardReply(plan.count))

    def _replaced(self, generation: int | None) -> None:
        """(Under the restore mutex) the partitions a load checked its arrays against were created anew since (a
        chief's ``Register`` at start, a task not ready with no restore in progress; a replicated shard's member
        rebuilt from a new primary): the load is refused before it changes anything.

        Raises:
            PreconditionFailed: always (names this task and the generation).
        """
        raise PreconditionFailed(
            f"LoadShard{'' if generation is None else f' of generation {generation}'} refused: {self.task_name}'s "
            "variables were created anew while its arrays were checked (a chief's Register, or this member "
            "rebuilt its shard from a new primary); nothing loaded")

    def _set_step(self, global_step: GlobalStep, step: int, generation: int | None) -> None:
        """global_step set to a load's ``step``, before the load changes anything else.

        Raises:
            PreconditionFailed: its journal cannot be written (names this task, the generation and the file): the
                user's disk or directory, not a bug, so one line here and to the restorer, no traceback; nothing
                loaded.
        """
        try:
            global_step.set(step)
        except StepJournalError as e:
            why = (f"{e}; LoadShard{'' if generation is None else f' of generation {generation}'} refused: "
                   f"{self.task_name} must record global_step {step} there before it holds it; nothing loaded")
            log.error("%s: %s", self.task_name, why)
            raise PreconditionFailed(why) from e

    # ---- SetReady / ReaderPositions ----------------------------------------
    def set_ready(self, frame: Frame) -> Reply:
        request = SetReadyRequest.from_frame(frame)
        if not self._variables.registered:
            raise InvalidRequest(f"{self.task_name}: cannot become ready before the chief registered the variables")
        self._gate.check_open(request.generation, request.client)  # a deposed restorer's: refused, nothing changed
        # Asked again under the restore mutex, with the changes: no BeginRestore since the ask (a newer restore's
        # whole run, its own SetReady included) has this one's step restart land over that restore's.
        with self._gate.opening(request.generation, request.client):
            if request.generation is not None:  # a restore is complete: in sync mode the step starts over there
                self._mode.restart(request.global_step)
            if self._clock.global_step is not None:  # the first push's journal write, done before training
                self._clock.global_step.reserve()
        log.info("%s: ready (initialized by %s, generation %d)", self.task_name, request.client, self._gate.generation)
        return _reply(SetReadyReply())

    def begin_restore(self, frame: Frame) -> Reply:
        request = BeginRestoreRequest.from_frame(frame)
        generation = request.generation
        with self._fenced(request.epoch, request.holder):
            registered = self._variables.registered
            self._gate.close(generation)
            self._workers.forget_finished()  # the restore rewinds every worker
            # sync pushes waiting for a step give up (their workers recover)
            self._mode.abort(f"{self.task_name}: the cluster is being restored (generation {generation}); "
                             f"sync step abandoned")
            drained = self._gate.drain(_DRAIN_TIMEOUT)
        if not drained:
            log.warning("%s: pushes still in flight after %.0f s; restoring anyway", self.task_name, _DRAIN_TIMEOUT)
        global_step = self._clock.global_step
        step = global_step.value if global_step is not None else None
        floor = global_step.floor if global_step is not None else None
        log.info("%s: restore to generation %d begins%s", self.task_name, generation,
                 f" (global_step {step})" if step is not None else "")  # only the task holding it knows it
        return _reply(BeginRestoreReply(step, floor, registered, drained))

    def reader_positions(self, frame: Frame) -> Reply:
        request = ReaderPositionsRequest.from_frame(frame)
        if request.incarnation is not None:  # a worker process reads its position: see psflow.ps.worker_ledger
            self._workers.claim(request.worker, request.incarnation)
        return _reply(ReaderPositionsReply(self._workers.positions()))

    # ---- CheckpointStatus --------------------------------------------------
    def checkpoint_status(self, frame: Frame) -> Reply:
        ledger = self._saves
        request = CheckpointStatusRequest.from_frame(frame)
        if request.lineage_if_unset is not None:
            ledger.set_lineage(request.lineage_if_unset, only_if_unset=True)
        if request.outcome is not None:
            ledger.record(request.outcome)
        return _reply(ledger.status())


def _reply(message: BeginRestoreReply | CheckpointStatusReply | LoadShardReply | ReaderPositionsReply | SaveShardReply
           | SetReadyReply) -> Reply:
    frame = message.to_frame()
    return frame.meta, frame.arrays
