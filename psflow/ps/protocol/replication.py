"""The replicated shards' messages (issue 28): ReplicaStatus, Promote, DropBackup (a client's calls) and
Replicate, Join (between the members of one shard); and a worker's async PushPull whose acknowledgement it
collects later (``PushPullAckLater``, then ``Acked``). Semantics: :mod:`psflow.ps.replication`.

A shard's state changes travel as :class:`ReplicaEntry` values: the primary's sequence number, the small
state of the task (a JSON object the replication package writes and reads: global_step, the worker ledger,
the dedup table, ...) and the rows the change wrote (:class:`PartDelta`). ``full`` marks an entry that
carries the whole state (a Join's snapshot, a registration, a restore): the backup replaces its state with it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, ClassVar

import numpy as np

from psflow.ps.protocol.data import PushPullReply, PushPullRequest
from psflow.ps.protocol.fields import flag, list_field, message, optional_int, optional_str, refuse
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

__all__ = [
    "ROLES", "AckedRequest", "DropBackupRequest", "PushPullAckLater", "PushPullAckLaterReply", "ack_pending",
    "pending_ack",
    "JoinReply", "JoinRequest", "PartDelta", "PromoteRequest", "ReplicaEntry",
    "ReplicaStatusReply", "ReplicaStatusRequest", "ReplicateReply", "ReplicateRequest",
]

#: A member's roles (:attr:`ReplicaStatusReply.role`).
ROLES = ("primary", "backup", "joining", "deposed", "unreplicated")
# Array names of a Replicate: entry <seq>, delta <i>, array <name> -> "x/<seq>/<i>/<name>"; its rows "x/<seq>/<i>".
_ENTRY = "x/"
_TASK_MAX = 200


def _task(meta: Mapping[str, Any], key: str) -> str:
    value = optional_str(meta, key, max_length=_TASK_MAX)
    if not value:
        raise refuse(key, "a task name", meta.get(key))
    return value


def _count(meta: Mapping[str, Any], key: str) -> int:
    value = optional_int(meta, key, minimum=0)
    if value is None:
        raise refuse(key, "a non-negative integer", meta.get(key))
    return value


def _tasks(meta: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = meta.get(key)
    if value is None:
        return ()
    if not (isinstance(value, list) and all(isinstance(t, str) and 0 < len(t) <= _TASK_MAX for t in value)):
        raise refuse(key, "a list of task names", value)
    return tuple(value)


# ---- ReplicaStatus ---------------------------------------------------------------------------------------
@message
class ReplicaStatusRequest:
    """What a member is: its role in its shard, the view it knows, how far it applied."""

    METHOD: ClassVar[str] = "ReplicaStatus"

    def to_frame(self) -> Frame:
        return Frame({})


@message
class ReplicaStatusReply:
    """One member of a shard as it sees itself.

    ``role``: one of :data:`ROLES`; ``epoch``: the view's epoch (0: none yet); ``primary``/``backups``: the view it
    knows; ``applied_seq``: the newest entry it holds; ``has_state``: it holds every acknowledged update (a
    primary, or a backup in the view; a fresh, joining or deposed member says False); ``incarnation``: its
    process (start time, ns); ``lag`` (primary only): backup -> entries sent but not acknowledged; ``view_changed``
    (a ``Promote`` or ``DropBackup`` reply only): this call changed the view (False: another client's call had
    made the same change first: its client follows it and logs its promotion line at INFO only). ``step_floor`` and
    ``step_run`` (a member of shard 0 only; else None): every global_step value this member's process and its
    journal's earlier ones handed out or followed is at most ``step_floor``, for run ``step_run``
    (:meth:`psflow.ps.global_step.GlobalStep.handed_out`): a fresh shard's primary takes the highest of its run.
    """

    task: str
    shard: int
    role: str
    epoch: int
    primary: str | None
    backups: tuple[str, ...]
    applied_seq: int
    has_state: bool
    incarnation: int
    lag: Mapping[str, int] = field(default_factory=dict)
    view_changed: bool = False
    step_floor: int | None = None
    step_run: str | None = None

    def to_frame(self) -> Frame:
        meta: dict[str, Any] = {
            "task": self.task, "shard": self.shard, "role": self.role, "epoch": self.epoch, "primary": self.primary,
            "backups": list(self.backups), "applied_seq": self.applied_seq, "has_state": self.has_state,
            "incarnation": self.incarnation, "lag": dict(self.lag)}
        if self.view_changed:
            meta["view_changed"] = True
        if self.step_floor is not None:
            meta.update(step_floor=self.step_floor, step_run=self.step_run)
        return Frame(meta)

    @classmethod
    def from_frame(cls, frame: Frame) -> ReplicaStatusReply:
        meta = frame.meta
        role = meta.get("role")
        if role not in ROLES:
            raise refuse("role", f"one of {', '.join(ROLES)}", role)
        lag = meta.get("lag") or {}
        if not (isinstance(lag, dict) and all(type(v) is int for v in lag.values())):
            raise refuse("lag", "a map of task names to counts", lag)
        return cls(_task(meta, "task"), _count(meta, "shard"), role, _count(meta, "epoch"),
                   optional_str(meta, "primary", max_length=_TASK_MAX), _tasks(meta, "backups"),
                   _count(meta, "applied_seq"), flag(meta, "has_state"), _count(meta, "incarnation"), dict(lag),
                   flag(meta, "view_changed"), optional_int(meta, "step_floor", minimum=0),
                   optional_str(meta, "step_run", max_length=_TASK_MAX))


# ---- Promote / DropBackup --------------------------------------------------------------------------------
@message
class PromoteRequest:
    """Make the receiving backup primary at ``expected_epoch + 1`` (compare-and-set on its epoch)."""

    METHOD: ClassVar[str] = "Promote"
    shard: int
    expected_epoch: int
    requester: str

    def to_frame(self) -> Frame:
        return Frame({"shard": self.shard, "expected_epoch": self.expected_epoch, "requester": self.requester})

    @classmethod
    def from_frame(cls, frame: Frame) -> PromoteRequest:
        meta = frame.meta
        return cls(_count(meta, "shard"), _count(meta, "expected_epoch"), _task(meta, "requester"))


@message
class DropBackupRequest:
    """(To the primary) ``backup`` is unreachable from the requester too: go to ``expected_epoch + 1`` without it."""

    METHOD: ClassVar[str] = "DropBackup"
    shard: int
    expected_epoch: int
    backup: str
    requester: str

    def to_frame(self) -> Frame:
        return Frame({"shard": self.shard, "expected_epoch": self.expected_epoch, "backup": self.backup,
                      "requester": self.requester})

    @classmethod
    def from_frame(cls, frame: Frame) -> DropBackupRequest:
        meta = frame.meta
        return cls(_count(meta, "shard"), _count(meta, "expected_epoch"), _task(meta, "backup"),
                   _task(meta, "requester"))


# ---- Join ------------------------------------------------------------------------------------------------
@message
class JoinRequest:
    """(To the primary) ``member`` (process ``incarnation``) rebuilds from the primary's state: send it a
    snapshot and every entry after it.

    ``join_id``: this Join's number among that process's Joins (each try a new, higher one; None: not sent).
    The primary's sender it starts tags its calls with it, and the member takes calls only from its newest
    Join's sender: a Join whose reply was lost (served, but its caller gave up and sent another) leaves a
    sender whose calls would otherwise pass as the member's own. The primary refuses a Join of the same process
    not newer than the newest it served (one held up in the network)."""

    METHOD: ClassVar[str] = "Join"
    shard: int
    member: str
    incarnation: int
    join_id: int | None = None

    def to_frame(self) -> Frame:
        return Frame({"shard": self.shard, "member": self.member, "incarnation": self.incarnation,
                      "join_id": self.join_id})

    @classmethod
    def from_frame(cls, frame: Frame) -> JoinRequest:
        meta = frame.meta
        return cls(_count(meta, "shard"), _task(meta, "member"), _count(meta, "incarnation"),
                   optional_int(meta, "join_id", minimum=0))


@message
class JoinReply:
    """The primary's epoch, and the sequence number of the snapshot it will send first."""

    epoch: int
    snapshot_seq: int

    def to_frame(self) -> Frame:
        return Frame({"epoch": self.epoch, "snapshot_seq": self.snapshot_seq})

    @classmethod
    def from_frame(cls, frame: Frame) -> JoinReply:
        return cls(_count(frame.meta, "epoch"), _count(frame.meta, "snapshot_seq"))


