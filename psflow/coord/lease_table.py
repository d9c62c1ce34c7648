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

Guarantees:
    * At most one unexpired lease per election at any moment.
    * Epochs of an election grow strictly with every grant. They start from
      the wall clock in milliseconds (and then step by at least one), so they
      keep growing across a restart of ps task 0 unless its clock steps back.
    * An expired lease is never renewed, even if nobody took it over: its
      holder already considers it lost (see :class:`~psflow.coord.api.Lease`).
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

__all__ = ["COORDINATION_SERVICE", "LeaseTable", "MAX_TTL", "MIN_TTL"]

#: gRPC service name under which ps task 0 serves the lease table.
COORDINATION_SERVICE = "psflow.CoordinationService"
MIN_TTL, MAX_TTL = 0.1, 3600.0


@dataclass
class _Grant:
    candidate: str
    holder: str
    epoch: int
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
                grant = _Grant(candidate, holder, epoch, now + ttl)
                self._grants[election] = grant
            else:
                grant.expires = now + ttl
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
            grant.expires = now + ttl
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
