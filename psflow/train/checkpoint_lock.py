"""One writer per checkpoint directory: the run lock, and the identity of a run.

A *run* is one training job: every task of it, every restarted task and
every worker that is elected chief shares its ``run_id``
(:attr:`TrainConfig.run_id <psflow.train.config.TrainConfig.run_id>`, set by
the launcher; without one, :func:`cluster_run_id` derives it from the
cluster and the directory, the same in every task). The lock belongs to the
run, not to a process: a restarted chief of the same run writes on.

``<checkpoint_dir>/checkpoint.lock`` (JSON) names the run holding the
directory and a process of it that vouches for it being alive::

    {"run_id": "20261124-231702-5f3a9c1e", "host": "node-3", "pid": 4711, "pid_start": 8812345,
     "boot_id": "...", "since": 1795000000.0, "since_text": "2026-11-24 23:17:02", "run_dir": "runs/r1"}

:meth:`CheckpointDirLock.acquire` (the launcher before it starts any task,
the chief and every worker that may become chief before they join, and the
manager before every save), under the directory's mutex:

    * no lock: this run takes it (this process vouches);
    * this run's lock: kept; if the vouching process is gone (a restarted
      chief), this process takes its place;
    * another run's lock whose process is gone on this host (no such pid, a
      zombie, another process under a reused pid, or another boot): a stale
      lock of a dead run; taken over, with a warning naming that run;
    * another run's lock whose process lives, or that names another host
      (whose processes psflow cannot see): :class:`CheckpointLockedError`
      naming the holder; nothing is written.

Guarantees: two live runs never both hold one directory (the decision and the
write happen under an exclusive ``flock`` of the directory, held for a few
file operations; on filesystems without ``flock`` the check is best effort);
the lock file is replaced atomically, so a reader never sees half of one.
Non-guarantees: a holder on another host is never declared stale (delete the
lock file by hand once that run is over); a process that is alive but stuck
keeps its run's lock.
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
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from psflow import jsonio
from psflow.ps.checkpointing import write_file_atomically

__all__ = [
    "CheckpointError",
    "CheckpointLockedError",
    "CheckpointDirLock",
    "LOCK_NAME",
    "new_run_id",
    "cluster_run_id",
    "directory_mutex",
    "holder_alive",
    "describe_holder",
]

log = logging.getLogger("psflow.checkpoint")

LOCK_NAME = "checkpoint.lock"

#: Seconds to wait for another process's short critical section on the directory
#: (a few small file operations); past it, a process stopped inside one is reported.
MUTEX_TIMEOUT = 30.0


class CheckpointError(Exception):
    """A checkpoint cannot be written, found, read or restored (names the file or variable)."""


class CheckpointLockedError(CheckpointError):
    """Another live run holds the checkpoint directory (names it: run id, host, pid, since when)."""


def new_run_id() -> str:
    """A fresh run id: start time and 32 random bits, e.g. ``20261124-231702-5f3a9c1e``."""
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(4)}"


def cluster_run_id(cluster_json: str, directory: str) -> str:
    """The run id every task of a cluster derives alike when no launcher named one.

    Two live clusters never share an address, so two live runs never share this id.
    """
    digest = hashlib.sha256(f"{cluster_json}\n{os.path.abspath(directory)}".encode()).hexdigest()
    return f"cluster-{digest[:16]}"


@contextlib.contextmanager
def directory_mutex(directory: str, *, timeout: float = MUTEX_TIMEOUT) -> Iterator[None]:
    """Holds an exclusive ``flock`` on ``directory`` for the block (between processes and threads).

    Blocks at most ``timeout`` s for another holder (polling). Filesystems
    without ``flock`` (some network filesystems) are used without it (logged once).

    Raises:
        CheckpointError: another process held it for ``timeout`` s (a process stopped inside it).
    """
    fd = os.open(directory, os.O_RDONLY)
    try:
        deadline, wait = time.monotonic() + timeout, 0.001
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise CheckpointError(f"checkpoint directory {directory}: another process held its lock for "
                                          f"{timeout:.0f} s (stopped inside a save?)") from None
                time.sleep(wait)
                wait = min(wait * 2, 0.05)
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                _warn_no_flock(directory, e)
                break
        yield
    finally:
        os.close(fd)  # releases the flock


_NO_FLOCK: set[str] = set()


def _warn_no_flock(directory: str, error: OSError) -> None:
    if directory not in _NO_FLOCK:
        _NO_FLOCK.add(directory)
        log.warning("checkpoint directory %s: no flock on this filesystem (%s); the run lock is best effort",
                    directory, error)


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of ``pid`` from /proc, or None without /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except FileNotFoundError:
        return ("X", -1)
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def _pid_start(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return stat[1] if stat is not None and stat[1] >= 0 else None


def holder_alive(holder: dict[str, Any]) -> bool | None:
    """Whether the process a lock names is alive: True, False, or None (another host: unknown)."""
    if holder.get("host") != socket.gethostname():
        return None
    boot, here = holder.get("boot_id"), _boot_id()
    if boot is not None and here is not None and boot != here:
        return False  # written before this machine rebooted
    pid = holder.get("pid")
    if type(pid) is not int or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process: it exists
    stat = _proc_stat(pid)
    if stat is None:
        return True
    state, start = stat
    if state in ("Z", "X"):
        return False  # exited, not yet reaped
    recorded = holder.get("pid_start")
    return not (type(recorded) is int and start != recorded)  # else the pid was reused


def describe_holder(holder: dict[str, Any]) -> str:
    """``run R (pid N on HOST, since T, run directory D)``."""
    run_dir = holder.get("run_dir")
    return (f"run {holder.get('run_id')} (pid {holder.get('pid')} on {holder.get('host')}, since "
            f"{holder.get('since_text') or holder.get('since')}{f', run directory {run_dir}' if run_dir else ''})")


class CheckpointDirLock:
    """The lock of one checkpoint directory, as held by one run; see the module docstring.

    Thread-safe and idempotent (:meth:`acquire` may be called before every
    write). A context manager: ``with lock:`` acquires, and releases on exit.
    """

    def __init__(self, directory: str, run_id: str, *, run_dir: str | None = None) -> None:
        """Args:
            directory: the checkpoint directory (created by :meth:`acquire` if missing).
            run_id: this run's id (shared by every process of the run).
            run_dir: this run's run directory, named to a refused run (optional).
        """
        if not run_id:
            raise CheckpointError(f"checkpoint directory {directory}: a run id is needed to lock it")
        self.directory = directory
        self.run_id = run_id
        self.run_dir = run_dir
        self.path = os.path.join(directory, LOCK_NAME)

    def holder(self) -> dict[str, Any] | None:
        """The lock's content, or None when there is no lock.

        Raises:
            CheckpointLockedError: the lock file is unreadable (names it).
        """
        try:
            with open(self.path) as f:
                data = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise CheckpointLockedError(f"checkpoint directory {self.directory}: unreadable lock file {self.path} "
                                        f"({e}); if no run uses this directory, delete it") from e
        if not isinstance(data, dict) or not isinstance(data.get("run_id"), str):
            raise CheckpointLockedError(f"checkpoint directory {self.directory}: {self.path} is not a psflow lock "
                                        f"file; if no run uses this directory, delete it")
        return data

    def _mine(self) -> dict[str, Any]:
        pid = os.getpid()
        now = time.time()
        return {"run_id": self.run_id, "host": socket.gethostname(), "pid": pid, "pid_start": _pid_start(pid),
                "boot_id": _boot_id(), "since": now, "since_text": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)),
                "run_dir": os.path.abspath(self.run_dir) if self.run_dir else None}

    def _write(self) -> None:
        try:
            write_file_atomically(self.path, jsonio.dumps(self._mine(), nonfinite="error", what=self.path, indent=1).encode())
        except OSError as e:
            raise CheckpointError(f"cannot write the lock file {self.path}: {e}") from e

    def acquire(self) -> None:
        """Makes sure this run holds the directory; see the module docstring for the cases.

        Blocks for a few file operations (at most :data:`MUTEX_TIMEOUT` s behind another process).

        Raises:
            CheckpointLockedError: another live run (or one on another host) holds it (names it).
            CheckpointError: the directory or the lock file cannot be written.
        """
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"cannot create checkpoint directory {self.directory}: {e}") from e
        with directory_mutex(self.directory):
            holder = self.holder()
            if holder is None:
                self._write()
                log.info("run %s: holds checkpoint directory %s (pid %d)", self.run_id, self.directory, os.getpid())
                return
            if self._is_this_process(holder):
                return
            alive = holder_alive(holder)
            if holder["run_id"] == self.run_id:
                if alive is False:
                    self._write()
                    log.info("run %s: the process that held checkpoint directory %s for this run (pid %s) is gone; "
                             "pid %d holds it now", self.run_id, self.directory, holder.get("pid"), os.getpid())
                return
            if alive is False:
                log.warning("checkpoint directory %s: taking over the stale lock of %s, whose process is gone",
                            self.directory, describe_holder(holder))
                self._write()
                return
            where = ("psflow cannot tell from this host whether it still runs; if it is over, delete "
                     f"{self.path}" if alive is None else "wait for it to end, or give this run another --checkpoint-dir")
            raise CheckpointLockedError(
                f"checkpoint directory {self.directory} is in use by {describe_holder(holder)}: this run "
                f"({self.run_id}) may not write there (two runs in one directory restore and delete each other's "
                f"checkpoints); {where}")

    def _is_this_process(self, holder: dict[str, Any]) -> bool:
        return (holder.get("run_id") == self.run_id and holder.get("pid") == os.getpid()
                and holder.get("host") == socket.gethostname())

    def release(self) -> bool:
        """Removes the lock if this process holds it for this run; idempotent, never raises.

        Returns:
            Whether a lock was removed.
        """
        try:
            with directory_mutex(self.directory):
                holder = self.holder()
                if holder is None or not self._is_this_process(holder):
                    return False
                os.unlink(self.path)
        except (OSError, CheckpointError) as e:
            log.warning("run %s: could not release the lock of checkpoint directory %s: %s", self.run_id,
                        self.directory, e)
            return False
        log.info("run %s: released checkpoint directory %s", self.run_id, self.directory)
        return True

    def __enter__(self) -> CheckpointDirLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()