# ---- Replicate -------------------------------------------------------------------------------------------
@message
class PartDelta:
    """What one state change wrote to one partition: ``rows`` (partition-local; None: the whole partition)
    and, by name, the arrays of those rows (the replication package names them: value, slots, average, a
    dynamic table's snapshot arrays)."""

    key: str
    rows: np.ndarray | None
    arrays: Mapping[str, np.ndarray]


@message
class ReplicaEntry:
    """One state change of the primary, number ``seq``: the task's small ``state`` (JSON) and the ``parts`` it
    wrote; ``full``: the whole state (replaces the backup's)."""

    seq: int
    state: Mapping[str, Any]
    parts: Sequence[PartDelta] = ()
    full: bool = False


@message
class ReplicateRequest:
    """Entries of ``primary`` at ``epoch``, in sequence order, to ``member`` (``backups``: the primary's view).

    ``incarnation``: the process of ``member`` they are for, the one whose ``Join`` started the primary's
    sender (None: a sender started without a Join, at a promotion or a fresh shard); another process of the
    member refuses them (a call held up across the member's restart). ``join_id``: that Join's id
    (:class:`JoinRequest`); the member refuses the calls of any Join's sender but its newest's."""

    METHOD: ClassVar[str] = "Replicate"
    epoch: int
    primary: str
    member: str
    backups: tuple[str, ...]
    entries: Sequence[ReplicaEntry]
    incarnation: int | None = None
    join_id: int | None = None

    def to_frame(self) -> Frame:
        arrays: dict[str, np.ndarray] = {}
        entries = []
        for entry in self.entries:
            parts = []
            for i, delta in enumerate(entry.parts):
                prefix = f"{_ENTRY}{entry.seq}/{i}"
                if delta.rows is not None:
                    arrays[prefix] = delta.rows
                for name, array in delta.arrays.items():
                    arrays[f"{prefix}/{name}"] = array
                parts.append([delta.key, delta.rows is not None, sorted(delta.arrays)])
            entries.append({"seq": entry.seq, "state": dict(entry.state), "deltas": parts, "full": entry.full})
        return Frame({"epoch": self.epoch, "primary": self.primary, "member": self.member,
                      "backups": list(self.backups), "entries": entries, "incarnation": self.incarnation,
                      "join_id": self.join_id}, arrays)

    @classmethod
    def from_frame(cls, frame: Frame) -> ReplicateRequest:
        meta, arrays = frame.meta, frame.arrays
        entries = []
        for item in list_field(meta, "entries"):
            if not isinstance(item, dict):
                raise InvalidRequest(f"replica entry {item!r:.60} must be an object")
            seq = _count(item, "seq")
            state = item.get("state")
            if not isinstance(state, dict):
                raise refuse("state", "an object", state)
            deltas = []
            for i, part in enumerate(list_field(item, "deltas")):
                if not (isinstance(part, list) and len(part) == 3 and isinstance(part[0], str)
                        and isinstance(part[2], list) and all(isinstance(n, str) for n in part[2])):
                    raise InvalidRequest(f"entry {seq}: delta {part!r:.60} must be [key, has_rows, [names]]")
                prefix = f"{_ENTRY}{seq}/{i}"
                rows = arrays.get(prefix) if part[1] is True else None
                if part[1] is True and rows is None:
                    raise InvalidRequest(f"entry {seq}: partition {part[0]!r:.80}: rows array missing")
                named = {}
                for name in part[2]:
                    array = arrays.get(f"{prefix}/{name}")
                    if array is None:
                        raise InvalidRequest(f"entry {seq}: partition {part[0]!r:.80}: array {name!r:.40} missing")
                    named[name] = array
                deltas.append(PartDelta(part[0], rows, named))
            entries.append(ReplicaEntry(seq, state, tuple(deltas), flag(item, "full")))
        return cls(_count(meta, "epoch"), _task(meta, "primary"), _task(meta, "member"), _tasks(meta, "backups"),
                   tuple(entries), optional_int(meta, "incarnation", minimum=0),
                   optional_int(meta, "join_id", minimum=0))


