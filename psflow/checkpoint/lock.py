"""One run per directory: the run lock of a checkpoint directory and of a run directory, and the identity of a run.

A *run* is one training job: every task of it, every restarted task and
every worker that is elected chief shares its ``run_id``
(:attr:`TrainConfig.run_id <psflow.train.config.TrainConfig.run_id>`, set by
the launcher; without one, :func:`cluster_run_id` derives it from the
cluster and the directory, the same in every task). The lock belongs to the
run, not to a process: a restarted chief of the same run writes on.

One mechanism, :class:`DirectoryLock`, locks two kinds of directory:

    * :class:`CheckpointDirLock`: ``<checkpoint_dir>/checkpoint.lock``, taken by
      the launcher before it starts any task, by the chief and every worker that
      may become chief before they join, and by the manager before every save
      (two runs in one checkpoint directory would restore and delete each
      other's checkpoints);
    * :class:`RunDirLock`: ``<output>/run.lock``, taken by ``psflow train``
      (and :func:`~psflow.launch.local.run_local`,
      :func:`~psflow.launch.in_process.run_in_process`) before it writes
      anything into its run directory (two runs in one would overwrite each
      other's ``cluster.json``, configuration, logs and metrics). Only the
      launcher's process takes it.

The lock file (JSON) names the run holding the directory and a process of it
that vouches for it being alive::

    {"run_id": "20261124-231702-5f3a9c1e", "host": "node-3", "pid": 4711, "pid_start": 8812345,
     "boot_id": "...", "pid_ns": "pid:[4026531836]", "since": 1795000000.0, "since_text": "...", "run_dir": "runs/r1"}

A pid is judged only on its host, boot and pid namespace (``pid_ns``): containers sharing a kernel (a boot
id) and, with host networking, a host name number their own processes; another namespace's lock is another
host's (:func:`~psflow.checkpoint.holder.holder_alive`, in :mod:`psflow.checkpoint.holder`). A lock without
``pid_ns`` (an older psflow's) is judged by host and boot.

:meth:`DirectoryLock.acquire`, under the directory's mutex:

    * no lock: this run takes it (this process vouches);
    * this run's lock: kept; if the vouching process is gone (a restarted
      chief), this process takes its place;
    * another run's lock whose process is gone on this host (no such pid, a
      zombie, another process under a reused pid, or another boot): a stale
      lock of a dead run; taken over, with a warning naming that run;
    * another run's lock whose process lives, or that names another host
      (whose processes psflow cannot see): refused, naming the holder (run id,
      pid, host, since when; :class:`CheckpointLockedError` or
      :class:`RunDirLockedError`); nothing is written.

Leaving ``with lock:`` releases the lock only if that ``with`` took it: a
launcher inside a ``psflow train`` that already holds its run directory
leaves the release to the command.

Guarantees: two live runs never both hold one directory (the decision and the
write happen under an exclusive ``flock`` of the directory, held for a few
file operations; on filesystems without ``flock`` the check is best effort);
the lock file is replaced atomically, so a reader never sees half of one.
A checkpoint directory in an object store (``s3://``, ``gs://``; see
:mod:`psflow.storage`) has no ``flock``: its ``checkpoint.lock`` is an object,
and the decision is made under the lock object ``directory.mutex``, created
with a conditional put (S3 ``If-None-Match``, GCS ``ifGenerationMatch``) and
deleted after; the same guarantee holds where the store honours the
condition, and is best effort where it does not (the GCS emulator ignores
it). Non-guarantees: a holder on another host is never declared stale (delete the
lock file by hand once that run is over); a process that is alive but stuck
keeps its run's lock. A process stopped (SIGSTOP, a frozen host) inside the
directory's mutex keeps it while stopped: a writer without a lease epoch waits
:data:`MUTEX_TIMEOUT` s, then fails. Guaranteed: a chief with a lease epoch
(a save, marking a checkpoint final, a restore's take-over) goes on past it
after that wait (one WARNING; ``may_pass``), so a newer chief's final save is
written and made current. It is safe because such a chief writes the pointer
through its own epoch's file ``checkpoint.e<epoch>`` (one writer per file;
:mod:`psflow.checkpoint.pointer`), which readers follow over the shared
``checkpoint``: the stopped holder, resumed, cannot replace it. Past the mutex
it writes no lock file and deletes only what is safe without it: its own run's
older-epoch checkpoints no pointer file names (:mod:`psflow.checkpoint.rotation`)
and leftovers of crashed saves whose writer is certainly gone, or is another run or an older epoch of this
one that the run is past (:mod:`psflow.checkpoint.leftovers`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, ClassVar, Self

from psflow import jsonio, storage
from psflow.checkpoint.holder import boot_id, describe_holder, holder_alive, is_this_process, pid_namespace, pid_start
from psflow.errors import CheckpointError, PsflowError

__all__ = [
    "CheckpointError",
    "CheckpointLockedError",
    "CheckpointDirLock",
    "DirectoryLock",
    "DirectoryLockError",
    "RunDirLock",
    "RunDirLockedError",
    "LOCK_NAME",
    "RUN_LOCK_NAME",
    "new_run_id",
    "cluster_run_id",
    "directory_mutex",
    "holder_alive",
    "describe_holder",
]

log = logging.getLogger("psflow.checkpoint")

LOCK_NAME = "checkpoint.lock"
RUN_LOCK_NAME = "run.lock"

#: Seconds to wait for another process's short critical section on the directory
#: (a few small file operations); past it, a process stopped inside one is reported.
MUTEX_TIMEOUT = 30.0


class CheckpointLockedError(CheckpointError):
    """Another live run holds the checkpoint directory (names it: run id, host, pid, since when)."""


class DirectoryLockError(PsflowError):
    """A run directory cannot be locked: another run holds it, or its lock file cannot be read or written."""


class RunDirLockedError(DirectoryLockError):
    """Another live run holds the run directory (``--output``; names it: run id, host, pid, since when)."""


def new_run_id() -> str:
    """A fresh run id: start time and 32 random bits, e.g. ``20261124-231702-5f3a9c1e``."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def cluster_run_id(cluster_json: str, directory: str) -> str:
    """The run id every task of a cluster derives alike when no launcher named one.

    Two live clusters never share an address, so two live runs never share this id.
    """
    digest = hashlib.sha256(f"{cluster_json}\n{storage.absolute(directory)}".encode()).hexdigest()
    return f"cluster-{digest[:16]}"


