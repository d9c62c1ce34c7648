"""A replicated shard's fence (the highest chief epoch it accepted, :class:`~psflow.coord.fence.FenceGuard`),
carried to its backups (issue 28), so a promoted backup refuses a deposed chief's writes as its primary did.

A ``Fence`` call the primary accepts (a new chief fences every ps task when it is elected, and before and after
each save) records the fence as the shard's next entry (:mod:`~psflow.ps.replication.carried`) and is answered
once the backups acknowledged it, even when the token was held already (a Fence resent after a failed
acknowledgement waits for the backups too). A backup merges the fence it receives into its own (a token never
decreases). A ``Fence`` served by a backup or a joining member is served as on an unreplicated task (the
clients route it to the primary).

Refused as a push is, so the caller never believes a shard fenced that its primary did not record: a member
deposed (it learned of a newer primary; until it rebuilt as that primary's backup) refuses every ``Fence`` with
FAILED_PRECONDITION naming the new primary, and so does a primary deposed while it waited for its backups'
acknowledgement; a primary whose backup did not acknowledge within ``replica_timeout`` answers UNAVAILABLE. The
caller resends to the shard's primary (the new chief's fence: :class:`~psflow.ps.control_routes.ControlRouter`).
A token a ``SaveShard`` raises (a chief that saves without fencing first) is carried with the next ``Fence``
call or full entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from psflow.rpc.api import Handler, PreconditionFailed, Reply
from psflow.rpc.framing import Frame

if TYPE_CHECKING:
    from psflow.ps.replication.member import ShardReplication

__all__ = ["ReplicatedFence"]


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
                if self.member.deposal.by is not None:
                    raise  # refused as its pushes are, naming the new primary: the caller resends there
                return inner(frame)
            reply = inner(frame)  # a lower token is refused here, as unreplicated
            # Recorded even when the token was held already: a Fence resent after a failed acknowledgement is
            # answered only once the backups hold it. Raises PreconditionFailed (deposed meanwhile) or
            # Unavailable (a backup too slow), as a push's wait does.
            forwarder.wait(self.member.carried.record(forwarder, self))
            return reply
        return call

    def export(self) -> dict[str, Any]:
        return self.guard.export()

    def load(self, state: Any) -> None:
        self.guard.merge(state)

    def promoted(self) -> None:
        """Nothing: the fence holds no time."""
