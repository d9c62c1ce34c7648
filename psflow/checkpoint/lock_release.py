"""A launcher's (or a chief worker's own) release of a run's checkpoint lock, within a bounded time
(:class:`BoundedRelease`).

Releasing a lock is a few calls on its directory (:meth:`psflow.checkpoint.lock.DirectoryLock.release`); in an
object store that stopped answering, none of them ends (the store's clients retry without a deadline), so a
run that failed because its store stopped then never exited: ``psflow train`` waited for ever at its very end.
The release runs in a thread of its own here, waited for at most :data:`RELEASE_TIMEOUT` seconds; one not ended
after :data:`NOTICE_AFTER` seconds is told in one line (the lock file, the bound), so that the wait at the end of a
failed run is not a silent one; past the bound the launcher goes on with one line naming the lock file left
behind and its directory, and a run that had succeeded fails on it (exit status non-zero). A run that failed
already keeps its own error as the headline, the line printed before it. The abandoned thread is a daemon: it
never keeps the process from exiting. A chief worker that took the lock itself (``psflow server``, no launcher to
stop it) releases it at its session's end the same way (:mod:`psflow.train.duties`): past the bound, its session
ends on that line.

A checkpoint lock's release first closes the publishing of this process's saves into its directory that were given
up at ``--save-timeout`` and still run (:func:`~psflow.checkpoint.bounded_save.close_given_up`; an ``--in-process``
launcher's worker saves in the launcher's process, and its session leaves the release to the launcher): one not
past its publish check when the lock is released never makes its checkpoint current, nor takes the lock again
(the check and the release take the directory's mutex), so the next run's directory never gets this run's late
checkpoint. Guaranteed for a release of a lock this object took, on any storage; a release past a mutex held over
:data:`~psflow.checkpoint.lock.MUTEX_TIMEOUT` s (a save stopped inside it) guarantees nothing more than that mutex.

The lock left behind names a process that is gone: a later run on this host takes it over at once, one on
another host is refused until it is deleted (see :mod:`psflow.checkpoint.lock`).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TextIO

from psflow.checkpoint.bounded_save import close_given_up
from psflow.checkpoint.lock import MUTEX_TIMEOUT, CheckpointDirLock, DirectoryLock
from psflow.errors import CheckpointError

__all__ = ["NOTICE_AFTER", "RELEASE_TIMEOUT", "BoundedRelease", "LockNotReleasedError"]

#: Seconds a release may take: the wait for another holder of the directory's mutex (at most
#: :data:`~psflow.checkpoint.lock.MUTEX_TIMEOUT`), then as long again for the lock file's few calls.
RELEASE_TIMEOUT = 2 * MUTEX_TIMEOUT

#: Seconds a release may take before the wait is told (a release on a store that answers ends well within it).
NOTICE_AFTER = 3.0


class LockNotReleasedError(CheckpointError):
    """A run's lock could not be released in time (names the lock file and its directory)."""


class BoundedRelease:
    """On exit, ``lock``'s own exit (its release, if it took the directory), waited for at most ``timeout`` s; a
    release not ended after ``notice_after`` s is told in one line on ``out`` (stderr by default).

    Raises (on exit, only when no other error ends the block):
        LockNotReleasedError: the release did not end in time (the line is printed to ``out`` as well
            when another error ends the block, which stays the one raised).
    """

    def __init__(self, lock: DirectoryLock, *, timeout: float = RELEASE_TIMEOUT, out: TextIO | None = None,
                 release: Callable[[], object] | None = None, notice_after: float = NOTICE_AFTER) -> None:
        """``release``: the call to bound, in place of ``lock``'s exit (a chief worker's :meth:`DirectoryLock.release`)."""
        self.lock, self.timeout, self.out, self.release = lock, timeout, out, release
        self.notice_after = notice_after

    def __enter__(self) -> BoundedRelease:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        done = threading.Event()
        if isinstance(self.lock, CheckpointDirLock) and self.lock.took:  # (released below: no late save publishes)
            close_given_up(self.lock.directory, f"the run's lock {self.lock.path} was released (another run may hold "
                                                "the directory) while this save given up at --save-timeout still ran")

        def release() -> None:
            try:
                self.lock.__exit__(exc_type, exc, tb) if self.release is None else self.release()
            finally:
                done.set()

        threading.Thread(target=release, name="psflow-lock-release", daemon=True).start()
        if done.wait(min(self.notice_after, self.timeout)):
            return
        if self.notice_after < self.timeout:
            print(f"psflow: releasing the lock {self.lock.path}: waiting up to {self.timeout:g} s for the store...",
                  file=self.out or sys.stderr, flush=True)
            if done.wait(self.timeout - self.notice_after):
                return
        line = (f"could not release the lock {self.lock.path} of {self.lock.what} {self.lock.directory}: no answer "
                f"within {self.timeout:g} s (the store stopped answering?); a later run on this host takes it over, "
                "from another host delete it once this run is over")
        if exc is None:
            raise LockNotReleasedError(line)
        print(f"psflow: {line}", file=self.out or sys.stderr, flush=True)