@contextlib.contextmanager
def directory_mutex(directory: str, *, timeout: float | None = None, what: str = "checkpoint directory",
                    error: type[Exception] = CheckpointError, may_pass: bool = False) -> Iterator[bool]:
    """Holds an exclusive ``flock`` on ``directory`` for the block (between processes and threads); yields
    whether it is held.

    Blocks at most ``timeout`` s (default :data:`MUTEX_TIMEOUT`, read at the call) for another holder
    (polling). Filesystems without ``flock`` (some network filesystems) are used without it (logged once).
    In an object store (``s3://``, ``gs://``) it is the lock object
    ``directory.mutex`` instead (see :func:`_object_mutex`).

    Args:
        what: what the directory is, in messages.
        error: raised when the wait times out.
        may_pass: for a chief holding a lease epoch (its pointer writes are per-epoch files, see
            :mod:`psflow.checkpoint.pointer`): past the wait, the block runs without the mutex and gets False
            (one WARNING); later such waits on this directory in this process last at most 1 s, until the
            mutex is had again. The caller then writes nothing another writer may be writing and deletes only
            what is safe without the mutex (:mod:`psflow.checkpoint.rotation`).

    Raises:
        error: another process held it for ``timeout`` s (a process stopped inside it), unless ``may_pass``.
    """
    timeout = MUTEX_TIMEOUT if timeout is None else timeout
    if may_pass and directory in _PASSED:
        timeout = min(timeout, 1.0)
    if storage.is_remote(directory):
        with _object_mutex(directory, timeout=timeout, what=what, error=error, may_pass=may_pass) as held:
            yield held
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        deadline, wait, held = time.monotonic() + timeout, 0.001, True
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                _PASSED.discard(directory)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    if may_pass:
                        held = _passed(directory, what, timeout)
                        break
                    raise error(f"{what} {directory}: another process held its lock for {timeout:.0f} s "
                                "(stopped inside a save or a claim?)") from None
                time.sleep(wait)
                wait = min(wait * 2, 0.05)
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                _warn_no_flock(directory, what, e)
                break
        yield held
    finally:
        os.close(fd)  # releases the flock


