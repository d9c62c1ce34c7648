"""Fencing: refuse writes from a deposed leader.

Server side, every ps task owns a :class:`FenceGuard` (``ParameterService.fence``);
the service serves it as its ``Fence`` call (a token, the lease's epoch, for a
scope, the election; ABORTED (:class:`~psflow.rpc.api.FencedOff`, a FailedPreconditionError to the caller)
when the token is lower than the
highest seen for the scope: :class:`psflow.ps.protocol.FenceRequest`).

Writers that must be fenced (checkpoint shards, manifests) call
:meth:`FenceGuard.hold` around the write, or the ps-side code calls
:meth:`FenceGuard.check` with the token the request carried.

Client side, :class:`psflow.ps.fencing.FencedWriter` sends its lease's epoch to
every ps task before a write and raises :class:`~psflow.coord.api.FencedError`
naming the task that refused.

Guarantees:
    * Per scope, the recorded token never decreases; a token equal to the
      highest is accepted (one leader writes many times), a lower one never.
    * :meth:`FenceGuard.hold` keeps the guard locked during the write, so a
      successor's higher token is recorded only after the write in progress
      finished, and every write after that is refused to the old leader.
    * The guard lives in the ps process's memory: a restarted ps starts from
      0 and accepts the current leader's token again (epochs only grow).
      With replicated ps shards the primary carries it to its backups
      (:meth:`FenceGuard.export`, :meth:`FenceGuard.merge`;
      :mod:`psflow.ps.replication.fence_state`), so a promoted backup refuses
      what its primary refused.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from psflow.coord.api import DEFAULT_ELECTION, FencedError

__all__ = ["FenceGuard"]

log = logging.getLogger("psflow.coord")


class FenceGuard:
    """Highest fencing token seen, per scope, on one task; thread-safe."""

    def __init__(self, task_name: str) -> None:
        self.task_name = task_name
        self._lock = threading.RLock()
        # scope -> (token, holder); replaced whole under _lock, never changed in place (export reads it unlocked)
        self._highest: dict[str, tuple[int, str]] = {}

    def highest(self, scope: str = DEFAULT_ELECTION) -> int:
        """The highest token accepted for ``scope`` (0: none yet)."""
        with self._lock:
            return self._highest.get(scope, (0, ""))[0]

    def check(self, token: int, *, scope: str = DEFAULT_ELECTION, holder: str = "") -> None:
        """Accepts ``token`` if no higher one was seen for ``scope``, and records it; a refusal is logged
        (WARNING, logger ``psflow.coord``).

        Raises:
            FencedError: a higher token was seen (names both tokens and holders).
        """
        with self._lock:
            best, best_holder = self._highest.get(scope, (0, ""))
            if token < best:
                message = (f"{self.task_name}: write from {holder or 'a writer'} with epoch {token} refused: "
                           f"{scope!r} is fenced at epoch {best} (by {best_holder or 'another writer'})")
                log.warning("%s", message)  # a deposed leader tried to write: visible in the ps task's log
                raise FencedError(message)
            self._highest = {**self._highest, scope: (token, holder)}  # replaced whole: export reads it unlocked

    def export(self) -> dict[str, Any]:
        """Every scope's highest token and its holder (JSON: ``{scope: [token, holder]}``), as of one moment.

        Read without the guard's lock (the table is replaced whole, never changed in place), so it never waits
        for a write :meth:`hold` keeps the guard locked for: a replicated shard's primary reads it while it holds
        the lock that orders its entries (:mod:`psflow.ps.replication.carried`), and a ``BeginRestore`` holding the
        guard waits for the restore mutex, which a chief's ``Register`` holds while it waits for that lock
        (:mod:`psflow.ps.replication.register_call`): waiting here closed that cycle."""
        highest = self._highest
        return {scope: [token, holder] for scope, (token, holder) in highest.items()}

    def merge(self, state: object) -> None:
        """Takes each scope's token of ``state`` (another guard's :meth:`export`) where it is higher than this
        guard's: a token never decreases.

        Raises:
            ValueError: ``state`` is not an exported fence (names this task).
        """
        if not isinstance(state, dict) or not all(
                isinstance(v, list) and len(v) == 2 and type(v[0]) is int and isinstance(v[1], str)
                for v in state.values()):
            raise ValueError(f"{self.task_name}: not a fence: {state!r:.80}")
        with self._lock:
            highest = dict(self._highest)
            for scope, (token, holder) in state.items():
                if token > highest.get(str(scope), (0, ""))[0]:
                    highest[str(scope)] = (token, holder)
            self._highest = highest  # replaced whole (see export)

    @contextmanager
    def hold(self, token: int, *, scope: str = DEFAULT_ELECTION, holder: str = "") -> Iterator[None]:
        """Checks ``token`` and keeps the guard locked for the write inside the block.

        Raises:
            FencedError: as :meth:`check`.
        """
        with self._lock:
            self.check(token, scope=scope, holder=holder)
            yield

