"""A replicated shard's fence (the highest chief epoch it accepted, :class:`~psflow.coord.fence.FenceGuard`),
carried to its backups (issue 28), so a promoted backup refuses a deposed chief's writes as its primary did.

A ``Fence`` call the primary accepts with a higher token than it held (a new chief fences every ps task when
it is elected, and before and after each save) records the fence as the shard's next entry
(:mod:`~psflow.ps.replication.carried`) and is answered once the backups acknowledged it. A backup merges the
fence it receives into its own (a token never decreases). A ``Fence`` that raised nothing, or served by a
member that is not the primary, is served as on an unreplicated task (the clients route it to the primary);
so is one whose acknowledgement failed (a backup too slow, or the primary deposed meanwhile; logged): the
primary accepted the token, as it would unreplicated. A token a ``SaveShard`` raises (a chief that saves without
fencing first) is carried with the next ``Fence`` call or full entry.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from psflow.rpc.api import Handler, PreconditionFailed, Reply, RpcError
from psflow.rpc.framing import Frame

if TYPE_CHECKING:
    from psflow.ps.replication.member import ShardReplication

__all__ = ["ReplicatedFence"]

log = logging.getLogger("psflow.ps.replication")


class ReplicatedFence:
    """The fence of one member's service, carried under ``"fence"``; a :class:`~.carried.CarriedState`."""

    key = "fence"

    def __init__(self, member: ShardReplication) -> None:
        self.member = member
        self.guard = member.service.fence

    def handler(self, inner: Handler) -> Handler:
        """The ``Fence`` call (``inner``: the service's own) carrying a raised token to the backups."""
        def call(frame: Frame) -> Reply:
            try:
                forwarder = self.member._check_primary()
            except PreconditionFailed:
                return inner(frame)
            before = self.guard.export()
            reply = inner(frame)  # a lower token is refused here, as unreplicated
            if self.guard.export() != before:
                try:
                    forwarder.wait(self.member.carried.record(forwarder, self))
                except RpcError as e:
                    log.warning("%s: the fence at the token just accepted did not reach every backup: %s",
                                self.member.task, e)
            return reply
        return call

    def export(self) -> dict[str, Any]:
        return self.guard.export()

    def load(self, state: Any) -> None:
        self.guard.merge(state)

    def promoted(self) -> None:
        """Nothing: the fence holds no time."""