#: Directories whose mutex this process went past (see :func:`directory_mutex`'s ``may_pass``).
_PASSED: set[str] = set()


def _passed(directory: str, what: str, timeout: float) -> bool:
    """Notes (one WARNING per run of passes) that this process goes on past ``directory``'s mutex; returns False."""
    if directory not in _PASSED:
        _PASSED.add(directory)
        log.warning("%s %s: another process held its lock for %.0f s (stopped inside a save?); going on past it: "
                    "this process writes only its own epoch's pointer file and deletes only its own run's older "
                    "checkpoints that no pointer names, and leftovers of crashed saves whose writer is gone, or is "
                    "another run or an older epoch of this one that the run is past", what, directory, timeout)
    return False


#: The lock object of a directory in an object store (see :func:`_object_mutex`).
MUTEX_NAME = "directory.mutex"


@contextlib.contextmanager
def _object_mutex(directory: str, *, timeout: float, what: str, error: type[Exception],
                  may_pass: bool = False) -> Iterator[bool]:
    """:func:`directory_mutex` in an object store, which has no ``flock``: the lock object ``directory.mutex``.

    Taken by creating it with a conditional put (:func:`psflow.storage.create_exclusive`: S3
    ``If-None-Match: *``, GCS ``ifGenerationMatch=0``), so two processes never both create it; let go by
    deleting it (only if it is still this holder's). A holder that died inside the block leaves it behind:
    it is taken over at once when its process is seen gone (on this host), and when it is older than
    :data:`MUTEX_TIMEOUT` s if its holder is on another host (whose processes psflow cannot see; the age
    is read from the holder's own clock, so clocks must agree within a few seconds). A live holder on this
    host is waited for, as with ``flock``. Non-guarantees: a store that ignores the condition (the GCS
    emulator) makes the mutex a check-then-write, and two processes taking over one stale lock object at
    the same moment may both hold it: both are best effort, like ``flock`` on a network filesystem.
    """
    path = os.path.join(directory, MUTEX_NAME)
    pid = os.getpid()
    token = secrets.token_hex(8)
    body = json.dumps({"token": token, "host": socket.gethostname(), "pid": pid, "pid_start": pid_start(pid),
                       "boot_id": boot_id(), "pid_ns": pid_namespace(), "since": time.time()}).encode()
    deadline, wait = time.monotonic() + timeout, 0.005
    while not storage.create_exclusive(path, body):
        holder = _mutex_holder(path)
        if holder is None:
            continue  # let go meanwhile: try again at once
        alive = holder_alive(holder)
        if alive is False or (alive is None and not time.time() - _since(holder) < MUTEX_TIMEOUT):
            log.warning("%s %s: taking over the lock object %s of %s, which is gone or held it for over %.0f s",
                        what, directory, path, f"pid {holder.get('pid')} on {holder.get('host')}", MUTEX_TIMEOUT)
            with contextlib.suppress(OSError):
                storage.remove(path)
            continue
        if time.monotonic() > deadline:
            if may_pass:
                yield _passed(directory, what, timeout)
                return
            raise error(f"{what} {directory}: another process held its lock object {path} for {timeout:.0f} s "
                        "(stopped inside a save or a claim?)")
        time.sleep(wait)
        wait = min(wait * 2, 0.1)
    _PASSED.discard(directory)
    try:
        yield True
    finally:
        try:
            holder = _mutex_holder(path)
            if holder is not None and holder.get("token") == token:
                storage.remove(path)
        except OSError as e:
            log.warning("%s %s: could not delete the lock object %s: %s", what, directory, path, e)


