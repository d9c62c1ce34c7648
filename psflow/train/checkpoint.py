"""Sharded, atomic checkpoints: save from the chief, restore onto any layout.

On disk (``checkpoint_dir``)::

    checkpoint.lock                   the run writing here (psflow.train.checkpoint_lock)
    checkpoint                        pointer: {"latest": "ckpt-000000120", "all": [...], "global_step": 120,
                                                "lineage": L, "run_id": R, "epoch": E, "holder": H}
    ckpt-000000120/
        writer.json                        written first: run id, lineage, epoch of the writer
        shard-00000-of-00002.safetensors   ps task 0's partitions and optimizer slots
        shard-00001-of-00002.safetensors   ps task 1's
        manifest.json                      written last (see :class:`Manifest`)

*Lineage*: the model state a checkpoint belongs to. A freshly initialized
cluster starts one at its first save (the saving run's id); a cluster
restored from a checkpoint continues the checkpoint's (``LoadShard`` carries
it to the ps task holding global_step, whose ``CheckpointStatus`` ledger
every chief of the run reads). Rotation only ever deletes checkpoints of the
saving cluster's own lineage.

Save (:meth:`CheckpointManager.save`, run by the chief), in order (with an
``epoch``, the chief's lease epoch, steps 2, 4 and 6 are fenced: a ps task
that has seen a newer chief's epoch refuses, and the save fails with
:class:`CheckpointFencedError`):
    1. the run lock is confirmed (:class:`~psflow.train.checkpoint_lock.CheckpointDirLock`:
       another live run holding the directory fails the save); the lineage is
       read from the ledger; leftovers of crashed saves of this lineage are
       deleted; ``ckpt-<step>/writer.json`` is written;
    2. every ps task snapshots its partitions (each under its own lock) and
       writes its shard, all tasks in parallel (``SaveShard``). With
       ``transport="rpc"`` the tasks stream their shard bytes back and the
       chief writes them, so the ps tasks need no shared filesystem;
    3. the chief writes ``manifest.json`` (variables, shapes, dtypes,
       partitioning, slots, global_step, each worker's reader position, the
       cluster, the model, the lineage and the writing run, the psflow
       version, each shard's size and sha256);
    4. every ps task confirms the chief's epoch (``Fence``);
    5. the chief switches the pointer ``checkpoint`` by atomic rename, as a
       compare-and-swap under the directory's ``flock``: a pointer written by
       a newer epoch of the same run is never replaced (the save fails), and
       the checkpoint must still be complete;
    6. the fence is checked again: refused (a successor was elected
       meanwhile), the previous pointer is put back if the pointer is still
       this save's, and the save fails;
    7. only then are checkpoints of this lineage beyond ``max_to_keep`` (and
       leftovers of crashed saves) deleted, under the same ``flock``; a save
       in progress of a newer epoch is never touched.
What rotation keeps (step 5 decides it, step 7 deletes the rest) is read
from the directory, never from the pointer: the new checkpoint and the
newest ``max_to_keep - 1`` other complete checkpoints of this lineage (their
manifests' ``lineage``; newest by ``global_step``, then ``created``). So a
pointer that is missing, damaged or names something outside the directory
cannot make a save delete a checkpoint it should keep, and ``max_to_keep``
holds whatever the pointer said. The pointer's ``all`` lists what was kept.
Every file is written to a temp name, fsynced and renamed, so a crash at any
moment leaves the previous checkpoint (the one the pointer names) intact and
restorable; a checkpoint directory without a manifest is never restored.

In an object store (``s3://bucket/ckpt``, ``gs://bucket/ckpt``; see
:mod:`psflow.storage`) there is no rename and no directory: every file is
one put (the object appears whole or not at all), in the same order (the
writer file, the shards, the manifest, the pointer last), and a checkpoint
directory is a prefix. So a crash at any moment still leaves the pointer on
a complete checkpoint, and a prefix without its manifest is an incomplete
save: never restored, deleted by a later save of its lineage as on disk.
The directory's ``flock`` becomes a lock object created by a conditional put
(:mod:`psflow.train.checkpoint_lock`). With ``transport="local"`` every ps
task puts its own shard (with its own credentials); ``"rpc"`` streams them
to the chief, which puts them. Readers fetch each shard once into a local
temp directory and check its sha256 there.

A failed save (a full or read-only disk, a ps task that cannot write, the
lock lost to another run) removes its partial directory, is logged as an
error, counted in the ledger (``checkpoints_failed``; the launcher prints a
line for each) and raises :class:`CheckpointError`; the chief duties go on.
The ``max_failed_saves``-th failure in a row raises
:class:`CheckpointSavesFailedError`, which ends the run: training on without
a checkpoint is not silently allowed. A save refused by a newer chief's epoch
(:class:`CheckpointFencedError`) is not a failure: the newer chief saves.

Readers (:func:`latest_checkpoint`: the launcher and the chief before a
restore, a restore after a ps task died, the evaluator, ``psflow export``,
warm start from a directory) follow the pointer only to a complete
``ckpt-*`` directory directly inside the checkpoint directory. A pointer
that names one that is gone or incomplete falls back to the newest complete
checkpoint the pointer lists. A pointer that is missing (beside
checkpoints), unreadable, not a JSON object, or names anything else (an
absolute path, ``..``, a symlink) is reported (a WARNING naming the pointer
file and what was wrong, once per process) and ignored: the newest complete
checkpoint inside the directory is used (by ``global_step``, then
``created``). The next save writes a good pointer.

Restore (:func:`restore`) reads the manifest and, for each partition of the
*current* layout, assembles its rows (and its optimizer slots' rows) from the
saved partitions that overlap it, re-slicing along axis 0, and sends them to
the ps task holding it (``LoadShard``). So a checkpoint restores onto a
different number of ps tasks, placement strategy or partition count. 0-d
optimizer state (Adam's beta powers) is taken from the saved partition that
held the new partition's first row. A dynamic table (:mod:`psflow.ps.dynamic`)
is saved as each share's id-sorted snapshot (ids, rows, slots, last use,
frequency) and restored re-split by :func:`~psflow.ps.dynamic.owner_of` onto
the current ps tasks (:func:`~psflow.ps.dynamic.resplit_snapshots`): every row
and slot lands, unchanged, on the task that owns its id now. Restoring a
dynamic table onto a static variable (or back) is refused, naming it.

A variable's moving average (:mod:`psflow.ps.averages`) is saved as its slot
``ExponentialMovingAverage`` and re-sliced like the optimizer's slots. Restored
into a run that averages the variable, a checkpoint without one starts the
average at the restored value; into a run that does not, the saved one is
left out. :func:`read_variables` reads the averages in place of the variables
when asked (``psflow export --moving-averages``, evaluation with averages).

Tensors are stored with safetensors; nothing is ever pickled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import tempfile
import time
import weakref
from collections.abc import Callable, Collection, Mapping
from concurrent import futures
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from safetensors import safe_open

from psflow import jsonio, storage
from psflow.errors import TrainingError
from psflow.ps.averages import AVERAGE_SLOT
from psflow.ps.checkpointing import dynamic_tensor_names, shard_tensor_names
from psflow.ps.client import ParameterClient
from psflow.ps.dynamic import DynamicTableError, resplit_snapshots
from psflow.ps.protocol import (
    CheckpointStatusReply,
    CheckpointStatusRequest,
    FenceRequest,
    LoadShardRequest,
    SaveOutcome,
    SaveShardReply,
    SaveShardRequest,
)
from psflow.ps.store import partition_key
from psflow.rpc.api import FailedPreconditionError, RpcError
from psflow.train.checkpoint_lock import CheckpointDirLock, CheckpointError, directory_mutex, new_run_id

__all__ = [
    "DYNAMIC_IDS",
    "CheckpointError",
    "CheckpointFencedError",
    "CheckpointSavesFailedError",
    "CheckpointManager",
    "SaveStatusWatcher",
    "checkpoint_status",
    "Manifest",
    "SavedCheckpoint",
    "restore",
    "warm_start",
    "read_warm_start",
    "read_manifest",
    "read_safetensors",
    "read_variables",
    "latest_checkpoint",
    "incomplete_checkpoints",
    "MANIFEST_NAME",
    "POINTER_NAME",
    "WRITER_NAME",
]

log = logging.getLogger(__name__)

MANIFEST_NAME = "manifest.json"
POINTER_NAME = "checkpoint"
WRITER_NAME = "writer.json"
FORMAT = "psflow-checkpoint"
FORMAT_VERSION = 1
_PREFIX = "ckpt-"


class CheckpointFencedError(CheckpointError):
    """A newer chief's epoch fenced this save off; the pointer does not name it (not a failed save)."""


