"""A chief's checkpoint work on the store, waited for at most ``--save-timeout`` (:class:`BoundedSaves`).

A save's calls on an object store have no deadline of their own (the store's clients retry without one), so a
store that stopped answering held the chief in its save for ever: in async mode the other workers finished and
left, and the launcher waited on the chief. Each save (and the final checkpoint's work at the end) runs here in
a thread of its own, waited for at most the client's ``save_timeout`` (``--save-timeout``); past it the save is
given up: a failed save, counted as any other (:meth:`CheckpointManager.count_failure`, so ``--max-failed-saves``
in a row end the run), and the chief trains on, or finishes.

The thread given up is a daemon (it never keeps the process from exiting) and may still end later, once the
store answers: its checkpoint is then complete and current (a late failure is not counted twice; it is logged).
No newer save begins before it ended: the next one first waits for it, for at most ``--save-timeout`` (in sync and
ssp mode telling the ps tasks, :func:`~psflow.checkpoint.save_notice.notify_save`, as a save does), and is a failed
save itself if it has not ended. So the abandoned save never writes the pointer after a newer save did, nor uses the
manager's state (its directory, its fence) while another save does. Nor after a restore within the run (or a ps
task's restart) since its shards were taken: the chief goes on while it runs, and may restore the cluster from an
older checkpoint meanwhile; the save then fails instead of making the discarded model current, which a later
restore would load (:func:`~psflow.checkpoint.publish_checks.check_no_restore_since`, asked by every save under the
directory's mutex just before its pointer switch; its directory removed, logged, not counted again). Nor is the
run's lock released before it ended (:func:`given_up_save`, asked by a chief worker's release at its session's end,
:mod:`psflow.train.duties`): a later run could otherwise take the directory while it may still switch the pointer.

The save's calls go on a client of its own (:func:`save_client`: its own connections, and with replicated ps
shards its own router), never on the training thread's: a given-up save still in a call (a ps task's shard
write stuck on its disk) would otherwise hold the tcp carrier's connection, which serves one call at a time,
and the chief's next push to that task failed after ``--rpc-timeout`` ("the connection stayed busy"); with
replicated shards that silence could even promote a backup over a live primary.

The caller waits with :func:`psflow.waits.wait_woken`, woken every :data:`~psflow.waits.WAKE_EVERY` s: Python
runs a signal's handler on the main thread, and a signal the kernel handed to another thread (the save's own, say)
trips it only when the main thread next wakes. A save waited for in one piece left a second Ctrl-C of
``psflow train --in-process`` (which cuts a save that hangs) without effect until the save ended or
``--save-timeout`` passed.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TypeVar

from psflow import storage
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.save_notice import notify_save
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient
from psflow.rpc.inprocess import InProcessChannel
from psflow.waits import wait_woken

__all__ = ["BoundedSaves", "SaveAbandonedError", "close_given_up", "given_up_save", "save_client"]

T = TypeVar("T")

#: manager -> the end of its last call given up (set once that call ended)
_GIVEN_UP: weakref.WeakKeyDictionary[CheckpointManager, threading.Event] = weakref.WeakKeyDictionary()


def given_up_save(manager: CheckpointManager) -> threading.Event | None:
    """The end (set once it ends) of a call with ``manager`` that a :class:`BoundedSaves` gave up and that has not
    ended yet: it may still write into the directory and make its checkpoint current; None where there is none."""
    done = _GIVEN_UP.get(manager)
    return done if done is not None and not done.is_set() else None


def close_given_up(directory: str, why: str) -> int:
    """Closes the publishing (:class:`~psflow.checkpoint.publish_checks.PublishGate`) of every manager of this
    process into ``directory`` whose given-up call still runs, before the run's lock of ``directory`` is released
    (:class:`~psflow.checkpoint.lock_release.BoundedRelease`: a launcher running its worker in its own process,
    ``--in-process``, whose session left the release to it): such a save not past its gate when the lock is
    released never makes its checkpoint current nor takes the lock again (``why``: said in its refusal). Blocks
    for nothing. Returns how many were closed."""
    where = storage.absolute(directory)
    running = [m for m, done in list(_GIVEN_UP.items())
               if not done.is_set() and storage.absolute(m.directory) == where]
    for manager in running:
        manager.publishing.close(why)
    return len(running)


class SaveAbandonedError(CheckpointError):
    """A checkpoint save did not end within ``--save-timeout`` and was given up (names the save and the flag)."""


class BoundedSaves:
    """Runs a chief's checkpoint work with ``manager`` one call at a time, each waited for at most ``--save-timeout``."""

    def __init__(self, manager: CheckpointManager) -> None:
        self.manager = manager
        self._stuck: tuple[threading.Event, str] | None = None  # the call given up, until it ends

    def run(self, client: ParameterClient, what: str, call: Callable[[ParameterClient], T]) -> T:
        """``call(save_client)`` (``what``: e.g. "the checkpoint save"), in a thread waited for at most the client's
        ``save_timeout``; ``save_client`` is :func:`save_client`'s of ``client``, closed when the call ends
        (``client`` itself where it has no connections of its own).

        Raises:
            SaveAbandonedError: it did not end in time, or the call given up before it has still not ended
                (counted as a failed save).
            CheckpointSavesFailedError: that was the ``max_failed_saves``-th failed save in a row.
            Whatever ``call`` raised.
        """
        timeout = client.config.save_timeout
        if self._stuck is not None:
            done, stuck = self._stuck
            with notify_save(client, self.manager.directory):  # (a sync step waiting for this chief is held)
                ended = wait_woken(done.wait, timeout)
            if not ended:
                raise self._given_up(client, f"{what} into {self.manager.directory} not begun: {stuck} given up "
                                             f"before it has still not ended, after another --save-timeout ({timeout:g} "
                                             "s); the store stopped answering?")
            self._stuck = None
        self.manager.abandoned = False
        done = threading.Event()
        outcome: list[T] = []
        failure: list[BaseException] = []

        own = save_client(client)  # (here: the data client's routes are read on its own thread)

        def work() -> None:
            try:
                outcome.append(call(own))
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                failure.append(e)
            finally:
                if own is not client:
                    own.close()
                done.set()

        threading.Thread(target=work, name="psflow-checkpoint-save", daemon=True).start()
        if not wait_woken(done.wait, timeout):
            self._stuck = (done, what)
            _GIVEN_UP[self.manager] = done
            self.manager.abandoned = True
            raise self._given_up(client, f"{what} into {self.manager.directory} given up: no end within --save-timeout "
                                         f"({timeout:g} s); the store stopped answering?")
        if failure:
            raise failure[0]
        return outcome[0]

    def _given_up(self, client: ParameterClient, message: str) -> SaveAbandonedError:
        error = SaveAbandonedError(message)
        self.manager.count_failure(client, error)  # (raises at --max-failed-saves in a row)
        return error


def save_client(client: ParameterClient) -> ParameterClient:
    """A client for a save's calls off the training thread: ``client``'s cluster, layout, sync, timeouts, name and
    incarnation, with connections of its own, opened at its first calls (replicated shards: a router of its own,
    routing each shard where ``client``'s routes it now, and following a failover by itself). ``client`` itself
    where its channels are in-process (called directly, several threads at once) or it is a stand-in (tests).
    Call it on ``client``'s thread."""
    channels = getattr(client, "channels", None)
    if not isinstance(client, ParameterClient) or channels is None or all(
            isinstance(c, InProcessChannel) for c in channels.values()):
        return client
    router = client.router
    own = ParameterClient(client.cluster, list(client.layout.values()), client_name=client.client_name,
                          config=client.config, sync=client.sync,
                          failover_timeout=router.failover_timeout if router is not None else None)
    if router is not None and own.router is not None:
        own.router.start_at(router)
    own.incarnation = client.incarnation
    own.last_pull_step = client.last_pull_step  # (the save notices' step until the save's own is known)
    return own
