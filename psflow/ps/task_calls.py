"""TaskCalls: how a client's requests reach the ps tasks, and how their replies come back.

:class:`~psflow.ps.client.ParameterClient` decides what each ps task gets (one :mod:`psflow.ps.protocol`
message per task and call); this module carries those messages on the task's channel and waits for the
replies, the same way for a pull, a push or a control call.

Guarantees:
    * Unreplicated (no router): each request is sent once on its task's channel and never retried (a push
      retried could apply twice); :meth:`TaskCalls.collect` waits for every call and then raises the first
      failure (:func:`psflow.rpc.api.gather`), so no call is left in flight on a connection.
    * Replicated shards (a :class:`~psflow.ps.failover.ShardRouter`): a request goes to its shard's current
      primary, carrying the epoch it was routed at (:func:`~psflow.ps.push_numbers.at_epoch`); a call that
      fails over is resent, the same request at the new epoch, to the new primary only, which applies a push
      at most once (its ``push_id``): each push is applied exactly once.
    * Acknowledgements (replicated): each shard named in ``pushed`` that replied counts the push acknowledged
      (:class:`~psflow.ps.push_numbers.PushNumbers`), also when another shard's call fails for good. A push
      replied ``ack_pending`` (:meth:`TaskCalls.send_acked`) counts once its ``Acked`` call replied.
    * Only :meth:`TaskCalls.collect`, :meth:`TaskCalls.gather`, :meth:`TaskCalls.call_one`,
      :meth:`TaskCalls.wait_ready` and :meth:`TaskCalls.shutdown` block; the ``send`` calls return with the
      call in flight.

Not thread-safe: one per client (the client's training thread).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from concurrent import futures
from typing import Any

from psflow.ps.failover import ShardRouter, resolve_all
from psflow.ps.protocol import AckedRequest, PushPullRequest, PushRequest, Request, ack_pending, held_push, pending_ack
from psflow.ps.push_numbers import PushNumbers, at_epoch
from psflow.rpc.api import Channel, PendingReply, RpcError, gather
from psflow.rpc.framing import Frame

__all__ = ["TaskCalls"]

log = logging.getLogger("psflow.ps.client")


class TaskCalls:
    """A client's calls to its ps tasks: sent on each task's channel (a replicated shard's: its primary's)."""

    def __init__(self, channels: dict[int, Channel], router: ShardRouter | None, pushes: PushNumbers | None, *,
                 client_name: str) -> None:
        """Args:
            channels: ps task (shard) -> its channel; the same dict the client shows (a replicated shard's
                entry is its current primary's, updated by ``router`` on a failover).
            router: (replicated shards) routes each shard to its primary and resends failed-over calls;
                None: unreplicated.
            pushes: (replicated shards) the client process's push numbers, counting acknowledgements.
            client_name: the client's task name, for logs.
        """
        self.channels = channels
        self.router = router
        self.pushes = pushes
        self.client_name = client_name

    def wait_ready(self, timeout: float | None, *, connect_timeout: float) -> None:
        """Blocks until every ps task is up (``timeout`` s, None: each channel's own bound); replicated shards:
        until each shard has a primary (``timeout``, None: ``connect_timeout``), which its calls then go to.

        Raises:
            TaskUnavailableError: a task (a shard) did not come up in time (names it).
        """
        if self.router is not None:
            resolve_all(self.router, sorted(self.channels), timeout=connect_timeout if timeout is None else timeout)
            return
        with futures.ThreadPoolExecutor(len(self.channels)) as pool:
            for f in [pool.submit(ch.wait_ready, timeout) for ch in self.channels.values()]:
                f.result()

    def send(self, task: int, request: Request, *, timeout: float | None = None) -> PendingReply:
        """Sends ``request`` on ps task ``task``'s channel as it is (no epoch, no failover); waits for nothing."""
        frame = request.to_frame()
        return self.channels[task].call_async(request.METHOD, frame.meta, frame.arrays, timeout=timeout)

    def send_all(self, requests: Mapping[int, Request], *, timeout: float | None) -> dict[int, PendingReply]:
        """Sends each task its request (a replicated shard's: to its primary, at its epoch); waits for nothing."""
        router = self.router
        if router is None:
            return {t: self.send(t, r, timeout=timeout) for t, r in requests.items()}
        return {t: self.send(t, at_epoch(r, router.epoch(t)), timeout=timeout) for t, r in requests.items()}

    def collect(self, requests: Mapping[int, Request], sent: Mapping[int, PendingReply], *,
                timeout: float | None = None, pushed: Collection[int] = ()) -> dict[int, Frame]:
        """Blocks until every call :meth:`send_all` sent for ``requests`` replied; returns task -> reply.

        A push answered held (a chief's save holds its sync step, or in ssp its wait for the slowest worker:
        :mod:`psflow.ps.save_hold`) is sent again until let go. Replicated shards: a failed-over
        shard's request is resent to its new primary (the router), and each shard of ``pushed`` (those whose
        request carries a push) that replied counts the push acknowledged (once: a held push's resends do not
        count), also when another shard's call fails for good.

        Raises:
            RpcError: a task refused or failed (the first, after every call finished).
        """
        router = self.router
        if router is None:
            frames = gather(sent)
            # A sync push held while the chief saves (psflow.ps.save_hold): the same call again, until applied.
            while held := [t for t, frame in frames.items() if held_push(frame)]:
                frames.update(gather({t: self.send(t, requests[t], timeout=timeout) for t in held}))
            return frames

        def resend(task: int) -> PendingReply:
            return self.send(task, at_epoch(requests[task], router.epoch(task)), timeout=timeout)

        pushes = self.pushes

        def replied(tasks: Collection[int]) -> None:
            if pushes is not None:
                pushes.acknowledged(t for t in tasks if t in pushed)

        frames = router.gather(dict(sent), resend, replied=replied if pushed else None)
        # A push held while the chief saves (psflow.ps.save_hold), acknowledged at its held answer: the same call
        # again, until let go. sync: not recorded yet, it waits on in its step (or gets the step's record); ssp:
        # applied and recorded, its dedup record keeps it from being applied twice, and it waits again.
        while held := [t for t, frame in frames.items() if held_push(frame)]:
            frames.update(router.gather({t: resend(t) for t in held}, resend))
        return frames

    def collect_rows(self, requests: Mapping[int, Request], sent: Mapping[int, PendingReply], pushed: Collection[int],
                     *, timeout: float | None = None) -> dict[int, Frame]:
        """:meth:`collect` for PushPullAckLater calls (replicated shards), counting nothing acknowledged yet: the
        replies go to :meth:`send_acked`. If a shard's call fails for good, each shard of ``pushed`` that replied
        is sent its Acked call, waited for (and counted, as :meth:`collect` counts a push another shard failed)
        before the error is raised: no push is left applied and neither acknowledged nor in flight.

        Raises:
            RpcError: as :meth:`collect`.
        """
        router = self.router
        if router is None:
            raise ValueError(f"{self.client_name}: rows before the acknowledgement come from replicated shards only")
        replied: list[int] = []

        def resend(task: int) -> PendingReply:
            return self.send(task, at_epoch(requests[task], router.epoch(task)), timeout=timeout)

        try:
            return router.gather(dict(sent), resend, replied=replied.extend)
        except RpcError:
            self.acknowledge_applied(requests, [t for t in replied if t in pushed], timeout=timeout)
            raise

    def acknowledge_applied(self, requests: Mapping[int, Request], tasks: Collection[int], *,
                            timeout: float | None = None) -> None:
        """(Replicated shards) Each shard of ``tasks`` applied its PushPullAckLater's push and replied, but the
        call as a whole fails (another shard's call failed for good, or a reply cannot be read): sends each its
        ``Acked`` call and waits for them, each counted acknowledged as it replies, so that no push is left
        applied and neither acknowledged nor in flight. A failure is logged, not raised: the caller raises its
        own error."""
        applied = {t: pending_ack() for t in tasks}  # (their entries' seqs unread)
        try:
            self.send_acked(requests, applied, timeout=timeout)()
        except RpcError as e:
            log.info("%s: a push a shard applied was not acknowledged: %s", self.client_name, e)

    def send_acked(self, requests: Mapping[int, Request], frames: Mapping[int, Frame], *,
                   timeout: float | None = None) -> Callable[[], dict[int, Frame]]:
        """(Replicated shards) For each shard of ``frames`` (a PushPullAckLater's reply, its push's and rows):
        one marked ``ack_pending`` gets its ``Acked`` call, sent now; the others count acknowledged now. Returns
        the wait for those calls (call it once): shard -> its push's reply, each shard counted acknowledged as
        it replied. A shard whose Acked call fails over gets its push resent alone, to its primary now, which
        applies it at most once (its ``push_id``): a backup promoted without it applies it then.

        Raises (the wait): RpcError as :meth:`collect`."""
        router, pushes = self.router, self.pushes
        if router is None or pushes is None:
            raise ValueError(f"{self.client_name}: Acked calls go to replicated shards only")
        pending = {t for t, frame in frames.items() if ack_pending(frame) is not None}
        pushes.acknowledged(t for t in frames if t not in pending)

        def push_of(task: int) -> PushRequest:
            call = requests[task]
            if not isinstance(call, PushPullRequest):  # only a PushPullAckLater's reply is marked pending
                raise ValueError(f"{self.client_name}: {call.METHOD} to ps task {task} carries no push to acknowledge")
            return call.push

        def acked(task: int) -> PendingReply:
            tag = push_of(task).worker
            request = AckedRequest(tag.worker or self.client_name, tag.incarnation, tag.push_id or 0, router.epoch(task))
            return self.send(task, request, timeout=timeout)

        def resend(task: int) -> PendingReply:  # the push alone: its rows were read already
            return self.send(task, at_epoch(push_of(task), router.epoch(task)), timeout=timeout)

        sent = {t: acked(t) for t in sorted(pending)}
        return lambda: router.gather(sent, resend, replied=pushes.acknowledged) if sent else {}

    def gather(self, requests: Mapping[int, Request], *, timeout: float | None = None,
               pushed: Collection[int] = ()) -> dict[int, Frame]:
        """:meth:`send_all` and then :meth:`collect`: sends each task its request and waits for every reply."""
        return self.collect(requests, self.send_all(requests, timeout=timeout), timeout=timeout, pushed=pushed)

    def call_async(self, task: int, request: Request, *, timeout: float | None = None) -> PendingReply:
        """Sends ``request`` to ps task ``task``; not retried, but a replicated shard's call that fails over is
        resent to its new primary (:meth:`~psflow.ps.failover.ShardRouter.call`); a ``timeout`` given also
        bounds the wait for that failover."""
        if self.router is None:
            return self.send(task, request, timeout=timeout)
        return self.router.call(task, lambda shard: self.send(shard, request, timeout=timeout), wait=timeout)

    def call_one(self, task: int, method: str, meta: Mapping[str, Any] | None = None, *,
                 timeout: float | None = None) -> Frame:
        """One call without arrays to ps task ``task``, waited for (a replicated shard's: followed to its new
        primary on a failover; ``timeout``, if given, bounds the call and that wait).

        Raises:
            RpcError: the task refused or failed.
        """
        if self.router is None:
            return self.channels[task].call(method, meta, timeout=timeout)
        return self.router.call(task, lambda shard: self.channels[shard].call_async(method, meta, timeout=timeout),
                                wait=timeout).result()

    def shutdown(self) -> None:
        """Asks every ps task (shard primary) to stop serving, one after another (5 s each); errors are logged,
        not raised."""
        for ch in self.channels.values():
            try:
                ch.call("Shutdown", timeout=5.0)
            except RpcError as e:
                log.warning("%s: shutdown of %s failed: %s", self.client_name, ch.task, e)

    def close(self) -> None:
        """Closes every channel (a replicated cluster's: to every member, through the router); idempotent."""
        if self.router is not None:
            self.router.close()
            return
        for ch in self.channels.values():
            ch.close()
