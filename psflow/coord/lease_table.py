"""Server side of the embedded coordination backend: a lease table on ps task 0.

:class:`LeaseTable` holds, per election, the current holder, its epoch and
when its lease expires. ps task 0's :class:`~psflow.server.Server` serves it as
the gRPC service ``psflow.CoordinationService`` with the methods below (all
frames carry only ``meta``):

``Campaign``  ``{election, candidate, holder, ttl}`` -> ``{granted, epoch, ttl}`` or
              ``{granted: false, leader, epoch, retry_after}``; never blocks.
``Renew``     ``{election, holder, epoch}`` -> ``{epoch, ttl}``; FAILED_PRECONDITION when lost.
``Resign``    ``{election, holder, epoch}`` -> ``{released}``; idempotent.
``Leader``    ``{election}`` -> ``{leader: null | {candidate, epoch, remaining}}``.

On a replicated shard 0 (``--ps-replicas``, :mod:`psflow.ps.replication.leases`) every member serves the
table; a member that is not the shard's primary answers every call with ``{not_primary: why, primary: task
or null}`` (:data:`NOT_PRIMARY`), and the client tries the member it names (:mod:`psflow.coord.embedded`).
The primary carries the table to its backups (:meth:`LeaseTable.export`, :meth:`LeaseTable.load`) and a
promoted backup restarts every lease's time (:meth:`LeaseTable.restart_expiries`).

Guarantees:
    * At most one unexpired lease per election at any moment.
    * Epochs of an election grow strictly with every grant. They start from
      the wall clock in milliseconds (and then step by at least one), so they
      keep growing across a restart of ps task 0 unless its clock steps back.
    * An expired lease is never renewed, even if nobody took it over: its
      holder already considers it lost (see :class:`~psflow.coord.api.Lease`).
      (A table loaded from another member's, or whose expiries restarted,
      counts each lease's time anew: :meth:`LeaseTable.load`.)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psflow.coord.api import check_name
from psflow.rpc.api import Handler, InvalidRequest, PreconditionFailed, Reply
from psflow.rpc.framing import Frame

__all__ = ["COORDINATION_SERVICE", "LeaseTable", "MAX_TTL", "MIN_TTL", "NOT_PRIMARY"]

#: gRPC service name under which ps task 0 serves the lease table.
COORDINATION_SERVICE = "psflow.CoordinationService"
MIN_TTL, MAX_TTL = 0.1, 3600.0
#: The reply key of a member of a replicated shard 0 that is not its primary (it serves no lease).
NOT_PRIMARY = "not_primary"


@dataclass
class _Grant:
    candidate: str
    holder: str
    epoch: int
    ttl: float
    expires: float  # server monotonic clock


class LeaseTable:
    """Leases of every election served by one task; thread-safe."""

    def __init__(self, task_name: str, *, clock: Callable[[], float] = time.monotonic,
                 wall_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        """Creates an empty table.

        Args:
            task_name: the serving task, put in error messages.
            clock: monotonic seconds (tests pass a fake one).
            wall_ms: wall clock in milliseconds; the floor of new epochs.
        """
        self.task_name = task_name
        self._clock = clock
        self._wall_ms = wall_ms
        self._lock = threading.Lock()
        self._grants: dict[str, _Grant] = {}
        self._last_epoch: dict[str, int] = {}

    def handlers(self) -> dict[str, Handler]:
        """Method name -> handler, for a carrier's server (:func:`psflow.rpc.registry.serve`)."""
        return {"Campaign": self._campaign, "Renew": self._renew, "Resign": self._resign, "Leader": self._leader}

    # ---- operations (also used directly by unit tests) ----------------------
    def campaign(self, election: str, candidate: str, holder: str, ttl: float) -> dict[str, Any]:
        """Grants the lease if free, expired or already held by ``holder``; never blocks."""
        with self._lock:
            now = self._clock()
            grant = self._live(election, now)
            if grant is not None and grant.holder != holder:
                return {"granted": False, "leader": grant.candidate, "epoch": grant.epoch,
                        "retry_after": max(0.0, grant.expires - now)}
            if grant is None:
                epoch = max(self._last_epoch.get(election, 0) + 1, self._wall_ms())
                self._last_epoch[election] = epoch
                grant = _Grant(candidate, holder, epoch, ttl, now + ttl)
                self._grants[election] = grant
            else:
                grant.ttl, grant.expires = ttl, now + ttl
            return {"granted": True, "epoch": grant.epoch, "ttl": ttl}

    def renew(self, election: str, holder: str, epoch: int, ttl: float) -> dict[str, Any]:
        """Extends a live lease of ``holder`` at ``epoch``.

        Raises:
            PreconditionFailed: the lease expired or belongs to someone else.
        """
        with self._lock:
            now = self._clock()
            grant = self._live(election, now)
            if grant is None or grant.holder != holder or grant.epoch != epoch:
                now_held = f"now held by {grant.candidate!r} at epoch {grant.epoch}" if grant else "now free"
                raise PreconditionFailed(f"lease on election {election!r} at epoch {epoch} is lost ({now_held})")
            grant.ttl, grant.expires = ttl, now + ttl
            return {"epoch": epoch, "ttl": ttl}

    def resign(self, election: str, holder: str, epoch: int) -> dict[str, Any]:
        """Frees the lease if ``holder`` at ``epoch`` holds it; idempotent."""
        with self._lock:
            grant = self._grants.get(election)
            if grant is not None and grant.holder == holder and grant.epoch == epoch:
                del self._grants[election]
                return {"released": True}
            return {"released": False}

    def leader(self, election: str) -> dict[str, Any] | None:
        """The live grant of ``election`` as ``{candidate, epoch, remaining}``, or ``None``."""
        with self._lock:
            now = self._clock()
            grant = self._live(election, now)
            if grant is None:
                return None
            return {"candidate": grant.candidate, "epoch": grant.epoch, "remaining": grant.expires - now}

    # ---- the table as a replicated shard 0 carries it (psflow.ps.replication.leases) -------------------
    def export(self) -> dict[str, Any]:
        """The table (JSON): every live lease's candidate, holder, epoch and ttl, and each election's last
        epoch. Not the expiry times: they are this host's monotonic clock (see :meth:`load`)."""
        with self._lock:
            now = self._clock()
            grants = {e: {"candidate": g.candidate, "holder": g.holder, "epoch": g.epoch, "ttl": g.ttl}
                      for e in list(self._grants) if (g := self._live(e, now)) is not None}
            return {"grants": grants, "last_epoch": dict(self._last_epoch)}

    def load(self, state: object) -> None:
        """Replaces the whole table with ``state`` (:meth:`export` of another member's); each lease lives its
        whole ttl from now, which a holder's own view (from before the export) never outlasts.

        Raises:
            ValueError: ``state`` is not an exported table (names this task).
        """
        try:
            grants = {str(e): _Grant(str(g["candidate"]), str(g["holder"]), _int(g["epoch"]), float(g["ttl"]), 0.0)
                      for e, g in _dict(state)["grants"].items()}
            last = {str(e): _int(n) for e, n in _dict(_dict(state)["last_epoch"]).items()}
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{self.task_name}: not a lease table: {state!r:.80} ({e})") from e
        with self._lock:
            self._grants, self._last_epoch = grants, last
            self._restart_locked()

    def restart_expiries(self) -> None:
        """Every lease now lives its whole ttl from now (a promoted member's table: its backup clock said nothing
        of when the old primary last renewed each lease), but one already expired here: its last renewal was
        carried here more than a ttl ago, so its holder's own view of it ended too (it is never renewed)."""
        with self._lock:
            now = self._clock()
            for election in list(self._grants):
                self._live(election, now)
            self._restart_locked()

    def _restart_locked(self) -> None:
        now = self._clock()
        for grant in self._grants.values():
            grant.expires = now + grant.ttl

    def _live(self, election: str, now: float) -> _Grant | None:
        grant = self._grants.get(election)
        if grant is not None and grant.expires <= now:
            del self._grants[election]
            return None
        return grant

    # ---- RPC handlers -------------------------------------------------------
    def _campaign(self, frame: Frame) -> Reply:
        m = frame.meta
        return self.campaign(_name(m, "election"), _name(m, "candidate"), _name(m, "holder"), _ttl(m)), {}

    def _renew(self, frame: Frame) -> Reply:
        m = frame.meta
        return self.renew(_name(m, "election"), _name(m, "holder"), _epoch(m), _ttl(m)), {}

    def _resign(self, frame: Frame) -> Reply:
        m = frame.meta
        return self.resign(_name(m, "election"), _name(m, "holder"), _epoch(m)), {}

    def _leader(self, frame: Frame) -> Reply:
        return {"leader": self.leader(_name(frame.meta, "election"))}, {}


def _name(meta: dict[str, Any], key: str) -> str:
    value = meta.get(key)
    try:
        return check_name("election" if key == "election" else key, value)  # type: ignore[arg-type]
    except ValueError as e:
        raise InvalidRequest(f"field {key!r}: {e}") from e


def _dict(value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"expected an object, got {type(value).__name__}")
    return value


def _int(value: object) -> int:
    if type(value) is not int:
        raise TypeError(f"expected an integer, got {value!r:.40}")
    return value


def _epoch(meta: dict[str, Any]) -> int:
    value = meta.get("epoch")
    if type(value) is not int or value < 0:
        raise InvalidRequest(f"field 'epoch' must be a non-negative integer, got {value!r:.40}")
    return value


def _ttl(meta: dict[str, Any]) -> float:
    value = meta.get("ttl")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_TTL <= value <= MAX_TTL:
        raise InvalidRequest(f"field 'ttl' must be a number of seconds in [{MIN_TTL}, {MAX_TTL}], got {value!r:.40}")
    return float(value)
