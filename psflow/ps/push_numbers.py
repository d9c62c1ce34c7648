"""A client's push numbers on a replicated cluster: each push call's ``push_id`` (one per call, the same on
every shard and on a resend) and each shard's ``acked`` count; and the routed epoch a request carries."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from psflow.ps.protocol import PullRequest, PushPullRequest, PushRequest, Request

__all__ = ["PushNumbers", "at_epoch"]


class PushNumbers:
    """(Replicated shards) a client process's push calls and each shard's acknowledged pushes.

    Every push call gets the next ``push_id`` (1, 2, ...), the same on each shard it goes to and on a
    resend (the shard's dedup table then replies without applying it again); each shard's request carries
    ``acked``, how many of this process's pushes that shard acknowledged before (the ps side sums them into
    ``pushes_acknowledged``: the run's ``updates_lost`` is what a checkpoint restore lacks of them), and
    ``acked_all``, those counts of every shard (so a shard whose every replica was lost, restarted empty,
    still has its count known elsewhere, also for a process that ended meanwhile).
    Not thread-safe (the client's training thread).
    """

    def __init__(self, shards: int) -> None:
        """``shards``: how many shards the cluster has (0 .. shards - 1)."""
        self.shards = shards
        #: The latest push call's push_id (0: none yet).
        self.push_id = 0
        #: shard -> pushes of this process it acknowledged.
        self.acked: dict[int, int] = {}

    def counts(self) -> tuple[int, ...]:
        """Every shard's count of this process's acknowledged pushes, in shard order."""
        return tuple(self.acked.get(shard, 0) for shard in range(self.shards))

    def number(self, requests: Mapping[int, PushRequest]) -> dict[int, PushRequest]:
        """``requests`` (one push call's, by shard) tagged with the call's new ``push_id``, each shard's ``acked``
        and every shard's (``acked_all``)."""
        self.push_id += 1
        counts = self.counts()
        return {shard: dataclasses.replace(request, worker=dataclasses.replace(
                    request.worker, push_id=self.push_id, acked=self.acked.get(shard, 0), acked_all=counts))
                for shard, request in requests.items()}

    def acknowledged(self, shards: Iterable[int]) -> None:
        """Counts one acknowledged push for each of ``shards`` (their replies came back)."""
        for shard in shards:
            self.acked[shard] = self.acked.get(shard, 0) + 1


def at_epoch(request: Request, epoch: int | None) -> Request:
    """``request`` carrying ``epoch``, the epoch of its shard's view the client routes by (pulls and pushes;
    other requests as they are)."""
    if isinstance(request, PullRequest | PushRequest):
        return dataclasses.replace(request, shard_epoch=epoch)
    if isinstance(request, PushPullRequest):
        return dataclasses.replace(request, push=dataclasses.replace(request.push, shard_epoch=epoch),  # (its class:
                                   pull=dataclasses.replace(request.pull, shard_epoch=epoch))  # PushPullAckLater too)
    return request
