"""Fencing: refuse writes from a deposed leader.

Server side, every ps task owns a :class:`FenceGuard` (``ParameterService.fence``)
and serves it as the ``Fence`` method of ``psflow.ParameterService``::

    Fence  {token: int >= 0, scope: str = "chief", holder: str} -> {accepted: true, highest}
           FAILED_PRECONDITION when token < the highest token seen for scope

Writers that must be fenced (checkpoint shards, manifests) call
:meth:`FenceGuard.hold` around the write, or the ps-side code calls
:meth:`FenceGuard.check` with the token the request carried.

Client side, :class:`FencedWriter` sends its lease's epoch to every ps task
before a write and raises :class:`~psflow.coord.api.FencedError` naming the
task that refused.

Guarantees:
    * Per scope, the recorded token never decreases; a token equal to the
      highest is accepted (one leader writes many times), a lower one never.
    * :meth:`FenceGuard.hold` keeps the guard locked during the write, so a
      successor's higher token is recorded only after the write in progress
      finished, and every write after that is refused to the old leader.
    * The guard lives in the ps process's memory: a restarted ps starts from
      0 and accepts the current leader's token again (epochs only grow).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from psflow.coord.api import DEFAULT_ELECTION, CoordinationBackend, FencedError, Lease, LeaseLostError
from psflow.rpc.api import Channel, FailedPreconditionError, InvalidRequest, PreconditionFailed, Reply, RpcError
from psflow.rpc.framing import Frame

__all__ = ["FenceGuard", "FencedWriter"]

log = logging.getLogger("psflow.coord")


class FenceGuard:
    """Highest fencing token seen, per scope, on one task; thread-safe."""

    def __init__(self, task_name: str) -> None:
        self.task_name = task_name
        self._lock = threading.RLock()
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
            self._highest[scope] = (token, holder)

    @contextmanager
    def hold(self, token: int, *, scope: str = DEFAULT_ELECTION, holder: str = "") -> Iterator[None]:
        """Checks ``token`` and keeps the guard locked for the write inside the block.

        Raises:
            FencedError: as :meth:`check`.
        """
        with self._lock:
            self.check(token, scope=scope, holder=holder)
            yield

    def handle(self, frame: Frame) -> Reply:
        """The ``Fence`` RPC handler."""
        token, scope, holder = frame.meta.get("token"), frame.meta.get("scope", DEFAULT_ELECTION), frame.meta.get("holder", "")
        if type(token) is not int or token < 0:
            raise InvalidRequest(f"Fence: 'token' must be a non-negative integer, got {token!r:.40}")
        if not isinstance(scope, str) or not scope or len(scope) > 200:
            raise InvalidRequest(f"Fence: 'scope' must be a non-empty string, got {scope!r:.40}")
        if not isinstance(holder, str) or len(holder) > 400:
            raise InvalidRequest(f"Fence: 'holder' must be a string, got {holder!r:.40}")
        try:
            self.check(token, scope=scope, holder=holder)
        except FencedError as e:
            raise PreconditionFailed(str(e)) from e
        return {"accepted": True, "highest": token}, {}


class FencedWriter:
    """Checks, before each write, that a leader's epoch is still the highest on every ps task."""

    def __init__(self, channels: Mapping[Any, Channel], lease: Lease, *,
                 backend: CoordinationBackend | None = None, timeout: float = 10.0) -> None:
        """Wraps channels to the ps tasks' ParameterService.

        Args:
            channels: the ps tasks (any key -> channel on ``psflow.ParameterService``).
            lease: the writer's lease; its election is the fencing scope.
            backend: if given, :meth:`check` first asks it whether the lease is still held.
            timeout: deadline of each Fence call, seconds.
        """
        self._channels = dict(channels)
        self.lease = lease
        self._backend = backend
        self._timeout = timeout

    def check(self) -> None:
        """Blocks until every ps task accepted the epoch (calls in parallel).

        Raises:
            LeaseLostError: the backend says the lease is no longer held.
            FencedError: a ps task saw a higher epoch (names the task).
            RpcError: a ps task could not be reached.
        """
        if self._backend is not None and not self._backend.is_held(self.lease):
            raise LeaseLostError(f"{self.lease.candidate}: lease on {self.lease.election!r} "
                                 f"(epoch {self.lease.epoch}) is no longer held")
        meta = {"token": self.lease.epoch, "scope": self.lease.election, "holder": self.lease.holder}
        pending = [ch.call_async("Fence", meta, timeout=self._timeout) for ch in self._channels.values()]
        refusals, error = [], None
        for call in pending:  # every call collected, even after a failure
            try:
                call.result()
            except FailedPreconditionError as e:
                refusals.append(str(e))
            except RpcError as e:
                error = error or e
        if refusals:
            raise FencedError("; ".join(refusals))
        if error is not None:
            raise error
