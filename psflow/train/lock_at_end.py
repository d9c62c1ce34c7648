"""The release of the run's checkpoint-directory lock at the end of a session whose chief duties took it
(:class:`ReleaseLockAtEnd`; ``psflow server`` or the Python API, without a launcher: a launcher's lock is the
launcher's to release). :func:`~psflow.train.duties.make_session` puts it after every duty (the final save takes
the lock again where it was deleted meanwhile), and it ends also after an earlier ``end()`` raised
(:attr:`~psflow.train.hook_api.SessionRunHook.ends_always`), but never before a checkpoint save given up at
``--save-timeout`` (:mod:`psflow.checkpoint.bounded_save`) ended, or the process exits: that save may still make its
checkpoint current while the process lives.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import TYPE_CHECKING

from psflow.checkpoint.bounded_save import given_up_save
from psflow.checkpoint.lock import CheckpointDirLock
from psflow.checkpoint.lock_release import RELEASE_TIMEOUT, BoundedRelease
from psflow.checkpoint.save import CheckpointManager
from psflow.train.hook_api import SessionRunHook

if TYPE_CHECKING:
    from psflow.train.session import MonitoredTrainingSession

__all__ = ["ReleaseLockAtEnd"]

log = logging.getLogger("psflow.worker")


class ReleaseLockAtEnd(SessionRunHook):
    """Releases the run's checkpoint-directory lock when the session ends, if ``lock`` took it
    (:attr:`~psflow.checkpoint.lock.DirectoryLock.took`; without a launcher: a launcher's lock is the launcher's to
    release, also one found naming this process, ``--in-process``'s, whose launcher ends after it), waited for at most
    :data:`~psflow.checkpoint.lock_release.RELEASE_TIMEOUT` s: past it the session ends on
    :class:`~psflow.checkpoint.lock_release.LockNotReleasedError`, one line naming the lock file and its URL
    (a store that stopped answering held ``psflow server`` for ever). Also after an earlier hook's ``end()`` raised
    (a failed final checkpoint; a take-over: the lock stayed, naming this process, and a later run was refused).
    Where a save of ``manager`` given up at ``--save-timeout`` still runs (:func:`~psflow.checkpoint.bounded_save.
    given_up_save`; it may still make its checkpoint current), the lock is released once it ended, in a daemon thread,
    or as the process exits, if first (an exit function: the save, a daemon thread too, ends with the process; a
    process ended by a signal or ``os._exit`` runs none and leaves the lock naming a process gone, as a crash does:
    see :mod:`psflow.checkpoint.lock`)."""

    ends_always = True

    def __init__(self, lock: CheckpointDirLock, timeout: float = RELEASE_TIMEOUT,
                 manager: CheckpointManager | None = None) -> None:
        self.lock, self.timeout, self.manager = lock, timeout, manager

    def end(self, session: MonitoredTrainingSession) -> None:
        if not self.lock.took:  # found this process's (a launcher running this worker in its own process: its end
            return  # comes after this session's, its final evaluation and metrics.json still to write)
        running = given_up_save(self.manager) if self.manager is not None else None
        if running is not None:  # it may still make its checkpoint current: a later run must not hold the directory
            log.warning("%s: a checkpoint save given up at --save-timeout still runs: the lock %s is released once it "
                        "ends", session.client.client_name, self.lock.path)
            atexit.register(self._release_at_exit)  # (the daemon thread below dies with the process: not it)
            threading.Thread(target=self._release_after, args=(running,), name="psflow-lock-release-after-save",
                             daemon=True).start()
            return
        with BoundedRelease(self.lock, timeout=self.timeout, release=self.lock.release):
            pass

    def _release_after(self, running: threading.Event) -> None:
        running.wait()
        atexit.unregister(self._release_at_exit)
        self.lock.release()

    def _release_at_exit(self) -> None:
        """(An exit function) The process exits with the given-up save still running: the save, a daemon thread,
        ends with it, so the lock goes now; left, it named a process gone, refused to a run on another host until
        deleted by hand. At most ``timeout`` s (a store that stopped answering): the exit is not held for ever."""
        log.warning("the process exits while a checkpoint save given up at --save-timeout still runs (it ends with "
                    "the process): releasing the lock %s", self.lock.path)
        release = threading.Thread(target=self.lock.release, name="psflow-lock-release-at-exit", daemon=True)
        release.start()
        release.join(self.timeout)