class CheckpointSavesFailedError(TrainingError, RuntimeError):
    """``max_failed_saves`` saves failed in a row: the run stops rather than train without checkpoints.

    Deliberately not a :class:`CheckpointError`: the guards that let the chief
    duties go on after one failed save (``LeaderOnlyHook``) let it through.
    """


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint holds; ``manifest.json`` of a checkpoint directory.

    Attributes:
        global_step: the step of the snapshot (read on the task holding it).
        variables: name -> ``{"shape", "dtype", "trainable", "partitions": [{"index", "task",
            "row_start", "row_stop", "shard", "slots"}]}``.
        shards: ``[{"file", "task", "bytes", "sha256"}]``.
        reader_positions: worker task -> ReaderPosition JSON.
        examples: examples pushed up to those reader positions (read with
            them), so a resumed run can be checked to consume each record once.
        cluster: the cluster that wrote it (ClusterSpec dict).
        optimizer: the model's optimizer spec (JSON) or None.
        model: the model that wrote it: ``{"name", "config", "data"}`` (its
            registry name or import path, its ModelConfig dict, and how its
            data was read: format, schema, num_features), or None (older
            checkpoints).
        psflow_version: the writer's version.
        created: Unix time of the save.
        lineage: the model state's lineage (see the module docstring), or None (older checkpoints).
        run: the writing run: ``{"run_id", "epoch", "holder", "writer", "host", "pid"}``, or None.
        final: written when training ended (every worker finished its data, or ``--max-steps`` was
            reached): no newer checkpoint of this run follows. An evaluator stops after it.
    """

    global_step: int
    variables: dict[str, dict[str, Any]]
    shards: list[dict[str, Any]]
    reader_positions: dict[str, str] = field(default_factory=dict)
    examples: int = 0
    cluster: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    psflow_version: str = ""
    created: float = 0.0
    lineage: str | None = None
    run: dict[str, Any] | None = None
    final: bool = False

    def to_json(self) -> str:
        data = {"format": FORMAT, "format_version": FORMAT_VERSION, **self.__dict__}
        # Keys in their own order, never sorted: the model record's features are in the data's order, which the
        # model's dense and merged sparse inputs follow (sorting them made psflow predict misread Criteo's I1..I13).
        return jsonio.dumps(data, nonfinite="error", what="checkpoint manifest", indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        """Parses a manifest.

        Raises:
            CheckpointError: not a psflow manifest (names ``where``).
        """
        try:
            data = json.loads(text)
            if data.pop("format", None) != FORMAT:
                raise ValueError("not a psflow checkpoint manifest")
            version = data.pop("format_version", None)
            if version != FORMAT_VERSION:
                raise ValueError(f"format version {version!r}, this psflow reads {FORMAT_VERSION}")
            return cls(**data)
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{where}: bad manifest: {e}") from e


@dataclass(frozen=True)
class SavedCheckpoint:
    """A completed save: its directory and global_step."""

    path: str
    global_step: int


def _version() -> str:
    from psflow import __version__

    return __version__


def read_manifest(path: str) -> Manifest:
    """The manifest of checkpoint directory ``path``.

    Raises:
        CheckpointError: missing or malformed (names the file).
    """
    file = os.path.join(path, MANIFEST_NAME)
    try:
        return Manifest.from_json(storage.read_bytes(file).decode("utf-8", "replace"), file)
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} has no readable manifest: {e}") from e


def latest_checkpoint(directory: str) -> str | None:
    """The newest complete checkpoint in ``directory``, or None.

    The pointer decides when it names a complete ``ckpt-*`` directory
    directly inside ``directory``. A pointer that names one that is gone or
    has no manifest falls back to the newest complete one the pointer lists
    (``all``). A pointer that is missing (while the directory holds
    checkpoints), unreadable, not a JSON object, or names anything else (an
    absolute path, a path with ``..`` or ``/``, a symlink, a name without the
    ``ckpt-`` prefix) is ignored: the newest complete checkpoint inside
    ``directory`` (by global_step, then save time, from the manifests) is
    used. Each such problem is logged once per process as a WARNING naming
    the pointer file and what was wrong.
    """
    path, problem = _latest(directory)
    if problem is not None and problem not in _POINTER_WARNED:
        _POINTER_WARNED.add(problem)
        log.warning("%s", problem)
    return path


#: Pointer problems already logged by this process (a reader asks at every step of some loops).
_POINTER_WARNED: set[str] = set()


def _latest(directory: str) -> tuple[str | None, str | None]:
    """(the newest complete checkpoint, what was wrong with the pointer, or None when nothing was)."""
    pointer = os.path.join(directory, POINTER_NAME)
    data, problem = _pointer_data(pointer)
    if data is not None:
        name = data.get("latest")
        if not _checkpoint_name(name) or storage.islink(os.path.join(directory, str(name))):
            problem = f"names {name!r}, which is not a {_PREFIX}* directory directly inside {directory}"
        elif _complete(os.path.join(directory, str(name))):
            return os.path.join(directory, str(name)), None
        else:
            problem = f"names {os.path.join(directory, str(name))}, which is gone or has no manifest"
            listed = data.get("all")
            for other in reversed(listed if isinstance(listed, list) else []):
                path = os.path.join(directory, str(other))
                if _checkpoint_name(other) and not storage.islink(path) and _complete(path):
                    return path, f"checkpoint pointer {pointer} {problem}; using {other}, the newest complete one it lists"
    complete = _complete_checkpoints(directory)
    newest = complete[-1][0] if complete else None
    if data is None and problem is None:  # no pointer file
        if newest is None:
            return None, None  # and no checkpoint yet: a fresh directory
        problem = "is missing"
    using = (f"using the newest complete checkpoint inside it, {os.path.basename(newest)}" if newest is not None
             else "it holds no complete checkpoint")
    return newest, f"checkpoint pointer {pointer} {problem}; ignored: {using}"


def _pointer_data(pointer: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the pointer's JSON object, None), or (None, what is wrong); (None, None): there is no pointer file."""
    try:
        raw = storage.read_bytes(pointer)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot be read ({e})"
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return None, f"is not a JSON object (damaged? {len(raw)} bytes)"
    return data, None


