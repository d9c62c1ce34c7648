"""State a replicated shard's stream carries only when it changes: the chief election's lease table (shard 0,
:mod:`~psflow.ps.replication.leases`), the shard's fence (:mod:`~psflow.ps.replication.fence_state`) and the
checkpoint ledger (shard 0, :mod:`~psflow.ps.replication.save_ledger`).

Unlike the small state every entry carries (:mod:`~psflow.ps.replication.snapshot`), these change a few times a
minute at most, so a push's entry does not carry them: the entry the primary records for a change does (beside
the small state, :meth:`CarriedStates.record`), and so does every full entry (:meth:`CarriedStates.carried`).
A backup takes each from the newest entry of what it writes that carries it (:meth:`CarriedStates.written`);
a member that becomes primary tells each (:meth:`CarriedStates.promoted`).

Guarantee: entries are recorded in sequence order and each captures the state when it is built (under the
forwarder's lock), so a backup that wrote entry n holds each state as of entry n's capture or later.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from psflow.ps.protocol import ReplicaEntry
from psflow.ps.replication.snapshot import task_state

if TYPE_CHECKING:
    from psflow.ps.replication.forwarder import Forwarder
    from psflow.ps.replication.member import ShardReplication

__all__ = ["CarriedState", "CarriedStates"]


class CarriedState(Protocol):
    """One state carried by the stream under its ``key``."""

    key: str

    def export(self) -> Any:
        """The state (JSON)."""

    def load(self, state: Any) -> None:
        """(a backup) Takes the primary's ``state``; raises ``ValueError`` naming the member when malformed."""

    def promoted(self) -> None:
        """(this member became primary)"""


T = TypeVar("T", bound=CarriedState)


class CarriedStates:
    """The carried states of one member; thread-safe as each state is."""

    def __init__(self, member: ShardReplication, *states: CarriedState) -> None:
        self.member = member
        self._states: list[CarriedState] = list(states)

    def add(self, state: T) -> T:
        """Carries ``state`` too (before the member serves); returns it."""
        self._states.append(state)
        return state

    def record(self, forwarder: Forwarder, state: CarriedState) -> int:
        """(the primary, after ``state`` changed) Records the next entry, carrying ``state``; returns its seq."""
        member = self.member

        def build(seq: int) -> ReplicaEntry:
            small = task_state(member.service, member.dedup, member.counts)
            small[state.key] = state.export()
            return ReplicaEntry(seq, small)
        return forwarder.record(build)

    def carried(self, entry: ReplicaEntry) -> ReplicaEntry:
        """``entry`` (a full one) carrying every state."""
        if not self._states:
            return entry
        return replace(entry, state={**entry.state, **{s.key: s.export() for s in self._states}})

    def written(self, entries: list[ReplicaEntry]) -> None:
        """(a backup, after it wrote ``entries`` in order) Each state takes the newest one they carry.

        Raises:
            ValueError: a carried state is malformed (names this member).
        """
        for state in self._states:
            carried = next((e.state[state.key] for e in reversed(entries) if state.key in e.state), None)
            if carried is not None:
                state.load(carried)

    def promoted(self) -> None:
        for state in self._states:
            state.promoted()
