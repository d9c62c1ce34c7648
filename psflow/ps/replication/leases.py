"""Shard 0's lease table, replicated with the shard (issue 28): the embedded chief election survives its primary.

With ``--ps-replicas N`` every member of shard 0 (``/job:ps/task:0`` and its ``ps_backup`` tasks) serves the
embedded coordination service (:mod:`psflow.coord.lease_table`), and only the shard's primary answers it:

* A call that changes the table (a granted ``Campaign``, a ``Renew``, a ``Resign`` that released the lease) is
  served as on an unreplicated task, then the whole table is recorded as the shard's next entry, in the same
  ordered stream as its pushes, and the call is answered once every backup of the view acknowledged that entry
  (as a push is): a granted or renewed lease never lives on the primary alone. A backup's table is replaced by
  the one the newest such entry carries; a full entry (a joining member's snapshot, a LoadShard's) carries the
  table too.
* A member that is not the primary (a backup, a joining or deposed member), and a primary deposed while it
  waited for its backups' acknowledgement, answers ``{not_primary: why, primary: task or null}``
  (:data:`~psflow.coord.lease_table.NOT_PRIMARY`): the client tries the member it names
  (:mod:`psflow.coord.embedded`). A deposed primary's change was never acknowledged, and it rebuilds from the new
  primary's snapshot, table included: no split brain in the lease table.
* Promotion (by a data client's failover, or by the election's own client when no data call follows:
  :mod:`psflow.coord.embedded`, :class:`~psflow.ps.control_routes.ControlRouter`): the new primary serves the
  table it holds (same holders, same epochs, same last epoch of each election, so epochs keep growing), each
  lease living its whole ttl from the promotion (:meth:`~psflow.coord.lease_table.LeaseTable.restart_expiries`).
  Safe: every renewal the old primary answered was acknowledged by this member first, so before its promotion;
  the holder's own view of the lease ends ttl after it *sent* that renewal at the latest, so before the promoted
  table's expiry. The promoted table thus refuses every campaign the old one would have refused; it can only
  keep a dead holder's lease up to one ttl longer, delaying its successor.
* ``Leader`` is a read, answered from the primary's table without waiting (a primary deposed without knowing it
  yet may answer from its older table, as it answers a Pull).

Not carried: expiry times (a host's monotonic clock), and calls that changed nothing (a refused ``Campaign``).
An unreplicated cluster builds none of this: ps task 0 serves its table as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from psflow.coord.lease_table import NOT_PRIMARY, LeaseTable
from psflow.rpc.api import Handler, PreconditionFailed, Reply
from psflow.rpc.framing import Frame

if TYPE_CHECKING:
    from psflow.ps.replication.member import ShardReplication

__all__ = ["ReplicatedLeases"]


class ReplicatedLeases:
    """The lease table of one member of shard 0, served by the primary and carried to the backups under
    ``"leases"`` (a :class:`~psflow.ps.replication.carried.CarriedState`). Thread-safe."""

    key = "leases"

    def __init__(self, member: ShardReplication, table: LeaseTable) -> None:
        self.member, self.table = member, table

    def handlers(self) -> dict[str, Handler]:
        """The coordination service's handlers, each answered by the primary only (see the module docstring)."""
        return {method: self._primary_only(method, handler) for method, handler in self.table.handlers().items()}

    def _primary_only(self, method: str, handler: Handler) -> Handler:
        def call(frame: Frame) -> Reply:
            try:
                forwarder = self.member._check_primary()
            except PreconditionFailed as e:
                return self._not_primary(str(e))
            meta, arrays = handler(frame)  # a lost lease's Renew raises here, as unreplicated
            if _changed(method, meta):
                try:
                    forwarder.wait(self.member.carried.record(forwarder, self))
                except PreconditionFailed as e:  # deposed while it waited: the change was never acknowledged
                    return self._not_primary(str(e))
            return meta, arrays
        return call

    def _not_primary(self, why: str) -> Reply:
        member = self.member
        deposed_by = member.deposal.by
        primary = deposed_by[0] if deposed_by is not None else member.view.view.primary
        return {NOT_PRIMARY: why, "primary": primary if primary != member.task else None}, {}

    # ---- carried by the shard's stream (carried.py) -------------------------------------------------
    def export(self) -> dict[str, Any]:
        return self.table.export()

    def load(self, state: Any) -> None:
        self.table.load(state)

    def promoted(self) -> None:
        """(this member became primary) Each lease lives its whole ttl from now (one expired here stays so)."""
        self.table.restart_expiries()


def _changed(method: str, meta: Mapping[str, Any]) -> bool:
    """Whether the served call changed the table (a Renew that did not raise did)."""
    if method == "Campaign":
        return bool(meta.get("granted"))
    if method == "Resign":
        return bool(meta.get("released"))
    return method == "Renew"
