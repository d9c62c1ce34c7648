"""Save: the chief's :class:`CheckpointManager` writes one checkpoint of every ps task and makes it current.

The steps, their order, the fence and what a crash at any step leaves are the package's guarantees (see
:mod:`psflow.checkpoint`): the run lock confirmed, ``writer.json``, every shard (all ps tasks in parallel),
``manifest.json`` last, the fence checked, the pointer switched by compare-and-swap under the directory's
mutex (unless a ps task was restored or restarted since its shard was taken: :mod:`psflow.checkpoint.publish_checks`),
the fence checked again, then rotation (:mod:`psflow.checkpoint.rotation`). A failed save removes its
partial directory, is counted in the ledger and raises :class:`~psflow.errors.CheckpointError`; the
``max_failed_saves``-th in a row raises :class:`CheckpointSavesFailedError`.

Incremental checkpoints (``full_every`` K > 1): after a full checkpoint, the next K - 1 saves of this manager
are increments (:mod:`psflow.checkpoint.chain`): each ps task saves only the rows changed since the snapshot
of the base, the previous checkpoint this manager completed (:mod:`psflow.ps.row_marks`; the base's shard
records name each task's mark token and epoch). The base advances only when a save is complete (the
pointer names it), so after a failed save the next increment still holds every row changed since the last
complete one. A manager's first save is full (a new chief after a failover, a resumed run), and so is its first
at another lease epoch (it lost the lease and regained it: the chief between, resumed late, may rotate away an
older epoch's checkpoint, as it never reads a newer epoch's bases), a save whose base is gone or was written by
another number of ps tasks; a ps task whose marks are not the base's (it
restarted, or a backup was promoted) saves its partitions whole inside an increment.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any

from psflow import jsonio, storage
from psflow.checkpoint.daemon_calls import in_daemon_threads
from psflow.checkpoint.leftovers import CREATING_PREFIX, writer_identity
from psflow.checkpoint.lock import CheckpointDirLock, directory_mutex, new_run_id
from psflow.checkpoint.manifest import (
    INCREMENT,
    MANIFEST_NAME,
    POINTER_NAME,
    WRITER_NAME,
    Manifest,
    SavedCheckpoint,
    read_manifest,
)
from psflow.checkpoint.naming import checkpoint_name, free_name, remove_retired, rename_after_step, retire
from psflow.checkpoint.pointer import effective_pointer, is_complete, latest_checkpoint, publish
from psflow.checkpoint.publish_checks import PublishGate, check_fence, check_no_restore_since
from psflow.checkpoint.rotation import delete_old, remove_leftovers
from psflow.checkpoint.save_manifest import build_manifest
from psflow.checkpoint.save_notice import notify_save
from psflow.checkpoint.shard_files import shard_files
from psflow.checkpoint.switch import (
    CheckpointFencedError,
    refuse_newer_epoch,
    refuse_unless_ours,
    switch_pointer,
    undo_pointer,
)
from psflow.errors import CheckpointError, TrainingError
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import CheckpointStatusReply, CheckpointStatusRequest, SaveOutcome, SaveShardReply, SaveShardRequest
from psflow.rpc.api import DeadlineExceededError, FencedOffError, RpcError

__all__ = ["CheckpointManager", "CheckpointFencedError", "CheckpointSavesFailedError", "FinalCheckpointError",
           "refuse_newer_epoch"]

log = logging.getLogger(__name__)


class CheckpointSavesFailedError(TrainingError, RuntimeError):
    """``max_failed_saves`` saves failed in a row: the run stops rather than train without checkpoints.

    Deliberately not a :class:`CheckpointError`: the guards that let the chief
    duties go on after one failed save (``LeaderOnlyHook``) let it through.
    """


class FinalCheckpointError(TrainingError, RuntimeError):
    """The run's final checkpoint could not be written (or marked final), for any reason but a newer chief's
    fence: the chief's session ends with it, so the run fails rather than end with an older checkpoint as its
    newest (a periodic save's failure is logged, and the next period saves). Names the checkpoint directory
    and the cause.

    Deliberately not a :class:`CheckpointError`, like :class:`CheckpointSavesFailedError`: the guards that
    let the chief duties go on after one failed save let it through.
    """


class CheckpointManager:
    """Saves checkpoints of a cluster into one directory and keeps the newest few of its lineage.

    Only the chief uses it; it is not thread-safe (one save at a time). Counters: ``saves_failed`` (in all) and
    ``failed_in_a_row`` (reset by a completed save); ``last_error``. A caller that gives a save up counts it
    (:meth:`count_failure`, which raises at the limit) and sets ``abandoned``: its own late failure is not counted.
    """

    def __init__(self, directory: str, *, max_to_keep: int = 5, transport: str = "local",
                 fault: Callable[[str], None] | None = None, lock: CheckpointDirLock | None = None,
                 run_id: str | None = None, max_failed_saves: int = 0, full_every: int = 1,
                 section: Callable[[], AbstractContextManager[object]] | None = None) -> None:
        """Args:
            directory: the checkpoint directory (created if missing).
            max_to_keep: complete checkpoints of this lineage kept (>= 1); older
                ones are deleted after a newer one is complete.
            transport: ``"local"``: each ps task writes its shard into
                ``directory`` itself (a filesystem shared with the chief);
                ``"rpc"``: shards are streamed to the chief, which writes them.
            fault: test hook, called with the name of each phase (``"writer_written"``, ``"shards_written"``,
                ``"manifest_written"``; with an epoch also ``"fence_checked"`` and ``"pointer_switched"``); it may end the process.
            lock: the run's lock of ``directory``, confirmed before every save
                (None: not locked; a library user's own arrangement).
            run_id: this run's id (default: the lock's, else a fresh one): pointers
                of the same run are compared by epoch, and a fresh cluster's
                lineage is named after it.
            max_failed_saves: the failure in a row that raises
                :class:`CheckpointSavesFailedError` (0: never).
            full_every: every ``full_every``-th save of this manager is full, the others increments
                (1: every save is full).
            section: entered around each save, from its first write to its count in the ledger (the
                ``--in-process`` launcher's: no signal cuts a save; it is raised once the save is over).

        Raises:
            CheckpointError: a bad ``max_to_keep``, ``transport``, ``max_failed_saves`` or ``full_every``.
        """
        if max_to_keep < 1:
            raise CheckpointError(f"max_to_keep must be >= 1, got {max_to_keep}")
        if transport not in ("local", "rpc"):
            raise CheckpointError(f"checkpoint transport must be 'local' or 'rpc', got {transport!r}")
        if full_every < 1:
            raise CheckpointError(f"full_every (--full-checkpoint-every) must be >= 1, got {full_every}")
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
        self.abandoned = False  # the save under way was given up (and counted) by its caller's bounded wait
        self.publishing = PublishGate()  # closed as the process exits with a save given up (psflow.train.lock_at_end)
        self._reports, self._process = 0, f"{os.getpid()}.{time.time_ns()}"  # this manager's reports' ids
        self._unsent: list[SaveOutcome] = []  # reports the ledger did not take yet, oldest first
        self._sending = threading.Lock()  # the save's thread and send_unsent (the training thread's hook) both send
        self._current: str | None = None
        self._step: int | None = None  # the save under way's, read first (None: not read, or not the run's)
        self._step_unready = False  # the save under way found ps task 0 not ready (restarted): no step of the run
        self.full_every = full_every
        self._section = section
        self._base: tuple[str, Manifest] | None = None  # the last complete save of this manager (an increment's base)
        self._increments = 0  # increments since the last full save

    def latest(self) -> str | None:
        """See :func:`latest_checkpoint`."""
        return latest_checkpoint(self.directory)

    def save(self, client: ParameterClient, *, optimizer: Mapping[str, Any] | None = None,
             model: Mapping[str, Any] | None = None, epoch: int | None = None, holder: str = "",
             final: bool = False, initial: bool = False) -> SavedCheckpoint:
        """Saves every ps task's variables and slots; see :mod:`psflow.checkpoint` for the order.

        Blocks until the checkpoint is complete and the pointer names it. Training may continue meanwhile; each
        partition is snapshotted whole. In sync mode the ps tasks are told of the save while it lasts
        (:mod:`psflow.checkpoint.save_notice`): a step waiting for this chief's gradient does not time out meanwhile.
        Never retried here; a failed save leaves no directory behind (a crash of the process may: the next save deletes it).

        Args:
            client: connected to every ps task.
            optimizer: recorded in the manifest.
            model: the model's name, config and data settings, recorded in the manifest.
            epoch: the saving chief's lease epoch (fences the save); None: unfenced.
            holder: the lease holder, for the ps tasks' refusal messages.
            final: training ended; recorded in the manifest (:attr:`Manifest.final`).
            initial: the chief's initial save of the fresh cluster it initialized, before it makes the ps tasks
                ready; any other save of a task not ready fails (:func:`~psflow.checkpoint.save_manifest.check_readiness`).

        Raises:
            CheckpointFencedError: a newer chief's epoch refused the save (not counted as failed).
            CheckpointError: the save failed (a ps task failed to save, a file
                could not be written, the directory is locked by another run);
                counted, logged, reported to the ledger.
            RpcError: the ps tasks could not be reached (counted as above).
            CheckpointSavesFailedError: that was the ``max_failed_saves``-th failure in a row.
        """
        # The ps tasks hear that this chief saves: a sync step waiting for it does not time out meanwhile.
        with self._section() if self._section is not None else contextlib.nullcontext(), \
                notify_save(client, self.directory):
            return self._save_counted(client, optimizer, model, epoch, holder, final, initial)

    def _save_counted(self, client: ParameterClient, optimizer: Mapping[str, Any] | None,
                      model: Mapping[str, Any] | None, epoch: int | None, holder: str, final: bool,
                      initial: bool) -> SavedCheckpoint:
        """:meth:`save`, inside its section."""
        self._fence = None if epoch is None else (epoch, holder)
        self._current, self._step, self._step_unready = None, None, False
        try:
            saved = self._save(client, optimizer, model, epoch, holder, final, initial)
        except CheckpointFencedError as e:
            self._remove_current()
            log.warning("%s: checkpoint not made current: %s", client.client_name, e)
            raise
        except (CheckpointError, OSError, RpcError) as e:
            self._remove_current()
            if not self.abandoned:  # (one given up already counted: psflow.checkpoint.bounded_save)
                self.count_failure(client, e)
            else:
                log.error("%s: %s into %s, given up at --save-timeout (counted then), failed late: %s",
                          client.client_name, self._named(), self.directory, e)
            if isinstance(e, OSError):
                raise CheckpointError(f"{self._named()} into {self.directory} failed: {e}") from e
            raise
        self.failed_in_a_row = 0
        self._report(client, SaveOutcome(True, saved.global_step, saved.path, writer=client.client_name))
        return saved

    def mark_final(self, path: str, *, epoch: int | None = None, holder: str = "") -> None:
        """Records in the manifest of checkpoint ``path`` that training ended there (:attr:`Manifest.final`).

        For a run whose last save fell on its last step: this chief's periodic save, or another chief's save
        of that step. Only a checkpoint the pointer names is marked, under the directory's mutex; with an
        ``epoch`` (the marking chief's lease) the pointer is rewritten with it first (the same checkpoint,
        compare-and-swap as a save's switch), so a chief of an older epoch whose save of ``path`` is fenced
        off on its re-check no longer puts its previous pointer back nor removes ``path``: the checkpoint
        another chief took as the run's final one stays. The manifest is replaced whole (write, fsync,
        rename): a reader sees the old or the new one, both valid. Leftovers of this lineage's crashed saves are
        removed, as a save removes them (a resumed run that ends saving nothing leaves none; past the mutex only
        those :func:`~psflow.checkpoint.rotation.remove_leftovers` names). Idempotent.

        Raises:
            CheckpointFencedError: the pointer was written by a newer epoch of this run.
            CheckpointError: ``path`` is not the current checkpoint any more (its writer was fenced off and
                took it back, or it was deleted), or has no readable manifest: save the final checkpoint anew.
            OSError: the pointer or the manifest could not be written.
        """
        name = os.path.basename(path)
        pointer = os.path.join(self.directory, POINTER_NAME)
        with directory_mutex(self.directory, may_pass=epoch is not None) as held:
            current = effective_pointer(self.directory)[0] or {}
            if current.get("latest") != name:
                raise CheckpointError(f"checkpoint {path} is not current any more (the pointer {pointer} names "
                                      f"{current.get('latest') or 'none'}): not marked final")
            manifest = read_manifest(path)
            if epoch is not None and (current.get("run_id"), current.get("epoch")) != (self.run_id, epoch):
                refuse_newer_epoch(current, pointer, run_id=self.run_id, epoch=epoch,
                                   refused=f"checkpoint {name} not marked final")
                taken = dict(current, run_id=self.run_id, epoch=epoch, holder=holder)
                refuse_unless_ours(publish(self.directory, taken, held=held), taken, pointer,
                                   f"checkpoint {name} not marked final")
            if not manifest.final:
                storage.write_atomically(os.path.join(path, MANIFEST_NAME),
                                         replace(manifest, final=True).to_json().encode())
            if manifest.lineage is not None:  # as a save would have: a run that ends saving nothing leaves none
                retire(self.directory, remove_leftovers(self.directory, self.run_id, manifest.lineage, epoch, held=held))

    def _save(self, client: ParameterClient, optimizer: Mapping[str, Any] | None, model: Mapping[str, Any] | None,
              epoch: int | None, holder: str, final: bool = False, initial: bool = False) -> SavedCheckpoint:
        # First: a save failing at the lock names its step too; none where ps task 0 is not ready (restarted: its
        # global_step is the initial one, not the run's), but in the initial save, which is at the initial step.
        stats = client.ps_stats()
        step_hint = stats.global_step if stats.global_step is not None else client.global_step()  # (raises there)
        self._step, self._step_unready = (step_hint, False) if stats.ready or initial else (None, True)
        if self._lock is not None:  # (not again once released at exit: the gate, asked under the mutex)
            self._lock.acquire(may_pass=epoch is not None,
                               check=functools.partial(self.publishing.check, self.directory, "save not begun"))
        storage.makedirs(self.directory)
        lineage = self._lineage(client)
        writer = {"run_id": self.run_id, "lineage": lineage, "epoch": epoch, "holder": holder,
                  "writer": client.client_name, **writer_identity()}  # (host, pid: whether it is gone)
        with directory_mutex(self.directory, may_pass=epoch is not None) as held:
            # Without the mutex (passed by a newer epoch) only leftovers whose writer is gone or left behind go,
            # and the directory gets a name no one else takes (see _create).
            removed = remove_leftovers(self.directory, self.run_id, lineage, epoch, held=held)
            retire(self.directory, removed)
            # Never a name just removed: that "leftover" may be an older chief's save still going on (its lease
            # lived on in its own view), which would write its files into this save's directory, then remove it.
            # Renamed after the manifest's step once the shards are in.
            name = free_name(self.directory, step_hint, removed) if held else f"{checkpoint_name(step_hint)}-{time.time_ns()}"
            path = self._current = self._create(os.path.join(self.directory, name), writer, held=held)
        self._phase("writer_written")
        base = self._increment_base(client, lineage, epoch)
        replies = self._write_shards(client, path, base[1] if base is not None else None)
        self._phase("shards_written")
        manifest = build_manifest(client, replies, optimizer, model, lineage, writer, final, initial=initial)
        if base is not None:
            manifest = replace(manifest, kind=INCREMENT, base=os.path.basename(base[0]))
        storage.write_atomically(os.path.join(path, MANIFEST_NAME), manifest.to_json().encode())
        path = self._current = rename_after_step(self.directory, path, manifest.global_step, removed,
                                                 may_pass=epoch is not None)
        name = os.path.basename(path)
        self._phase("manifest_written")
        check_fence(client, self._fence, path)
        if epoch is not None:
            self._phase("fence_checked")
        # (under the mutex, just before the pointer's write: this process exiting with the save given up, or a
        # restore since the shards were taken, refuses it)
        before_publish = self.publishing.guard(path, functools.partial(check_no_restore_since, client, replies, path))
        kept, previous = self._switch_pointer(name, manifest.global_step, lineage, epoch, holder, before_publish)
        if epoch is not None:
            self._phase("pointer_switched")
            try:
                check_fence(client, self._fence, path, current=True)
            except CheckpointFencedError:
                self._undo_pointer(name, previous)
                raise
            except CheckpointError as e:  # a ps task unreachable: the checkpoint is complete and current
                log.warning("%s: %s", client.client_name, e)
        self._current = None
        self._increments = self._increments + 1 if base is not None else 0
        self._base = (path, manifest)  # complete: the next increment's base
        delete_old(self.directory, self.run_id, kept, lineage, epoch)
        log.info("%s: saved checkpoint %s at step %d", client.client_name, path, manifest.global_step)
        return SavedCheckpoint(path, manifest.global_step)

    def _create(self, path: str, writer: dict[str, Any], *, held: bool) -> str:
        """Creates the save's directory ``path`` with its writer file; returns ``path``.

        Under the mutex: made, then the writer file written (a directory without one, seen under the mutex, is a
        leftover of a save killed in between: see rotation.deletable). Without it (``held`` False), it is built
        under a hidden name and renamed to ``path`` once its writer file is in, so a stopped holder, resumed,
        never sees it without one; one killed meanwhile leaves ``.creating-*``, removed once its writer is
        certainly gone (:mod:`psflow.checkpoint.leftovers`); one taken away before its rename (by a newer epoch's
        save: this chief is deposed) raises CheckpointFencedError. An object store has no directories: the writer
        file makes it.
        """
        body = jsonio.dumps(writer, nonfinite="error", what=WRITER_NAME, indent=1).encode()
        if storage.is_remote(path):
            storage.write_atomically(os.path.join(path, WRITER_NAME), body)
            return path
        building = path if held else os.path.join(self.directory, f"{CREATING_PREFIX}{os.getpid()}-{time.time_ns()}")
        os.makedirs(building)
        try:
            storage.write_atomically(os.path.join(building, WRITER_NAME), body)
            if building != path:
                storage.rename_dir(building, path)
        except OSError as e:  # (a full disk) removed: made here, no shard asked for yet, nothing writes there late
            taken = building != path and not os.path.lexists(building)  # by a newer epoch's save (leftovers.py)
            storage.remove_tree(building, ignore_errors=True)
            if taken:
                raise CheckpointFencedError(f"checkpoint {path} not made: its directory {building} was taken by a "
                                            f"save of a newer epoch than this chief's ({writer.get('epoch')})") from e
            raise
        return path

    def _increment_base(self, client: ParameterClient, lineage: str, epoch: int | None) -> tuple[str, Manifest] | None:
        """The base of this save if it is an increment (see the module doc), else None (a full save)."""
        base = self._base
        if base is None or self._increments + 1 >= self.full_every:
            return None
        path, manifest = base
        files = {file for _, file in shard_files(client).values()}
        if (manifest.lineage != lineage or {s["file"] for s in manifest.shards} != files or not is_complete(path)
                or os.path.dirname(path) != self.directory or (manifest.run or {}).get("epoch") != epoch):
            return None
        return base

    def _lineage(self, client: ParameterClient) -> str:
        """The cluster's lineage from the ledger; a fresh cluster's becomes this run's id."""
        lineage = CheckpointStatusReply.from_frame(
            client.call(client.step_task, CheckpointStatusRequest(lineage_if_unset=self.run_id))).lineage
        return lineage or self.run_id

    def _named(self) -> str:
        """The save under way as its lines name it: by its global_step, where ps task 0 had the run's."""
        if self._step_unready:
            return "checkpoint (ps task 0 not ready: no global_step of the run)"
        return "checkpoint" if self._step is None else f"checkpoint of global_step {self._step}"

    def count_failure(self, client: ParameterClient, error: BaseException) -> None:
        self.saves_failed += 1
        self.failed_in_a_row += 1
        self.last_error = f"{type(error).__name__}: {error}"
        limit = self.max_failed_saves
        log.error("%s: %s into %s FAILED (%d in a row, %d in all%s): %s",
                  client.client_name, self._named(), self.directory, self.failed_in_a_row, self.saves_failed,
                  f"; the run stops after {limit} in a row" if limit else "", self.last_error)
        self._report(client, SaveOutcome(False, self._step, error=self.last_error, writer=client.client_name))
        if limit and self.failed_in_a_row >= limit:
            raise CheckpointSavesFailedError(
                f"{client.client_name}: {self.failed_in_a_row} checkpoint saves in a row into {self.directory} failed "
                f"(--max-failed-saves {limit}): stopping rather than training without checkpoints; "
                f"last: {self.last_error}") from error

    def _report(self, client: ParameterClient, outcome: SaveOutcome) -> None:
        """Counts a save in the cluster's ledger, after the reports not delivered before (in order; the newest
        32 kept): one sent while the task holding the ledger was down (logged) is sent with the next. Each
        report has its own id, so one resent (after a failover, or counted but not answered) is counted once."""
        with self._sending:
            self._reports += 1
            self._unsent = [*self._unsent[-31:], replace(outcome, report_id=f"{client.client_name}/{self._process}/"
                                                                            f"{self._reports}")]
            self._send(client)

    def send_unsent(self, client: ParameterClient) -> None:
        """Sends the reports the ledger did not take (its task was down), if any: a chief whose duties moved to
        another worker meanwhile saves no more, so its next save would never send them (the ledger then counted one
        checkpoint fewer than were saved). Called by :class:`psflow.train.unsent_reports.SendUnsentReports` on every
        worker that may hold the duties; never raises (a report not taken stays for the next try)."""
        if self._unsent and self._sending.acquire(blocking=False):  # (a save reporting now sends them itself)
            try:
                self._send(client)
            finally:
                self._sending.release()

    def _send(self, client: ParameterClient) -> None:
        while self._unsent:
            try:
                client.call(client.step_task, CheckpointStatusRequest(outcome=self._unsent[0]), timeout=5.0)
            except RpcError as e:
                log.warning("%s: could not report the checkpoint outcome to the ledger (sent again with the next "
                            "one): %s", client.client_name, e)
                return
            del self._unsent[0]

    def _remove_current(self) -> None:
        """Deletes the directory of the save that failed, unless the pointer names it; no later save of this process
        takes its name (:func:`~psflow.checkpoint.naming.remove_retired`: a ps task may still write its shard there).

        Under the directory's mutex, so a newer chief's restore that takes this checkpoint over
        (:func:`psflow.checkpoint.adopt.adopt_latest`, the same mutex) either finds it gone or keeps it: a
        checkpoint a restore used is never deleted here. Never raises (called while a save fails): a mutex
        not had in time leaves the directory to a later save's cleanup or rotation (logged).
        """
        path, self._current = self._current, None
        try:  # the store's own look too: one that stopped answering failed the save, and raised here as well
            if path is None or not storage.exists(path):
                return
            with directory_mutex(self.directory):
                pointer = effective_pointer(self.directory)[0] or {}
                if pointer.get("latest") == os.path.basename(path):
                    return
                remove_retired(self.directory, path)
            if storage.exists(path):
                log.error("could not remove the partial checkpoint %s", path)
        except (CheckpointError, OSError) as e:
            log.error("could not remove the checkpoint %s of a failed save: %s", path, e)

    def _phase(self, phase: str) -> None:
        if self._fault is not None:
            self._fault(phase)

    def _write_shards(self, client: ParameterClient, path: str, base: Manifest | None = None) -> dict[int, tuple[str, SaveShardReply]]:
        """Every ps task's shard but an idle one's (it holds nothing, and may be down: :func:`shard_files`): task ->
        (its file name, what it holds); ``base``: an increment's base (each task saves the rows changed since its shard
        of it). SaveShard's deadline: ``save_timeout``; each shard in a daemon thread (rpc: its write stuck in the store
        never holds the process's exit, :mod:`psflow.checkpoint.daemon_calls`)."""
        files, timeout, total = shard_files(client), client.config.save_timeout, len(client.channels)
        epoch, holder = self._fence if self._fence is not None else (None, "")
        marks = {s["file"]: s.get("marks") for s in base.shards} if base is not None else {}
        calls = {}
        for t, (n, file) in files.items():
            target = os.path.join(storage.absolute(path), file) if self.transport == "local" else None
            since = marks.get(file)
            calls[t] = client.call_async(t, SaveShardRequest(target, n, total, epoch, holder,
                                                             since if isinstance(since, dict) else None), timeout=timeout)
        pending = in_daemon_threads({t: functools.partial(self._finish_shard, c, os.path.join(path, files[t][1]), timeout)
                                     for t, c in calls.items()}, name="psflow-shard-write")
        futures.wait(pending.values())  # every shard's write ended, a failed one's too, before the save goes on
        replies = {t: (files[t][1], fut.result()) for t, fut in pending.items()}
        storage.sync_dir(path)  # (an object store: nothing to do)
        return replies

    def _finish_shard(self, call: Any, file: str, timeout: float) -> SaveShardReply:
        try:
            reply = SaveShardReply.from_frame(call.result())
        except RpcError as e:
            # only the fence's own refusal (ABORTED): a restore in progress on the task refuses too (FAILED_PRECONDITION),
            # and that save failed (counted, retried at the next one), no newer chief took it over
            fenced = self._fence is not None and isinstance(e, FencedOffError)
            late = f" (no reply within --save-timeout, {timeout:g} s)" if isinstance(e, DeadlineExceededError) else ""
            raise (CheckpointFencedError if fenced else CheckpointError)(f"saving shard {file} failed: {e}{late}") from e
        if reply.data is not None:
            data = reply.data.data  # the bytes, unchanged (a view)
            if hashlib.sha256(data).hexdigest() != reply.sha256:
                raise CheckpointError(f"shard {file} from {reply.task} arrived corrupted (sha256 mismatch)")
            storage.write_atomically(file, data)
        return reply

    def _switch_pointer(self, name: str, step: int, lineage: str, epoch: int | None, holder: str,
                        before_publish: Callable[[], None]) -> tuple[list[str], dict[str, Any] | None]:
        """See :func:`~psflow.checkpoint.switch.switch_pointer`; returns (kept, the previous pointer)."""
        return switch_pointer(self.directory, {"latest": name, "global_step": step, "lineage": lineage,
                                               "run_id": self.run_id, "epoch": epoch, "holder": holder},
                              max_to_keep=self.max_to_keep, before_publish=before_publish)

    def _undo_pointer(self, name: str, previous: dict[str, Any] | None) -> None:
        """See :func:`~psflow.checkpoint.switch.undo_pointer`."""
        epoch, holder = self._fence if self._fence is not None else (None, "")
        undo_pointer(self.directory, name, previous, run_id=self.run_id, epoch=epoch, holder=holder)