def _checkpoint_name(name: object) -> bool:
    """``name`` can only name a directory directly inside the checkpoint directory: ``ckpt-*``, no path."""
    return (isinstance(name, str) and name.startswith(_PREFIX) and os.path.basename(name) == name
            and "/" not in name and "\\" not in name)


def _complete(path: str) -> bool:
    return storage.exists(os.path.join(path, MANIFEST_NAME))


def _complete_checkpoints(directory: str) -> list[tuple[str, dict[str, Any]]]:
    """The complete checkpoints directly inside ``directory`` with their manifests, oldest first.

    Ordered by global_step, then save time (``created``), then name. A checkpoint whose manifest cannot be
    read is not listed. Read from the directory alone, never from the pointer.
    """
    found = []
    for path in _checkpoint_dirs(directory):
        manifest = _read_json(os.path.join(path, MANIFEST_NAME))
        if manifest is not None:
            found.append((path, manifest))
    return sorted(found, key=_age)


def incomplete_checkpoints(directory: str) -> list[str]:
    """The ``ckpt-*`` directories directly inside ``directory`` that are no checkpoint one can restore (no
    manifest, or one that cannot be read: saves that did not complete), by name."""
    complete = {path for path, _ in _complete_checkpoints(directory)}
    return [path for path in _checkpoint_dirs(directory) if path not in complete]


def _age(item: tuple[str, dict[str, Any]]) -> tuple[int, float, str]:
    path, manifest = item
    step, created = manifest.get("global_step"), manifest.get("created")
    return (step if type(step) is int else -1, float(created) if isinstance(created, (int, float)) else 0.0,
            os.path.basename(path))


