"""The checkpoint ledger, replicated with the shard holding global_step (issue 28): a promoted backup serves the
run's save counts, newest checkpoint and failed-save streak as its primary did.

The ledger (:class:`~psflow.ps.save_ledger.SaveLedger`, ``CheckpointStatus``: the lineage, saves done and
failed, the consecutive failures ``--max-failed-saves`` reads, the newest saved step and path, the newest
failures) lives on the task holding global_step; with ``--ps-replicas N`` every member of that shard keeps one:

* A ``CheckpointStatus`` that changes it (a save's ``outcome``; a ``lineage_if_unset`` while none is set) is
  served by the primary as on an unreplicated task, then the whole ledger is recorded as the shard's next entry
  (:mod:`~psflow.ps.replication.carried`), in the same ordered stream as its pushes, and the call is answered
  once every backup of the view acknowledged it: an outcome the chief was told is counted never lives on the
  primary alone. A backup's ledger is replaced by the one the newest such entry carries; a full entry (a joining
  member's snapshot, a ``LoadShard``'s, whose lineage the load set) carries it too.
* A member that is not the primary (a backup, a joining or deposed member), and a primary deposed while it
  waited for its backups' acknowledgement, refuses a change with FAILED_PRECONDITION naming the primary it
  knows (nothing changed): the chief's client resends to the shard's primary
  (:class:`~psflow.ps.failover.ShardRouter`), as it does a push.
* A read (no outcome, a lineage already set) is served by any member holding the shard's state (the primary, a
  backup of its view) from its own ledger without waiting: a backup's is that of the newest entry it wrote. A
  member without it (restarted and rebuilding from the primary, deposed) refuses with FAILED_PRECONDITION naming
  the primary it knows, as a change: its ledger is empty, or its own file's from before it died, and a reader
  routing to it by an old route (the launcher's client, whose calls to a restarted task at the same address
  never fail) took the lower counts for a restart of the ledger's task and counted every save again once it
  read the primary's (:class:`~psflow.checkpoint.ledger.SaveStatusWatcher`); refused, the reader's router
  follows the shard to its primary.

Exact across a failover: an outcome the primary recorded whose reply was lost as it died, resent by the chief
to the promoted backup, is counted once (the report's id, :attr:`~psflow.ps.protocol.SaveOutcome.report_id`, is
carried with the ledger). An unreplicated cluster builds none of this: ps task 0 keeps its ledger in memory as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from psflow.ps.protocol import CheckpointStatusRequest
from psflow.ps.save_ledger import SaveLedger
from psflow.rpc.api import Handler, Reply
from psflow.rpc.framing import Frame

if TYPE_CHECKING:
    from psflow.ps.replication.member import ShardReplication

__all__ = ["ReplicatedSaveLedger"]


class ReplicatedSaveLedger:
    """The checkpoint ledger of one member, carried under ``"saves"`` (a
    :class:`~psflow.ps.replication.carried.CarriedState`; the member adds it where its shard holds global_step).
    Thread-safe."""

    key = "saves"

    def __init__(self, member: ShardReplication, ledger: SaveLedger) -> None:
        self.member, self.ledger = member, ledger

    def handlers(self, table: Mapping[str, Handler]) -> dict[str, Handler]:
        """``CheckpointStatus`` of the service's ``table``, replicated (:meth:`handler`); empty if it has none."""
        method = CheckpointStatusRequest.METHOD
        return {method: self.handler(table[method])} if method in table else {}

    def handler(self, inner: Handler) -> Handler:
        """The ``CheckpointStatus`` call (``inner``: the service's own), its changes carried to the backups."""
        def call(frame: Frame) -> Reply:
            request = CheckpointStatusRequest.from_frame(frame)
            if request.outcome is None and (request.lineage_if_unset is None or self.ledger.lineage is not None):
                if not self.member.has_state:  # a read (a lineage once set is never unset but by a LoadShard's entry)
                    self.member._check_primary()  # raises PreconditionFailed naming the primary it knows
                return inner(frame)
            # Raises PreconditionFailed naming the primary (this member is not it, or was deposed meanwhile) or
            # Unavailable (a backup too slow), as a push's wait does: the chief's client resends to the primary.
            forwarder = self.member._check_primary()
            reply = inner(frame)
            forwarder.wait(self.member.carried.record(forwarder, self))
            return reply
        return call

    # ---- carried by the shard's stream (carried.py) -------------------------------------------------
    def export(self) -> dict[str, Any]:
        return self.ledger.export()

    def load(self, state: Any) -> None:
        try:
            self.ledger.load(state)
        except ValueError as e:
            raise ValueError(f"{self.member.task}: {e}") from e

    def promoted(self) -> None:
        """Nothing: the ledger holds no clock."""