@message
class ReplicateReply:
    """The newest entry the member has applied (every earlier one is applied too)."""

    applied_seq: int

    def to_frame(self) -> Frame:
        return Frame({"applied_seq": self.applied_seq})

    @classmethod
    def from_frame(cls, frame: Frame) -> ReplicateReply:
        return cls(_count(frame.meta, "applied_seq"))


# ---- PushPullAckLater / Acked ------------------------------------------------------------------------------
@message
class PushPullAckLater(PushPullRequest):
    """(async, a replicated shard) A PushPull whose reply may come before the backups acknowledged the push: it
    then carries the rows and ``ack_pending``, and the worker collects the acknowledgement with ``Acked``."""

    METHOD: ClassVar[str] = "PushPullAckLater"


@message
class PushPullAckLaterReply:
    """A :class:`PushPullReply`; ``ack_pending``: the seq of the push's entry, not acknowledged yet (None: it
    was, or the call waited for it)."""

    reply: PushPullReply
    ack_pending: int | None = None

    def to_frame(self) -> Frame:
        frame = self.reply.to_frame()
        if self.ack_pending is not None:
            frame.meta["ack_pending"] = self.ack_pending
        return frame


def ack_pending(frame: Frame) -> int | None:
    """The ``ack_pending`` of a PushPullAckLater's reply (None: acknowledged)."""
    return optional_int(frame.meta, "ack_pending", minimum=0)


def pending_ack(seq: int = 0) -> Frame:
    """A stand-in reply marked ``ack_pending`` at ``seq``: a push known applied whose reply was not read (its
    Acked call is still owed)."""
    return Frame({"ack_pending": seq})


@message
class AckedRequest:
    """Returns once every backup of the view acknowledged push ``push_id`` of that worker process (its recorded
    entry); the reply is the push's :class:`~psflow.ps.protocol.PushReply`, as recorded."""

    METHOD: ClassVar[str] = "Acked"
    worker: str
    incarnation: int | None
    push_id: int
    shard_epoch: int | None = None

    def to_frame(self) -> Frame:
        return Frame({"worker": self.worker, "incarnation": self.incarnation, "push_id": self.push_id,
                      "shard_epoch": self.shard_epoch})

    @classmethod
    def from_frame(cls, frame: Frame) -> AckedRequest:
        meta = frame.meta
        return cls(_task(meta, "worker"), optional_int(meta, "incarnation", minimum=0), _count(meta, "push_id"),
                   optional_int(meta, "shard_epoch", minimum=0))
