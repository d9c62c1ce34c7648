"""The leader's side of fencing: before a write, every ps task must still accept the leader's epoch.

The ps side is :class:`psflow.coord.fence.FenceGuard` (one per ps task, served as
its ``Fence`` call, :class:`psflow.ps.protocol.FenceRequest`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from psflow.coord.api import CoordinationBackend, FencedError, Lease, LeaseLostError
from psflow.ps.protocol import FenceRequest
from psflow.rpc.api import Channel, FencedOffError, RpcError

__all__ = ["FencedWriter"]


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
            FencedError: a ps task's fence saw a higher epoch (its refusal, ABORTED: names the task).
            RpcError: no fence refused the epoch, but a ps task could not be reached or refused otherwise (a
                replicated shard's deposed member, naming its new primary: not a newer leader's epoch).
        """
        if self._backend is not None and not self._backend.is_held(self.lease):
            raise LeaseLostError(f"{self.lease.candidate}: lease on {self.lease.election!r} "
                                 f"(epoch {self.lease.epoch}) is no longer held")
        request = FenceRequest(self.lease.epoch, self.lease.election, self.lease.holder).to_frame()
        pending = [ch.call_async(FenceRequest.METHOD, request.meta, timeout=self._timeout)
                   for ch in self._channels.values()]
        refusals, error = [], None
        for call in pending:  # every call collected, even after a failure
            try:
                call.result()
            except FencedOffError as e:  # only the fence's own refusal: its status, not its text or a wider type
                refusals.append(str(e))
            except RpcError as e:
                error = error or e
        if refusals:
            raise FencedError("; ".join(refusals))
        if error is not None:
            raise error