def _read_json(path: str) -> dict[str, Any] | None:
    """A small JSON object file, or None (missing, unreadable, not an object)."""
    try:
        data = json.loads(storage.read_bytes(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _checkpoint_dirs(directory: str) -> list[str]:
    return storage.subdirectories(directory, _PREFIX)  # a symlink is left out: it leads outside


def _fsync_dir(path: str) -> None:
    storage.sync_dir(path)  # (an object store: nothing to do)


class CheckpointManager:
    """Saves checkpoints of a cluster into one directory and keeps the newest few of its lineage.

    Only the chief uses it; it is not thread-safe (one save at a time).
    Counters: ``saves_failed`` (in all) and ``failed_in_a_row`` (reset by a
    completed save); ``last_error``.
    """

    def __init__(self, directory: str, *, max_to_keep: int = 5, transport: str = "local",
                 fault: Callable[[str], None] | None = None, lock: CheckpointDirLock | None = None,
                 run_id: str | None = None, max_failed_saves: int = 0) -> None:
        """Args:
            directory: the checkpoint directory (created if missing).
            max_to_keep: complete checkpoints of this lineage kept (>= 1); older
                ones are deleted after a newer one is complete.
            transport: ``"local"``: each ps task writes its shard into
                ``directory`` itself (a filesystem shared with the chief);
                ``"rpc"``: shards are streamed to the chief, which writes them.
            fault: test hook, called with the name of each phase
                (``"shards_written"``, ``"manifest_written"``; with an epoch also
                ``"fence_checked"`` and ``"pointer_switched"``); it may end the process.
            lock: the run's lock of ``directory``, confirmed before every save
                (None: not locked; a library user's own arrangement).
            run_id: this run's id (default: the lock's, else a fresh one): pointers
                of the same run are compared by epoch, and a fresh cluster's
                lineage is named after it.
            max_failed_saves: the failure in a row that raises
                :class:`CheckpointSavesFailedError` (0: never).

        Raises:
            CheckpointError: a bad ``max_to_keep``, ``transport`` or ``max_failed_saves``.
        """
        if max_to_keep < 1:
            raise CheckpointError(f"max_to_keep must be >= 1, got {max_to_keep}")
        if transport not in ("local", "rpc"):
            raise CheckpointError(f"checkpoint transport must be 'local' or 'rpc', got {transport!r}")
        if max_failed_saves < 0:
            raise CheckpointError(f"max_failed_saves must be >= 0, got {max_failed_saves}")
        self.directory = directory
        self.max_to_keep = max_to_keep
        self.transport = transport
        self._fault = fault
        self._fence: tuple[int, str] | None = None  # (epoch, holder) of the save in progress; None: unfenced
        self._lock = lock
        self.run_id = run_id or (lock.run_id if lock is not None else new_run_id())
        self.max_failed_saves = max_failed_saves
        self.saves_failed = 0
        self.failed_in_a_row = 0
        self.last_error: str | None = None
        self._current: str | None = None
        self._step: int | None = None

    def latest(self) -> str | None:
        """See :func:`latest_checkpoint`."""
        return latest_checkpoint(self.directory)

    def save(self, client: ParameterClient, *, optimizer: Mapping[str, Any] | None = None,
             model: Mapping[str, Any] | None = None, epoch: int | None = None, holder: str = "",
             final: bool = False) -> SavedCheckpoint:
        """Saves every ps task's variables and slots; see the module docstring for the order.

        Blocks until the checkpoint is complete and the pointer names it.
        Training may continue meanwhile; each partition is snapshotted whole.
        Never retried here; a failed save leaves no directory behind (a crash
        of the process may: the next save of this lineage deletes it).

        Args:
            client: connected to every ps task.
            optimizer: recorded in the manifest.
            model: the model's name, config and data settings, recorded in the manifest.
            epoch: the saving chief's lease epoch (fences the save); None: unfenced.
            holder: the lease holder, for the ps tasks' refusal messages.
            final: training ended; recorded in the manifest (:attr:`Manifest.final`).

        Raises:
            CheckpointFencedError: a newer chief's epoch refused the save (not counted as failed).
            CheckpointError: the save failed (a ps task failed to save, a file
                could not be written, the directory is locked by another run);
                counted, logged, reported to the ledger.
            RpcError: the ps tasks could not be reached (counted as above).
            CheckpointSavesFailedError: that was the ``max_failed_saves``-th failure in a row.
        """
        self._fence = None if epoch is None else (epoch, holder)
        self._current, self._step = None, None
        try:
            saved = self._save(client, optimizer, model, epoch, holder, final)
        except CheckpointFencedError as e:
            self._remove_current()
            log.warning("%s: checkpoint not made current: %s", client.client_name, e)
            raise
        except (CheckpointError, OSError, RpcError) as e:
            self._remove_current()
            self._count_failure(client, e)
            if isinstance(e, OSError):
                raise CheckpointError(f"checkpoint of global_step {self._step} into {self.directory} failed: {e}") from e
            raise
        self.failed_in_a_row = 0
        self._report(client, SaveOutcome(True, saved.global_step, saved.path, writer=client.client_name))
        return saved

    def mark_final(self, path: str) -> None:
        """Records in the manifest of checkpoint ``path`` that training ended there (:attr:`Manifest.final`).

        For a run whose last periodic save fell on its last step. The manifest is replaced whole
        (write, fsync, rename): a reader sees the old or the new one, both valid.

        Raises:
            CheckpointError: ``path`` has no readable manifest (it was deleted meanwhile).
        """
        manifest = read_manifest(path)
        if not manifest.final:
            storage.write_atomically(os.path.join(path, MANIFEST_NAME), replace(manifest, final=True).to_json().encode())

    def _save(self, client: ParameterClient, optimizer: Mapping[str, Any] | None, model: Mapping[str, Any] | None,
              epoch: int | None, holder: str, final: bool = False) -> SavedCheckpoint:
        if self._lock is not None:
            self._lock.acquire()
        storage.makedirs(self.directory)
        self._step = step_hint = client.global_step()
        lineage = self._lineage(client)
        with directory_mutex(self.directory):
            for stale in self._deletable(lineage, epoch, keep=()):
                if not _complete(stale):  # leftovers of crashed saves of this lineage
                    storage.remove_tree(stale, ignore_errors=True)
            name = f"{_PREFIX}{step_hint:09d}"
            if storage.exists(os.path.join(self.directory, name)):
                name = f"{name}-{time.time_ns()}"
            path = os.path.join(self.directory, name)
            if not storage.is_remote(path):  # (an object store has no directories: the writer file makes it)
                os.makedirs(path)
            self._current = path
            # Written before the mutex is let go: a checkpoint directory without its writer file, seen under the
            # mutex, is a leftover of a save killed in between (see _deletable).
            writer = {"run_id": self.run_id, "lineage": lineage, "epoch": epoch, "holder": holder,
                      "writer": client.client_name, "host": socket.gethostname(), "pid": os.getpid()}
            storage.write_atomically(os.path.join(path, WRITER_NAME),
                                  jsonio.dumps(writer, nonfinite="error", what=WRITER_NAME, indent=1).encode())
        replies = self._write_shards(client, path)
        self._phase("shards_written")
        manifest = self._manifest(client, replies, optimizer, model, lineage, writer, final)
        storage.write_atomically(os.path.join(path, MANIFEST_NAME), manifest.to_json().encode())
        self._phase("manifest_written")
        self._check_fence(client, path)
        if epoch is not None:
            self._phase("fence_checked")
        kept, previous = self._switch_pointer(name, manifest.global_step, lineage, epoch, holder)
        if epoch is not None:
            self._phase("pointer_switched")
            try:
                self._check_fence(client, path)
            except CheckpointFencedError:
                self._undo_pointer(name, previous)
                raise
            except CheckpointError as e:  # a ps task unreachable: the checkpoint is complete and current
                log.warning("%s: could not re-check the fence after making %s current: %s", client.client_name, path, e)
        self._current = None
        self._delete_old(kept, lineage, epoch)
        log.info("%s: saved checkpoint %s at step %d", client.client_name, path, manifest.global_step)
        return SavedCheckpoint(path, manifest.global_step)

    def _lineage(self, client: ParameterClient) -> str:
        """The cluster's lineage from the ledger; a fresh cluster's becomes this run's id."""
        lineage = CheckpointStatusReply.from_frame(
            client.call(client.step_task, CheckpointStatusRequest(lineage_if_unset=self.run_id))).lineage
        return lineage or self.run_id

    def _count_failure(self, client: ParameterClient, error: BaseException) -> None:
        self.saves_failed += 1
        self.failed_in_a_row += 1
        self.last_error = f"{type(error).__name__}: {error}"
        limit = self.max_failed_saves
        log.error("%s: checkpoint of global_step %s into %s FAILED (%d in a row, %d in all%s): %s",
                  client.client_name, self._step, self.directory, self.failed_in_a_row, self.saves_failed,
                  f"; the run stops after {limit} in a row" if limit else "", self.last_error)
        self._report(client, SaveOutcome(False, self._step, error=self.last_error, writer=client.client_name))
        if limit and self.failed_in_a_row >= limit:
            raise CheckpointSavesFailedError(
                f"{client.client_name}: {self.failed_in_a_row} checkpoint saves in a row into {self.directory} failed "
                f"(--max-failed-saves {limit}): stopping rather than training without checkpoints; "
                f"last: {self.last_error}") from error

    @staticmethod
    def _report(client: ParameterClient, outcome: SaveOutcome) -> None:
        """Counts a save in the cluster's ledger (best effort: a ps task down loses the count, logged)."""
        try:
            client.call(client.step_task, CheckpointStatusRequest(outcome=outcome), timeout=5.0)
        except RpcError as e:
            log.warning("%s: could not report the checkpoint outcome to the ledger: %s", client.client_name, e)

    def _remove_current(self) -> None:
        """Deletes the directory of the save that failed, unless the pointer names it."""
        path, self._current = self._current, None
        if path is None or not storage.exists(path):
            return
        pointer = _read_json(os.path.join(self.directory, POINTER_NAME)) or {}
        if pointer.get("latest") == os.path.basename(path):
            return
        storage.remove_tree(path, ignore_errors=True)
        if storage.exists(path):
            log.error("could not remove the partial checkpoint %s", path)

    def _check_fence(self, client: ParameterClient, path: str) -> None:
        """Every ps task still accepts this chief's epoch (before and after the pointer moves)."""
        if self._fence is None:
            return
        epoch, holder = self._fence
        calls = {t: client.call_async(t, FenceRequest(epoch, holder=holder)) for t in client.channels}
        refusals, fenced = [], True
        for t, call in calls.items():  # every call collected, even after a refusal
            try:
                call.result()
            except RpcError as e:
                refusals.append(f"/job:ps/task:{t} refused: {e}")
                fenced = fenced and isinstance(e, FailedPreconditionError)
        if refusals:
            error = CheckpointFencedError if fenced else CheckpointError
            raise error(f"checkpoint {path} not made current: {'; '.join(refusals)}")

    def _phase(self, phase: str) -> None:
        if self._fault is not None:
            self._fault(phase)

    def _write_shards(self, client: ParameterClient, path: str) -> dict[int, tuple[str, SaveShardReply]]:
        """Every ps task's shard: task -> (its file name, what the task said it holds)."""
        tasks = sorted(client.channels)
        files = {t: f"shard-{n:05d}-of-{len(tasks):05d}.safetensors" for n, t in enumerate(tasks)}
        epoch, holder = self._fence if self._fence is not None else (None, "")
        calls = {}
        for n, t in enumerate(tasks):
            target = os.path.join(storage.absolute(path), files[t]) if self.transport == "local" else None
            calls[t] = client.call_async(t, SaveShardRequest(target, n, len(tasks), epoch, holder))
        replies: dict[int, tuple[str, SaveShardReply]] = {}
        with futures.ThreadPoolExecutor(len(tasks)) as pool:
            pending = {t: pool.submit(self._finish_shard, call, os.path.join(path, files[t])) for t, call in calls.items()}
            for t, fut in pending.items():
                replies[t] = (files[t], fut.result())
        _fsync_dir(path)
        return replies

    def _finish_shard(self, call: Any, file: str) -> SaveShardReply:
        try:
            reply = SaveShardReply.from_frame(call.result())
        except RpcError as e:
            fenced = self._fence is not None and isinstance(e, FailedPreconditionError)
            raise (CheckpointFencedError if fenced else CheckpointError)(f"saving shard {file} failed: {e}") from e
        if reply.data is not None:
            data = reply.data.data  # the bytes, unchanged (a view)
            if hashlib.sha256(data).hexdigest() != reply.sha256:
                raise CheckpointError(f"shard {file} from {reply.task} arrived corrupted (sha256 mismatch)")
            storage.write_atomically(file, data)
        return reply

    def _manifest(self, client: ParameterClient, replies: dict[int, tuple[str, SaveShardReply]],
                  optimizer: Mapping[str, Any] | None, model: Mapping[str, Any] | None, lineage: str,
                  writer: Mapping[str, Any], final: bool) -> Manifest:
        located = {p["key"]: (file, p) for file, reply in replies.values() for p in reply.partitions}
        variables: dict[str, dict[str, Any]] = {}
        for name, placement in client.layout.items():
            parts = []
            for part in placement.partitions:
                key = partition_key(name, part.index)
                if key not in located:
                    raise CheckpointError(f"variable {name!r} partition {part.index} was not saved by /job:ps/task:{part.task}")
                shard, saved = located[key]
                record = {"index": part.index, "task": part.task, "row_start": part.row_start,
                          "row_stop": part.row_stop, "shard": shard, "slots": saved["slots"]}
                if placement.is_dynamic:  # rows keyed by id: how many, and the snapshot's arrays
                    record.update(rows=saved["rows"], dynamic=saved["dynamic"])
                parts.append(record)
            var = placement.var
            variables[name] = {"shape": list(var.shape), "dtype": var.dtype, "trainable": var.trainable, "partitions": parts}
            if var.dynamic is not None:
                variables[name]["dynamic"] = dict(var.dynamic)
        step_reply = replies[client.step_task][1]
        if step_reply.global_step is None:
            raise CheckpointError(f"{step_reply.task} holds no global_step: its shard cannot date the checkpoint")
        return Manifest(
            global_step=step_reply.global_step,
            variables=variables,
            shards=[{"file": file, "task": r.task, "bytes": r.size, "sha256": r.sha256}
                    for _, (file, r) in sorted(replies.items())],
            reader_positions=dict(step_reply.positions),
            examples=step_reply.examples,
            cluster=json.loads(client.cluster.to_json()),
            optimizer=dict(optimizer) if optimizer is not None else None,
            model=dict(model) if model is not None else None,
            psflow_version=_version(),
            created=time.time(),
            lineage=lineage,
            run={k: writer[k] for k in ("run_id", "epoch", "holder", "writer", "host", "pid")},
            final=final,
        )

    def _switch_pointer(self, name: str, step: int, lineage: str, epoch: int | None,
                        holder: str) -> tuple[list[str], bytes | None]:
        """Compare-and-swap of the pointer (see the module docstring); returns (kept, the previous pointer's bytes).

        Raises:
            CheckpointFencedError: the pointer was written by a newer epoch of this run.
            CheckpointError: the new checkpoint is no longer complete.
        """
        pointer = os.path.join(self.directory, POINTER_NAME)
        with directory_mutex(self.directory):
            try:
                previous_bytes: bytes | None = storage.read_bytes(pointer)
            except FileNotFoundError:
                previous_bytes = None
            previous = _parse_pointer(previous_bytes)
            theirs = previous.get("epoch")
            if previous.get("run_id") == self.run_id and type(theirs) is int and (epoch is None or epoch < theirs):
                raise CheckpointFencedError(
                    f"checkpoint {name} not made current: the pointer {pointer} was written at epoch {theirs} "
                    f"(by {previous.get('holder') or 'a newer chief'}); this chief's epoch {epoch} is older")
            if not _complete(os.path.join(self.directory, name)):
                raise CheckpointError(f"checkpoint {os.path.join(self.directory, name)} was deleted before it was made "
                                      "current")
            kept = self._kept(name, lineage)
            data = jsonio.dumps({"latest": name, "all": kept, "global_step": step, "lineage": lineage,
                                 "run_id": self.run_id, "epoch": epoch, "holder": holder},
                                nonfinite="error", what=pointer, indent=1).encode()
            storage.write_atomically(pointer, data)
        return kept, previous_bytes

    def _kept(self, name: str, lineage: str) -> list[str]:
        """What rotation keeps once checkpoint ``name`` is current, oldest first: ``name`` and the newest
        ``max_to_keep - 1`` other complete checkpoints of ``lineage`` in the directory (by global_step, then
        save time, read from their manifests, never from the pointer, which may be missing or damaged)."""
        ours = [os.path.basename(p) for p, m in _complete_checkpoints(self.directory)
                if m.get("lineage") == lineage or os.path.basename(p) == name]
        others = [n for n in ours if n != name]
        kept = set(others[max(0, len(others) - (self.max_to_keep - 1)):]) | {name}
        return [n for n in ours if n in kept] if name in ours else [*(n for n in others if n in kept), name]

    def _undo_pointer(self, name: str, previous: bytes | None) -> None:
        """Puts the previous pointer back if the pointer still names ``name`` (this save's)."""
        pointer = os.path.join(self.directory, POINTER_NAME)
        with directory_mutex(self.directory):
            current = _read_json(pointer) or {}
            if current.get("latest") != name or current.get("run_id") != self.run_id:
                return  # a newer chief's pointer replaced it already
            if previous is None:
                storage.remove(pointer)
            else:
                storage.write_atomically(pointer, previous)
        log.warning("checkpoint %s: pointer %s put back to the previous checkpoint (this chief was fenced off)",
                    os.path.join(self.directory, name), pointer)

    def _deletable(self, lineage: str, epoch: int | None, keep: Collection[str]) -> list[str]:
        """Checkpoint directories this save may delete: of ``lineage``, not in ``keep``, not a newer epoch's save.

        A directory whose writer or manifest is unreadable, or of another lineage, is never listed, except an
        empty one (a save killed while creating it: see :func:`_killed_while_created`).
        """
        out = []
        for path in _checkpoint_dirs(self.directory):
            if os.path.basename(path) in keep:
                continue
            if _killed_while_created(path):
                out.append(path)
                continue
            writer = _read_json(os.path.join(path, WRITER_NAME))
            theirs = writer.get("epoch") if writer is not None else None
            if (writer is not None and writer.get("run_id") == self.run_id and type(theirs) is int
                    and epoch is not None and theirs > epoch):
                continue  # a newer chief of this run is saving there
            if _complete(path):
                ours = _lineage_of(path) == lineage
            else:
                ours = writer is not None and (writer.get("lineage") == lineage or writer.get("run_id") == self.run_id)
            if ours:
                out.append(path)
        return out

    def _delete_old(self, kept: list[str], lineage: str, epoch: int | None) -> None:
        with directory_mutex(self.directory):
            for path in self._deletable(lineage, epoch, keep=kept):
                storage.remove_tree(path, ignore_errors=True)


def _killed_while_created(path: str) -> bool:
    """A save's directory holding nothing but (maybe) its writer file's temp: the save was killed while creating it.

    Only meaningful under ``directory_mutex``: a save makes its directory and writes its writer file under it.
    """
    try:
        entries = storage.listdir(path)
    except OSError:
        return False
    return all(e.startswith(f"{WRITER_NAME}.tmp-") for e in entries)


def _parse_pointer(data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {}
    try:
        parsed = json.loads(data)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _lineage_of(path: str) -> str | None:
    """The lineage a complete checkpoint's manifest records (None: incomplete, unreadable or older)."""
    manifest = _read_json(os.path.join(path, MANIFEST_NAME))
    lineage = manifest.get("lineage") if manifest is not None else None
    return lineage if isinstance(lineage, str) else None


def checkpoint_status(client: ParameterClient, *, timeout: float = 5.0) -> dict[str, Any]:
    """The cluster's checkpoint ledger (``CheckpointStatus`` of the ps task holding global_step).

    ``{lineage, saved, failed, failed_in_a_row, last_saved_step, last_saved_path, failures}``;
    see :mod:`psflow.ps.checkpointing`. Blocks for one RPC.

    Raises:
        RpcError: the task could not be reached.
    """
    return CheckpointStatusReply.from_frame(client.call(client.step_task, CheckpointStatusRequest(),
                                                        timeout=timeout)).as_dict()


class SaveStatusWatcher:
    """The launcher's view of the ledger: a console line for every failed save, and the counts.

    :meth:`poll` asks the ledger at most every ``every`` seconds (:meth:`update`
    takes a ledger read elsewhere). Counts go on across a restart of the ps task
    holding the ledger (which starts it from zero), and so does the newest
    checkpoint (a restarted ledger knows none until its first save); failures in
    its last moments before such a restart can be missed. Not thread-safe.
    """

    def __init__(self, *, max_failed_saves: int, every: float = 2.0) -> None:
        self.max_failed_saves = max_failed_saves
        self.every = every
        self._last_poll = float("-inf")
        self._seen = 0       # failures of the current ledger already reported
        self._saved = 0      # saves of the current ledger
        self._earlier = (0, 0)  # (failed, saved) of ledgers before a restart of their task
        self._in_a_row = 0
        self._newest: tuple[int | None, str | None] = (None, None)  # (global_step, path) of the newest save seen

    @property
    def failed(self) -> int:
        """Failed saves seen in all."""
        return self._earlier[0] + self._seen

    @property
    def saved(self) -> int:
        """Completed saves seen in all."""
        return self._earlier[1] + self._saved

    def poll(self, client: ParameterClient, *, force: bool = False) -> list[str]:
        """Console lines for the failures since the last poll (none if polled less than ``every`` s ago).

        ``force``: poll now, whatever the time since the last one, wait for the channel to be
        connected (a channel whose first calls failed, before the ps tasks listened, backs off its
        reconnects) and longer for the answer (10 s instead of 2): a forced poll is the last one
        before the ps tasks stop (the run ended or failed), so a busy ps task or a short run must not
        cost the user the lines of its last failures.

        Never raises: a ledger that cannot be read now is read at a later poll.
        """
        now = time.monotonic()
        if not force and now - self._last_poll < self.every:
            return []
        self._last_poll = now
        try:
            if force:  # the channel may be backing off its reconnects (it was made before the ps tasks listened)
                client.channels[client.step_task].wait_ready(timeout=10.0)
            status = checkpoint_status(client, timeout=10.0 if force else 2.0)
        except RpcError:
            return []
        return self.update(status)

    def update(self, status: Mapping[str, Any]) -> list[str]:
        """Takes one reading of the ledger (``CheckpointStatus``); returns the console lines for the
        failures it shows for the first time."""
        failed, saved = int(status.get("failed") or 0), int(status.get("saved") or 0)
        if failed < self._seen or saved < self._saved:  # the ledger's task restarted: a new ledger
            self._earlier = (self.failed, self.saved)
            self._seen = self._saved = 0
        lines = []
        failures = [f for f in status.get("failures") or [] if isinstance(f, dict) and int(f.get("seq") or 0) > self._seen]
        missed = failed - self._seen - len(failures)
        if missed > 0:
            lines.append(f"psflow: {missed} checkpoint saves FAILED (details in the chief's log)")
        for f in failures:
            lines.append(f"psflow: checkpoint at global_step {f.get('global_step')} FAILED ({f.get('writer')}): "
                         f"{f.get('error')}")
        self._seen, self._saved = failed, saved
        self._in_a_row = int(status.get("failed_in_a_row") or 0)
        if status.get("last_saved_path"):
            step = status.get("last_saved_step")
            self._newest = (step if isinstance(step, int) else None, str(status["last_saved_path"]))
        if lines:
            limit = (f"the run stops after {self.max_failed_saves} in a row (--max-failed-saves)"
                     if self.max_failed_saves else "--max-failed-saves 0: the run goes on without checkpoints")
            lines.append(f"psflow: {status.get('failed_in_a_row')} checkpoint saves failed in a row, {self.failed} in all; "
                         f"{limit}")
        return lines

    def metrics(self) -> dict[str, int]:
        """``checkpoints_saved`` and ``checkpoints_failed`` for metrics.json."""
        return {"checkpoints_saved": self.saved, "checkpoints_failed": self.failed}

    def ledger(self) -> dict[str, Any]:
        """The run's ledger as seen so far, over every restart of its task: ``saved``, ``failed``,
        ``failed_in_a_row`` (the current ledger's), ``last_saved_step`` and ``last_saved_path``."""
        return {"saved": self.saved, "failed": self.failed, "failed_in_a_row": self._in_a_row,
                "last_saved_step": self._newest[0], "last_saved_path": self._newest[1]}


# ---- reading ----------------------------------------------------------------
class _Shards:
    """Open safetensors files of one checkpoint, checked against the manifest.

    A checkpoint in an object store: each shard is fetched once into a local temp directory (removed with
    this object), checked there and read from there (safetensors maps a local file).
    """

    def __init__(self, path: str, manifest: Manifest) -> None:
        self.path = path
        self._expected = {s["file"]: s for s in manifest.shards}
        self._open: dict[str, Any] = {}
        self._fetched: str | None = None

    def get(self, file: str) -> Any:
        handle = self._open.get(file)
        if handle is None:
            full = os.path.join(self.path, file)
            expected = self._expected.get(file)
            if expected is None:
                raise CheckpointError(f"{full}: not listed in the manifest")
            local = self._local(full, file)
            _verify(local, expected, shown=full)
            try:
                handle = safe_open(local, framework="numpy")
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"{full}: unreadable shard: {e}") from e
            self._open[file] = handle
        return handle

    def _local(self, full: str, file: str) -> str:
        """A local file holding shard ``full``: itself, or its copy fetched from the object store."""
        if not storage.is_remote(full):
            return full
        if self._fetched is None:
            self._fetched = tempfile.mkdtemp(prefix="psflow-shards-")
            weakref.finalize(self, shutil.rmtree, self._fetched, True)
        local = os.path.join(self._fetched, os.path.basename(file))
        try:
            storage.download(full, local)
        except OSError as e:
            raise CheckpointError(f"{full}: cannot read shard: {e}") from e
        return local


def _verify(file: str, expected: Mapping[str, Any], *, shown: str | None = None) -> None:
    """The local file ``file`` has the manifest's sha256 (errors name ``shown``, default ``file``)."""
    shown = shown or file
    digest = hashlib.sha256()
    try:
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise CheckpointError(f"{shown}: cannot read shard: {e}") from e
    if digest.hexdigest() != expected["sha256"]:
        raise CheckpointError(f"{shown}: sha256 differs from the manifest's (damaged shard)")


def _rows(shards: _Shards, var: str, saved: list[dict[str, Any]], start: int, stop: int,
          slot: str | None) -> np.ndarray:
    """Rows ``start:stop`` of a variable (or of one of its slots) from the saved partitions."""
    pieces = []
    for part in saved:
        value_name, slot_names = shard_tensor_names(partition_key(var, part["index"]), part["slots"])
        name = value_name if slot is None else slot_names[slot]
        tensor = shards.get(part["shard"])
        if not tensor.get_slice(name).get_shape():
            # A scalar variable (one partition), or 0-d optimizer state: taken
            # from the saved partition holding the first wanted row.
            if slot is None or part["row_start"] <= start < part["row_stop"]:
                return np.asarray(tensor.get_tensor(name))
            continue
        lo, hi = max(start, part["row_start"]), min(stop, part["row_stop"])
        if lo < hi:
            pieces.append(np.asarray(tensor.get_slice(name)[lo - part["row_start"] : hi - part["row_start"]]))
    if not pieces:
        raise CheckpointError(f"{shards.path}: no saved rows {start}:{stop} of variable {var!r}")
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)


def _dynamic_snapshot(shards: _Shards, var: str, saved: list[dict[str, Any]]) -> list[dict[str, np.ndarray]]:
    """The snapshot of each saved partition of dynamic table ``var``, by partition index."""
    out = []
    for part in sorted(saved, key=lambda p: p["index"]):
        tensor = shards.get(part["shard"])
        names = dynamic_tensor_names(partition_key(var, part["index"]), list(part["dynamic"]))
        out.append({key: np.asarray(tensor.get_tensor(name)) for key, name in names.items()})
    return out


def _table(shards: _Shards, var: str, saved: list[dict[str, Any]], num_parts: int) -> list[dict[str, np.ndarray]]:
    """Dynamic table ``var``'s saved rows re-split onto ``num_parts`` partitions (by owner_of)."""
    try:
        return resplit_snapshots(var, _dynamic_snapshot(shards, var, saved), num_parts)
    except (DynamicTableError, KeyError) as e:
        raise CheckpointError(f"{shards.path}: dynamic table {var!r}: {e}") from e


def _check_variable(path: str, manifest: Manifest, name: str, shape: tuple[int, ...], dtype: str,
                    dynamic: bool = False) -> dict[str, Any]:
    saved = manifest.variables.get(name)
    if saved is None:
        raise CheckpointError(f"checkpoint {path} has no variable {name!r} (it has {', '.join(sorted(manifest.variables))})")
    if ("dynamic" in saved) != dynamic:
        kinds = ("a static variable", "a dynamic table")
        raise CheckpointError(f"variable {name!r} is {kinds[dynamic]} in this run; checkpoint {path} has it as "
                              f"{kinds['dynamic' in saved]}")
    if tuple(saved["shape"]) != shape or saved["dtype"] != dtype:
        raise CheckpointError(f"variable {name!r} has shape {shape} ({dtype}); checkpoint {path} has "
                              f"{tuple(saved['shape'])} ({saved['dtype']})")
    return saved


def restore(client: ParameterClient, path: str, *, global_step: int | None = None) -> Manifest:
    """Loads checkpoint ``path`` into the ps tasks of ``client``'s layout.

    Re-slices every variable and its optimizer slots onto the current
    partitions (see the module docstring), then sends each ps task its
    partitions in one ``LoadShard`` call (tasks in parallel); the task
    holding global_step also gets global_step (``global_step`` if given,
    else the checkpoint's), the reader positions, the example count and the
    checkpoint's lineage (which the restored cluster continues).
    Does not mark the tasks ready (the chief does that afterwards).

    Raises:
        CheckpointError: the checkpoint is incomplete or damaged, a variable
            is missing or has another shape, dtype or set of slots (names it).
    """
    manifest = read_manifest(path)
    shards = _Shards(path, manifest)
    per_task = {t: _ShardLoad() for t in client.channels}
    for name, placement in client.layout.items():
        var = placement.var
        saved = _check_variable(path, manifest, name, tuple(var.shape), var.dtype, placement.is_dynamic)
        if placement.is_dynamic:
            for part, snapshot in zip(placement.partitions, _table(shards, name, saved["partitions"],
                                                                   len(placement.partitions)), strict=True):
                key = partition_key(name, part.index)
                load = per_task[part.task]
                load.keys.append(key)
                load.tables[key] = snapshot
            continue
        saved_parts = sorted(saved["partitions"], key=lambda p: p["row_start"])
        slots = [slot for slot in saved_parts[0]["slots"] if slot != AVERAGE_SLOT]
        saved_average = len(slots) < len(saved_parts[0]["slots"])
        for part in placement.partitions:
            key = partition_key(name, part.index)
            load = per_task[part.task]
            load.keys.append(key)
            load.values[key] = value = _rows(shards, name, saved_parts, part.row_start, part.row_stop, None)
            part_slots = load.slots.setdefault(key, {})
            for slot in slots:
                part_slots[slot] = _rows(shards, name, saved_parts, part.row_start, part.row_stop, slot)
            if var.moving_average_decay is not None:  # the saved average, else one starting at the restored value
                part_slots[AVERAGE_SLOT] = (
                    _rows(shards, name, saved_parts, part.row_start, part.row_stop, AVERAGE_SLOT) if saved_average
                    else value)
    restored_step = manifest.global_step if global_step is None else global_step
    calls: dict[int, LoadShardRequest] = {}
    for task, load in per_task.items():
        if task == client.step_task:  # the restored cluster continues the checkpoint's lineage
            calls[task] = load.request(restored_step=restored_step, global_step=restored_step,
                                       positions=manifest.reader_positions, examples=manifest.examples,
                                       lineage=manifest.lineage or None)
        else:
            calls[task] = load.request(restored_step=restored_step)
    _load_shards(client, calls, f"restoring {path}")
    return manifest


@dataclass
class _ShardLoad:
    """What one ps task loads: its partitions' keys, values, slots and dynamic tables' snapshots."""

    keys: list[str] = field(default_factory=list)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    slots: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    tables: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    def request(self, **fields: Any) -> LoadShardRequest:
        return LoadShardRequest.build(self.values, self.slots, self.tables, self.keys, **fields)


def _load_shards(client: ParameterClient, requests: Mapping[int, LoadShardRequest], what: str) -> None:
    """Sends each ps task its ``LoadShard`` (all in flight at once) and waits for every reply.

    Raises:
        CheckpointError: naming every task that refused, after all replied.
    """
    calls = {task: client.call_async(task, request) for task, request in requests.items()}
    errors = []
    for task, call in calls.items():  # every call collected, even after a refusal
        try:
            call.result()
        except RpcError as e:
            errors.append(f"/job:ps/task:{task}: {e}")
    if errors:
        raise CheckpointError(f"{what} failed: " + "; ".join(errors))


#: Suffix of a dynamic table's ids beside its rows in :func:`read_variables` and exported models.
DYNAMIC_IDS = "@ids"


def averaged_variables(manifest: Manifest) -> list[str]:
    """The variables whose moving average (slot ``ExponentialMovingAverage``) the checkpoint holds, sorted."""
    return sorted(name for name, saved in manifest.variables.items() if "dynamic" not in saved
                  and any(AVERAGE_SLOT in (part.get("slots") or ()) for part in saved.get("partitions") or ()))


def read_variables(path: str, *, slots: bool = False, moving_averages: bool = False) -> dict[str, np.ndarray]:
    """Every variable of checkpoint ``path``, whole (partitions joined).

    A dynamic table ``emb`` gives its rows sorted by id as ``emb`` ``[n, dim]``
    and their ids as ``emb@ids`` (:data:`DYNAMIC_IDS`) ``[n]`` int64.

    Args:
        path: a checkpoint directory (with a manifest).
        slots: also return each optimizer slot as ``"<var>:<slot>"`` (a moving
            average as ``"<var>:ExponentialMovingAverage"``).
        moving_averages: each averaged variable's moving average in place of
            its value (the others as they are; see :func:`averaged_variables`).

    Raises:
        CheckpointError: incomplete or damaged checkpoint.
    """
    manifest = read_manifest(path)
    shards = _Shards(path, manifest)
    out: dict[str, np.ndarray] = {}
    for name, saved in manifest.variables.items():
        if "dynamic" in saved:
            (table,) = _table(shards, name, saved["partitions"], 1)
            out[name], out[f"{name}{DYNAMIC_IDS}"] = table["values"], table["ids"]
            if slots:
                out.update({f"{name}:{k[len('slot/'):]}": v for k, v in table.items() if k.startswith("slot/")})
            continue
        parts = sorted(saved["partitions"], key=lambda p: p["row_start"])
        rows = saved["shape"][0] if saved["shape"] else 1
        average = moving_averages and AVERAGE_SLOT in parts[0]["slots"]
        out[name] = _rows(shards, name, parts, 0, rows, AVERAGE_SLOT if average else None)
        if slots:
            for slot in parts[0]["slots"]:
                out[f"{name}:{slot}"] = _rows(shards, name, parts, 0, rows, slot)
    return out


def read_warm_start(path: str) -> dict[str, np.ndarray]:
    """Whole variables to warm-start from, by name.

    ``path`` is a ``.safetensors`` file of whole variables, a directory
    written by ``psflow export``, a checkpoint, or a checkpoint directory (its
    newest checkpoint); optimizer slots are never read.

    Raises:
        CheckpointError: nothing readable at ``path`` (names it).
    """
    if storage.isdir(path):
        exported = os.path.join(path, "model.safetensors")
        if storage.exists(exported):
            path = exported
        else:
            checkpoint = path if storage.exists(os.path.join(path, MANIFEST_NAME)) else latest_checkpoint(path)
            if checkpoint is None:
                raise CheckpointError(f"warm start: {path} holds no checkpoint, exported model or safetensors file")
            return read_variables(checkpoint)
    try:
        return read_safetensors(path)
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"warm start: cannot read {path}: {e}") from e


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of the safetensors file ``path`` (a local path or a URL, see :mod:`psflow.storage`).

    Raises:
        OSError: the file cannot be read; safetensors' own errors for a file that is not one.
    """
    from safetensors.numpy import load, load_file

    if storage.is_remote(path):
        return dict(load(storage.read_bytes(path)))
    return dict(load_file(path))


def warm_start(client: ParameterClient, path: str) -> list[str]:
    """Overwrites the values of the variables found at ``path`` on the ps tasks (slots and global_step untouched).

    TensorFlow's warm start: the chief calls it right after it initialized the
    variables (never after restoring a checkpoint, which holds newer values).
    Variables not found at ``path`` keep their initializer's values. Every
    variable found there is checked before anything is sent.

    Returns:
        The names of the variables warm-started.

    Raises:
        CheckpointError: ``path`` is unreadable, or holds a variable the model
            did not declare or one of another shape or dtype (names it).
    """
    return load_values(client, read_warm_start(path), f"warm start {path}")


def load_values(client: ParameterClient, values: Mapping[str, np.ndarray], what: str) -> list[str]:
    """Overwrites the values of whole variables on the ps tasks (slots and global_step untouched).

    Every array is checked against the layout before anything is sent.

    Args:
        client: a registered client.
        values: variable name -> its whole value.
        what: where the values come from, for errors (``"warm start PATH"``).

    Returns:
        The names of the variables loaded, sorted.

    Raises:
        CheckpointError: a variable the model did not declare, or one of
            another shape or dtype (names it).
    """
    for name, array in values.items():
        placement = client.layout.get(name.removesuffix(DYNAMIC_IDS))
        if placement is None:
            raise CheckpointError(f"{what}: variable {name!r} is not a variable of the model "
                                  f"(it has {', '.join(client.layout)})")
        if placement.is_dynamic:
            raise CheckpointError(f"{what}: {placement.var.name!r} is a dynamic table, which is not warm-started "
                                  f"(restore a checkpoint to continue its rows)")
        var = placement.var
        if tuple(array.shape) != tuple(var.shape) or str(array.dtype) != var.dtype:
            raise CheckpointError(f"{what}: variable {name!r} has shape {tuple(array.shape)} ({array.dtype}); "
                                  f"the model's has {tuple(var.shape)} ({var.dtype})")
    per_task: dict[int, _ShardLoad] = {}
    for name, array in values.items():
        for part in client.layout[name].partitions:
            load = per_task.setdefault(part.task, _ShardLoad())
            key = partition_key(name, part.index)
            load.keys.append(key)
            load.values[key] = np.ascontiguousarray(array[part.row_start:part.row_stop] if array.ndim else array)
    _load_shards(client, {task: load.request(values_only=True) for task, load in per_task.items()}, what)
    return sorted(values)