def _mutex_holder(path: str) -> dict[str, Any] | None:
    """The lock object's content; None when it is gone; {} when it cannot be parsed (taken over)."""
    try:
        data = json.loads(storage.read_bytes(path))
    except FileNotFoundError:
        return None
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _since(holder: dict[str, Any]) -> float:
    since = holder.get("since")
    return float(since) if isinstance(since, (int, float)) else 0.0


_NO_FLOCK: set[str] = set()


def _warn_no_flock(directory: str, what: str, error: OSError) -> None:
    if directory not in _NO_FLOCK:
        _NO_FLOCK.add(directory)
        log.warning("%s %s: no flock on this filesystem (%s); the run lock is best effort", what, directory, error)


class DirectoryLock:
    """The lock of one directory, as held by one run; see the module docstring.

    A base: :class:`CheckpointDirLock` and :class:`RunDirLock` say which
    directory, which lock file, the flag that names it and the errors raised.
    Thread-safe and idempotent (:meth:`acquire` may be called before every
    write). A context manager: ``with lock:`` acquires, and on exit releases
    the lock if that acquisition took it (see :meth:`acquire`).
    """

    #: The lock file's name inside the directory.
    lock_name: ClassVar[str]
    #: What the directory is, in messages ("checkpoint directory").
    what: ClassVar[str]
    #: The flag that names the directory, for the refusal's advice ("--checkpoint-dir").
    flag: ClassVar[str]
    #: Why two runs may not share it, for the refusal.
    why: ClassVar[str]
    #: Raised for a lock file that cannot be read or written.
    error: ClassVar[type[Exception]]
    #: Raised when another run holds the directory (a subclass of :attr:`error`).
    locked_error: ClassVar[type[Exception]]

    def __init__(self, directory: str, run_id: str, *, run_dir: str | None = None) -> None:
        """Args:
            directory: the directory (created by :meth:`acquire` if missing).
            run_id: this run's id (shared by every process of the run).
            run_dir: this run's run directory, named to a refused run (optional).
        """
        if not run_id:
            raise self.error(f"{self.what} {directory}: a run id is needed to lock it")
        self.directory = directory
        self.run_id = run_id
        self.run_dir = run_dir
        self.path = os.path.join(directory, self.lock_name)
        self._took = False

    @property
    def took(self) -> bool:
        """Whether this object's :meth:`acquire` wrote the lock file (for this process), not released since; False
        where the lock it found was this process's already (another ``DirectoryLock`` of the run took it: a
        launcher running the run's worker in its own process), which is that one's to release."""
        return self._took

    def holder(self) -> dict[str, Any] | None:
        """The lock's content, or None when there is no lock.

        Raises:
            locked_error: the lock file is unreadable (names it).
        """
        try:
            data = json.loads(storage.read_bytes(self.path))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise self.locked_error(f"{self.what} {self.directory}: unreadable lock file {self.path} "
                                    f"({e}); if no run uses this directory, delete it") from e
        if not isinstance(data, dict) or not isinstance(data.get("run_id"), str):
            raise self.locked_error(f"{self.what} {self.directory}: {self.path} is not a psflow lock "
                                    f"file; if no run uses this directory, delete it")
        return data

    def _mine(self) -> dict[str, Any]:
        pid = os.getpid()
        now = time.time()
        return {"run_id": self.run_id, "host": socket.gethostname(), "pid": pid, "pid_start": pid_start(pid),
                "boot_id": boot_id(), "pid_ns": pid_namespace(), "since": now,
                "since_text": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)),
                "run_dir": os.path.abspath(self.run_dir) if self.run_dir else None}

    def _write(self) -> None:
        try:
            storage.write_atomically(self.path, jsonio.dumps(self._mine(), nonfinite="error", what=self.path, indent=1).encode())
        except OSError as e:
            raise self.error(f"cannot write the lock file {self.path}: {e}") from e
        self._took = True

    def acquire(self, *, may_pass: bool = False, check: Callable[[], object] | None = None) -> None:
        """Makes sure this run holds the directory; see the module docstring for the cases.

        ``may_pass``: a chief with a lease epoch, which goes on past a mutex held too long
        (:func:`directory_mutex`); it then only reads: another live run's lock is refused, anything else is left
        as it is. ``check``: asked under the mutex before anything is read or written; what it raises refuses
        (a save's :class:`~psflow.checkpoint.publish_checks.PublishGate`, closed before a release at exit).

        Blocks for a few file operations (at most :data:`MUTEX_TIMEOUT` s behind another process).
        This lock *took* the directory if one of its acquisitions wrote the lock file for this
        process; one this process held already (another ``DirectoryLock`` of the same run in this
        process took it) is kept as it is.

        Raises:
            locked_error: another live run (or one on another host) holds it (names it).
            error: the directory or the lock file cannot be written.
            Whatever ``check`` raised.
        """
        try:
            storage.makedirs(self.directory)
        except OSError as e:
            raise self.error(f"cannot create {self.what} {self.directory}: {e}") from e
        with directory_mutex(self.directory, what=self.what, error=self.error, may_pass=may_pass) as held:
            if check is not None:
                check()
            holder = self.holder()
            if not held and (holder is None or holder["run_id"] == self.run_id or holder_alive(holder) is False):
                return  # nothing written without the mutex
            if holder is None:
                self._write()
                log.info("run %s: holds %s %s (pid %d)", self.run_id, self.what, self.directory, os.getpid())
                return
            if is_this_process(holder, self.run_id):
                return
            alive = holder_alive(holder)
            if holder["run_id"] == self.run_id:
                if alive is False:
                    self._write()
                    log.info("run %s: the process that held %s %s for this run (pid %s) is gone; "
                             "pid %d holds it now", self.run_id, self.what, self.directory, holder.get("pid"), os.getpid())
                return
            if alive is False:
                log.warning("%s %s: taking over the stale lock of %s, whose process is gone",
                            self.what, self.directory, describe_holder(holder))
                self._write()
                return
            where = ("psflow cannot tell from this host whether it still runs; if it is over, delete "
                     f"{self.path}" if alive is None else f"wait for it to end, or give this run another {self.flag}")
            raise self.locked_error(
                f"{self.what} {self.directory} is in use by {describe_holder(holder)}: this run "
                f"({self.run_id}) may not write there ({self.why}); {where}")

    def release(self) -> bool:
        """Removes the lock if this process holds it for this run; idempotent, never raises.

        Returns:
            Whether a lock was removed.
        """
        self._took = False
        try:
            # Goes past a mutex held too long: only this process's own lock file is removed.
            with directory_mutex(self.directory, what=self.what, error=self.error, may_pass=True):
                holder = self.holder()
                if holder is None or not is_this_process(holder, self.run_id):
                    return False
                storage.remove(self.path)
        except (OSError, CheckpointError, DirectoryLockError) as e:
            log.warning("run %s: could not release the lock of %s %s: %s", self.run_id, self.what,
                        self.directory, e)
            return False
        log.info("run %s: released %s %s", self.run_id, self.what, self.directory)
        return True

    def __enter__(self) -> Self:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._took:
            self.release()


class CheckpointDirLock(DirectoryLock):
    """The run lock of a checkpoint directory (``checkpoint.lock``); see the module docstring."""

    lock_name = LOCK_NAME
    what = "checkpoint directory"
    flag = "--checkpoint-dir"
    why = "two runs in one directory restore and delete each other's checkpoints"
    error = CheckpointError
    locked_error = CheckpointLockedError


class RunDirLock(DirectoryLock):
    """The run lock of a run directory (``--output``; ``run.lock``), held by the launcher's process for the
    whole run; see the module docstring."""

    lock_name = RUN_LOCK_NAME
    what = "run directory"
    flag = "--output"
    why = "two runs in one run directory overwrite each other's cluster.json, logs and metrics"
    error = DirectoryLockError
    locked_error = RunDirLockedError
