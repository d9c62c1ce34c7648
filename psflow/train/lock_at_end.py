"""The release of the run's checkpoint-directory lock at the end of a session whose chief duties took it
(:class:`ReleaseLockAtEnd`; ``psflow server`` or the Python API, without a launcher: a launcher's lock is the
launcher's to release). :func:`~psflow.train.duties.make_session` puts it after every duty (the final save takes
the lock again where it was deleted meanwhile), and it ends also after an earlier ``end()`` raised
(:attr:`~psflow.train.hook_api.SessionRunHook.ends_always`), but never before a checkpoint save given up at
``--save-timeout`` (:mod:`psflow.checkpoint.bounded_save`) ended, or the process exits: that save may still make its
checkpoint current while the process lives. Released as the process exits, the save's publishing is closed first
(:class:`~psflow.checkpoint.publish_checks.PublishGate`): its thread, a daemon, lives on until the interpreter's end,
and a save that had not switched the pointer when the lock was released never does (another run may hold the
directory by then, its model replaced by this run's late save).

The release held for such a save runs on a thread started as the session ends (:class:`_ReleaseAfterSave`), never on
one started by the exit function: Python 3.12 refuses to start a thread during interpreter shutdown ("can't create
new thread at interpreter shutdown"), and the lock stayed. The exit function only wakes that thread and waits for it.
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import TYPE_CHECKING

from psflow.checkpoint.bounded_save import given_up_save
from psflow.checkpoint.lock import CheckpointDirLock
from psflow.checkpoint.lock_release import RELEASE_TIMEOUT, BoundedRelease
from psflow.checkpoint.publish_checks import PublishGate
from psflow.checkpoint.save import CheckpointManager
from psflow.train.hook_api import SessionRunHook

if TYPE_CHECKING:
    from psflow.train.session import MonitoredTrainingSession

__all__ = ["ReleaseLockAtEnd"]

log = logging.getLogger("psflow.worker")

#: Seconds between the held release's looks at whether the process exits (while it waits for the given-up save).
EXIT_LOOK_EVERY = 0.1


class ReleaseLockAtEnd(SessionRunHook):
    """Releases the run's checkpoint-directory lock when the session ends, if ``lock`` took it
    (:attr:`~psflow.checkpoint.lock.DirectoryLock.took`; without a launcher: a launcher's lock is the launcher's to
    release, also one found naming this process, ``--in-process``'s, whose launcher ends after it), waited for at most
    :data:`~psflow.checkpoint.lock_release.RELEASE_TIMEOUT` s: past it the session ends on
    :class:`~psflow.checkpoint.lock_release.LockNotReleasedError`, one line naming the lock file and its URL
    (a store that stopped answering held ``psflow server`` for ever). Also after an earlier hook's ``end()`` raised
    (a failed final checkpoint; a take-over: the lock stayed, naming this process, and a later run was refused).
    Where a save of ``manager`` given up at ``--save-timeout`` still runs (:func:`~psflow.checkpoint.bounded_save.
    given_up_save`; it may still make its checkpoint current), the lock is released once it ended, or as the process
    exits, if first (:class:`_ReleaseAfterSave`: the save, a daemon thread, ends with the process; a process ended by a
    signal or ``os._exit`` runs no exit function and leaves the lock naming a process gone, as a crash does: see
    :mod:`psflow.checkpoint.lock`)."""

    ends_always = True

    def __init__(self, lock: CheckpointDirLock, timeout: float = RELEASE_TIMEOUT,
                 manager: CheckpointManager | None = None) -> None:
        self.lock, self.timeout, self.manager = lock, timeout, manager

    def end(self, session: MonitoredTrainingSession) -> None:
        if not self.lock.took:  # found this process's (a launcher running this worker in its own process: its end
            return  # comes after this session's, its final evaluation and metrics.json still to write)
        manager = self.manager
        running = given_up_save(manager) if manager is not None else None
        # it may still make its checkpoint current: a later run must not hold the directory
        if manager is not None and running is not None:
            log.warning("%s: a checkpoint save given up at --save-timeout still runs: the lock %s is released once it "
                        "ends", session.client.client_name, self.lock.path)
            _ReleaseAfterSave(self.lock, running, self.timeout, manager.publishing).start()
            return
        with BoundedRelease(self.lock, timeout=self.timeout, release=self.lock.release):
            pass


class _ReleaseAfterSave:
    """The release of ``lock`` held for a given-up save (``save_ended``: set once it ended), on a daemon thread started
    by :meth:`start`: it releases once the save ended, unless the process exits first: then :meth:`_at_exit` (an exit
    function, registered by :meth:`start` and unregistered once the lock is released) wakes it and waits at most
    ``timeout`` s for its release (a store that stopped answering does not hold the exit for ever). The save, a daemon
    thread, ends with the process; left, the lock named a process gone, refused to a run on another host until deleted
    by hand. The exit function starts no thread (refused during interpreter shutdown from Python 3.12 on). Before it
    wakes the release, it closes ``publishing`` (the save's manager's): the save lives on until the interpreter's end,
    and once the lock is released another run may take the directory; a save not past its publish check by then is
    refused (under the directory's mutex, which the release takes too: :mod:`psflow.checkpoint.publish_checks`)."""

    def __init__(self, lock: CheckpointDirLock, save_ended: threading.Event, timeout: float,
                 publishing: PublishGate) -> None:
        self.lock, self.save_ended, self.timeout, self.publishing = lock, save_ended, timeout, publishing
        self.exiting, self.released = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self._run, name="psflow-lock-release-after-save", daemon=True)

    def start(self) -> None:
        atexit.register(self._at_exit)
        self.thread.start()

    def _run(self) -> None:
        while not self.save_ended.wait(EXIT_LOOK_EVERY) and not self.exiting.is_set():
            pass
        try:
            self.lock.release()
        finally:
            self.released.set()
            if not self.exiting.is_set():  # (no exit function left to run for a lock released)
                atexit.unregister(self._at_exit)

    def _at_exit(self) -> None:
        if self.released.is_set():
            return
        if not self.save_ended.is_set():
            log.warning("the process exits while a checkpoint save given up at --save-timeout still runs (it ends "
                        "with the process): releasing the lock %s", self.lock.path)
        # before the release: once it is done another run may hold the directory, and the save lives on till the end
        self.publishing.close(f"the process exits, its run's lock {self.lock.path} released (another run may hold "
                              "the directory), while this save given up at --save-timeout still ran")
        self.exiting.set()
        if not self.released.wait(self.timeout):
            log.warning("could not release the lock %s as the process exits: no answer within %g s (the store "
                        "stopped answering?); a later run on this host takes it over, from another host delete it",
                        self.lock.path, self.timeout)
