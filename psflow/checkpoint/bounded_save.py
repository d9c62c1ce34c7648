"""A chief's checkpoint work on the store, waited for at most ``--save-timeout`` (:class:`BoundedSaves`).

A save's calls on an object store have no deadline of their own (the store's clients retry without one), so a
store that stopped answering held the chief in its save for ever: in async mode the other workers finished and
left, and the launcher waited on the chief. Each save (and the final checkpoint's work at the end) runs here in
a thread of its own, waited for at most the client's ``save_timeout`` (``--save-timeout``); past it the save is
given up: a failed save, counted as any other (:meth:`CheckpointManager.count_failure`, so ``--max-failed-saves``
in a row end the run), and the chief trains on, or finishes.

The thread given up is a daemon (it never keeps the process from exiting) and may still end later, once the
store answers: its checkpoint is then complete and current (a late failure is not counted twice). No newer save
begins before it ended: the next one first waits for it, for at most ``--save-timeout`` (in sync and ssp mode
telling the ps tasks, :func:`~psflow.checkpoint.save_notice.notify_save`, as a save does), and is a failed save
itself if it has not ended. So the abandoned save never writes the pointer after a newer save did, nor uses the
manager's state (its directory, its fence) while another save does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.save_notice import notify_save
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient

__all__ = ["BoundedSaves", "SaveAbandonedError"]

T = TypeVar("T")


class SaveAbandonedError(CheckpointError):
    """A checkpoint save did not end within ``--save-timeout`` and was given up (names the save and the flag)."""


class BoundedSaves:
    """Runs a chief's checkpoint work with ``manager`` one call at a time, each waited for at most ``--save-timeout``."""

    def __init__(self, manager: CheckpointManager) -> None:
        self.manager = manager
        self._stuck: tuple[threading.Event, str] | None = None  # the call given up, until it ends

    def run(self, client: ParameterClient, what: str, call: Callable[[], T]) -> T:
        """``call()`` (``what``: e.g. "the checkpoint save"), in a thread waited for at most the client's
        ``save_timeout``.

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
                ended = done.wait(timeout)
            if not ended:
                raise self._given_up(client, f"{what} into {self.manager.directory} not begun: {stuck} given up "
                                             f"before it has still not ended, after another --save-timeout ({timeout:g} "
                                             "s); the store stopped answering?")
            self._stuck = None
        self.manager.abandoned = False
        done = threading.Event()
        outcome: list[T] = []
        failure: list[BaseException] = []

        def work() -> None:
            try:
                outcome.append(call())
            except BaseException as e:  # noqa: BLE001 - handed to the waiting caller
                failure.append(e)
            finally:
                done.set()

        threading.Thread(target=work, name="psflow-checkpoint-save", daemon=True).start()
        if not done.wait(timeout):
            self._stuck = (done, what)
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
