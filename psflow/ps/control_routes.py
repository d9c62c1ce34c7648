"""Replicated shards' primaries for a worker's calls off its training thread (issue 28): the chief election's
client (shard 0's primary, :mod:`psflow.coord.embedded`) and the new chief's fence (every shard).

The data client's :class:`~psflow.ps.failover.ShardRouter` is used by its training thread alone, and only a
data call that fails starts a failover. The lease keepalive and the background campaign run on threads of
their own, and at times no data call follows at all (the last worker's final duties, after its ``leave()``),
so a dead primary of shard 0 would leave the election without a primary. :class:`ControlRouter` holds a
ShardRouter of its own (:meth:`~psflow.ps.failover.ShardRouter.twin`) and lets one call use it at a time:
the same ``ReplicaStatus`` rounds, the same rule (:func:`~psflow.ps.primary_choice.decide`), the same
``Promote`` at the same epoch, and the same proof that a primary is gone before a backup is promoted over it
(a refused connection to a member it reached, or ``failover_timeout`` s of silence). ``Promote`` is
idempotent, so this router and a data client promoting the same backup meet at the same primary.

Thread-safe (one call at a time holds its router). An unreplicated cluster builds none.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from psflow.ps.failover import ShardRouter
from psflow.rpc.api import Channel, PendingReply, RpcError
from psflow.rpc.framing import Frame

__all__ = ["ControlRouter"]

log = logging.getLogger("psflow.ps.client")


class ControlRouter:
    """A :class:`~psflow.ps.failover.ShardRouter` shared by threads, one call at a time; see the module docstring."""

    def __init__(self, router: ShardRouter) -> None:
        """``router``: a router no other code uses (e.g. the data client's router's ``twin``)."""
        self._router = router
        self._lock = threading.Lock()

    def primary(self, shard: int, reached: Collection[str] = ()) -> str | None:
        """Shard ``shard``'s primary now, a backup promoted first where a data client's failover would promote
        it; None when no member can serve the shard yet (logged; ask again later).

        Blocks for one round of ``ReplicaStatus`` calls (``status_timeout`` at most) and a ``Promote``; never
        waits for a member to be proven gone (a later call asks again).

        Args:
            shard: the shard.
            reached: members whose process answered the caller through another service at their address (the
                coordination service): a refused connection to one proves it gone at once
                (:meth:`~psflow.ps.failover.ShardRouter.reached`).
        """
        with self._lock:
            for task in reached:
                self._router.reached(task)
            try:
                self._router.resolve(shard, timeout=0)
            except RpcError as e:
                log.info("%s: %s", self._router.client_name, e)
                return None
            return self._router.routes[shard][0]

    def channels(self, *, wait: float) -> dict[int, Channel]:
        """Shard -> a channel whose calls go to the shard's primary and follow a failover as a data client's do
        (:meth:`~psflow.ps.failover.ShardRouter.call`: resent to the new primary, for at most ``wait`` s): for
        rare calls that may be resent (``Fence``). Each call first asks the shard's members their status (one
        round, no wait): the route this router last followed may be stale, and a backup would serve a
        ``Fence`` as an unreplicated task does (:mod:`psflow.ps.replication.fence_state`)."""
        return {shard: _FollowingChannel(self, shard, wait) for shard in self._router.members}

    def close(self) -> None:
        """Closes the router's channels; idempotent."""
        with self._lock:
            self._router.close()

    def _call(self, shard: int, method: str, meta: Mapping[str, Any] | None,
              arrays: Mapping[str, np.ndarray] | None, timeout: float | None, wait: float) -> PendingReply:
        router = self._router
        with self._lock:
            try:
                router.resolve(shard, timeout=0)
            except RpcError as e:  # no member can serve it now: the call's own failure is followed
                log.info("%s: %s", router.client_name, e)
            followed = router.call(
                shard, lambda k: router.channels[k].call_async(method, meta, arrays, timeout=timeout), wait=wait)
        return _Held(self._lock, followed)


class _Held:
    """A followed call whose wait (and any failover it follows) holds the router's lock."""

    def __init__(self, lock: threading.Lock, call: PendingReply) -> None:
        self._lock, self._call = lock, call

    def result(self) -> Frame:
        with self._lock:
            return self._call.result()


class _FollowingChannel:
    """A :class:`~psflow.rpc.api.Channel` to one shard's primary, wherever it is (:meth:`ControlRouter.channels`)."""

    def __init__(self, control: ControlRouter, shard: int, wait: float) -> None:
        self.task, self.address = f"the primary of ps shard {shard}", ""
        self._control, self._shard, self._wait = control, shard, wait

    def wait_ready(self, timeout: float | None = None) -> None:
        """Returns at once: a call finds the primary."""

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> PendingReply:
        return self._control._call(self._shard, method, meta, arrays, timeout, self._wait)

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def close(self) -> None:
        """Nothing: the router's channels close with :meth:`ControlRouter.close`."""
