"""The chief's and the checkpoints' messages: Fence, LoadShard, SetReady, BeginRestore, ReaderPositions,
CheckpointStatus (SaveShard: :mod:`psflow.ps.protocol.save_shard`; see :mod:`psflow.ps.protocol`; their semantics:
:mod:`psflow.ps.checkpointing`, :mod:`psflow.coord.fence`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import field
from typing import Any, ClassVar

import numpy as np

from psflow.coord.api import DEFAULT_ELECTION
from psflow.ps.protocol.fields import flag, list_field, message, optional_int, optional_str, refuse, strict_bool, string_map
from psflow.ps.protocol.save_shard import applied_by_process
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

__all__ = [
    "BeginRestoreReply", "BeginRestoreRequest", "CheckpointStatusReply", "CheckpointStatusRequest", "FenceReply",
    "FenceRequest", "LoadShardReply", "LoadShardRequest", "ReaderPositionsReply", "ReaderPositionsRequest",
    "SaveOutcome", "SetReadyReply", "SetReadyRequest",
]

# Array names of a LoadShard: a partition's value, its slots, a dynamic table's snapshot arrays.
_VALUE, _SLOT, _TABLE = "v/", "s/", "d/"
_BUILT, _INITIAL = "b/", "i/"  # a lazy partition's load: its saved local rows; each slot's initial row
_LINEAGE_MAX = 200


def _epoch(meta: Mapping[str, Any]) -> tuple[int | None, str]:
    """The chief's lease epoch a write is fenced with (None: unfenced), and its holder's name."""
    return optional_int(meta, "epoch", minimum=0), str(meta.get("holder", ""))[:400]


def _lineage(meta: Mapping[str, Any], key: str) -> str | None:
    value = meta.get(key)
    if value is not None and (not isinstance(value, str) or not value or len(value) > _LINEAGE_MAX):
        raise InvalidRequest(f"lineage must be a non-empty string of at most {_LINEAGE_MAX} characters, "
                             f"got {value!r:.60}")
    return value


# ---- Fence ------------------------------------------------------------------------------------------------
@message
class FenceRequest:
    """A leader's fencing token (its lease epoch) for ``scope``: refused when a higher one was seen."""

    METHOD: ClassVar[str] = "Fence"
    token: int
    scope: str = DEFAULT_ELECTION
    holder: str = ""

    def to_frame(self) -> Frame:
        return Frame({"token": self.token, "scope": self.scope, "holder": self.holder})

    @classmethod
    def from_frame(cls, frame: Frame) -> FenceRequest:
        meta = frame.meta
        token, scope, holder = meta.get("token"), meta.get("scope", DEFAULT_ELECTION), meta.get("holder", "")
        if type(token) is not int or token < 0:
            raise InvalidRequest(f"Fence: 'token' must be a non-negative integer, got {token!r:.40}")
        if not isinstance(scope, str) or not scope or len(scope) > 200:
            raise InvalidRequest(f"Fence: 'scope' must be a non-empty string, got {scope!r:.40}")
        if not isinstance(holder, str) or len(holder) > 400:
            raise InvalidRequest(f"Fence: 'holder' must be a string, got {holder!r:.40}")
        return cls(token, scope, holder)


@message
class FenceReply:
    highest: int

    def to_frame(self) -> Frame:
        return Frame({"accepted": True, "highest": self.highest})


# ---- LoadShard --------------------------------------------------------------------------------------------
@message
class LoadShardRequest:
    """Partitions to overwrite from a checkpoint (see :mod:`psflow.ps.checkpointing`, ``LoadShard``).

    Build with :meth:`build`; read a partition's arrays with :meth:`value`, :meth:`slots` and :meth:`table`.
    ``reply_within_ms``: how long the caller waits for the reply (its call's deadline; None: not sent). A
    replicated shard's primary waits that long for its backups to acknowledge the load (a full entry, the
    whole shard) instead of its ``replica_timeout`` (:mod:`psflow.ps.replication.member`). ``generation``: the
    restore's (its ``BeginRestore``'s; 0: a first restore, none begun); None: not sent, not checked.
    ``restored_from`` and ``restored_from_step``: the checkpoint loaded and its own global_step (the manifest's; a
    restore within the run sets global_step past it, and ``restored_step`` with it), which the task keeps with its
    generation and names in ``Stats`` (:class:`~psflow.ps.protocol.StatsReply`); None: not sent.
    """

    METHOD: ClassVar[str] = "LoadShard"
    parts: Sequence[Any]
    arrays: Mapping[str, np.ndarray] = field(default_factory=dict)
    global_step: int | None = None
    positions: Mapping[str, str] | None = None
    examples: int | None = None
    lineage: str | None = None
    values_only: bool = False
    restored_step: int | None = None
    pushes_applied: int | None = None
    pushes_applied_by: list[list[Any]] | None = None
    reply_within_ms: int | None = None
    initializers: Mapping[str, Any] | None = None
    generation: int | None = None
    restored_from: str | None = None
    restored_from_step: int | None = None

    @classmethod
    def build(cls, values: Mapping[str, np.ndarray], slots: Mapping[str, Mapping[str, np.ndarray]],
              tables: Mapping[str, Mapping[str, np.ndarray]], parts: Sequence[str],
              built: Mapping[str, tuple[np.ndarray, Mapping[str, Any], Mapping[str, np.ndarray]]] | None = None,
              **fields: Any) -> LoadShardRequest:
        """A request for ``parts``: each static partition's value (and slots), each dynamic one's snapshot.
        ``built``: key -> (local rows, initializer spec, each slot's initial row) of the partitions whose value
        and slots hold only those rows (the others: their initial content, :mod:`psflow.ps.built_rows`)."""
        arrays = {_VALUE + key: value for key, value in values.items()}
        for key, (rows, _, initial) in (built or {}).items():
            arrays[_BUILT + key] = rows
            arrays.update({f"{_INITIAL}{key}/{slot}": row for slot, row in initial.items()})
        if built:
            fields["initializers"] = {key: dict(spec) for key, (_, spec, _) in built.items()}
        for key, named in slots.items():
            arrays.update({f"{_SLOT}{key}/{slot}": arr for slot, arr in named.items()})
        for key, named in tables.items():
            arrays.update({f"{_TABLE}{key}/{name}": arr for name, arr in named.items()})
        return cls(list(parts), arrays, **fields)

    def value(self, key: str) -> np.ndarray | None:
        """The value array sent for partition ``key`` (None: not sent)."""
        return self.arrays.get(_VALUE + key)

    def slots(self, key: str) -> dict[str, np.ndarray]:
        """The slot arrays sent for partition ``key``, by slot name."""
        prefix = f"{_SLOT}{key}/"
        return {n[len(prefix):]: a for n, a in self.arrays.items() if n.startswith(prefix)}

    def table(self, key: str) -> dict[str, np.ndarray]:
        """The snapshot arrays sent for the dynamic table partition ``key``, by snapshot name."""
        prefix = f"{_TABLE}{key}/"
        return {n[len(prefix):]: a for n, a in self.arrays.items() if n.startswith(prefix)}

    def built(self, key: str) -> tuple[np.ndarray, Any, dict[str, np.ndarray]] | None:
        """(local rows, initializer spec, each slot's initial row) of partition ``key`` sent as its saved rows
        only, or None (sent whole)."""
        rows = self.arrays.get(_BUILT + key)
        if rows is None:
            return None
        prefix = f"{_INITIAL}{key}/"
        initial = {n[len(prefix):]: a for n, a in self.arrays.items() if n.startswith(prefix)}
        return rows, (self.initializers or {}).get(key), initial

    def has_slots(self) -> bool:
        return any(n.startswith(_SLOT) for n in self.arrays)

    def to_frame(self) -> Frame:
        meta: dict[str, Any] = {"parts": list(self.parts), "restored_step": self.restored_step}
        if self.global_step is not None:
            meta.update(global_step=self.global_step, positions=self.positions, examples=self.examples)
        if self.lineage is not None:
            meta["lineage"] = self.lineage
        if self.values_only:
            meta["values_only"] = True
        if self.pushes_applied is not None:
            meta["pushes_applied"] = self.pushes_applied
        if self.pushes_applied_by is not None:
            meta["pushes_applied_by"] = self.pushes_applied_by
        if self.reply_within_ms is not None:
            meta["reply_within_ms"] = self.reply_within_ms
        if self.initializers:
            meta["initializers"] = dict(self.initializers)
        if self.generation is not None:
            meta["generation"] = self.generation
        if self.restored_from_step is not None:
            meta.update(restored_from=self.restored_from, restored_from_step=self.restored_from_step)
        return Frame(meta, dict(self.arrays))

    @classmethod
    def from_frame(cls, frame: Frame) -> LoadShardRequest:
        meta = frame.meta
        step = meta.get("global_step")
        if step is not None and (type(step) is not int or step < 0):
            raise InvalidRequest(f"global_step {step!r:.40} cannot be set on this task")
        restored = meta.get("restored_step", step)  # an odd value: the averages' step is unknown
        return cls(list_field(meta, "parts"), frame.arrays, step,
                   string_map(meta, "positions", "client names to reader position JSON"),
                   optional_int(meta, "examples", minimum=0), _lineage(meta, "lineage"), flag(meta, "values_only"),
                   restored if type(restored) is int and restored >= 0 else None,
                   optional_int(meta, "pushes_applied", minimum=0),
                   applied_by_process(meta.get("pushes_applied_by")),
                   optional_int(meta, "reply_within_ms", minimum=0), _initializers(meta),
                   optional_int(meta, "generation", minimum=0), optional_str(meta, "restored_from", max_length=4096),
                   optional_int(meta, "restored_from_step", minimum=0))


def _initializers(meta: Mapping[str, Any]) -> dict[str, Any] | None:
    """``initializers``: partition key -> initializer spec (an object), or None."""
    value = meta.get("initializers")
    if value is None:
        return None
    if not (isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items())):
        raise refuse("initializers", "partition keys to initializer specs", value)
    return dict(value)


@message
class LoadShardReply:
    loaded: int

    def to_frame(self) -> Frame:
        return Frame({"loaded": self.loaded})


# ---- SetReady / BeginRestore / ReaderPositions ------------------------------------------------------------
@message
class SetReadyRequest:
    """The chief finished initializing or restoring this task; after a restore, at ``generation``, the
    sync step starting over at ``global_step``."""

    METHOD: ClassVar[str] = "SetReady"
    client: str = "the chief"
    generation: int | None = None
    global_step: int | None = None

    def to_frame(self) -> Frame:
        meta: dict[str, Any] = {"client": self.client}
        if self.generation is not None:
            meta.update(generation=self.generation, global_step=self.global_step)
        return Frame(meta)

    @classmethod
    def from_frame(cls, frame: Frame) -> SetReadyRequest:
        meta = frame.meta
        step = optional_int(meta, "global_step", minimum=0)
        return cls(str(meta.get("client", "the chief")), optional_int(meta, "generation", minimum=0), step)


@message
class SetReadyReply:
    def to_frame(self) -> Frame:
        return Frame({"ready": True})


@message
class BeginRestoreRequest:
    """The chief is about to restore every ps task at ``generation`` (fenced by ``epoch``)."""

    METHOD: ClassVar[str] = "BeginRestore"
    generation: int
    epoch: int | None = None
    holder: str = ""

    def to_frame(self) -> Frame:
        meta: dict[str, Any] = {"generation": self.generation}
        if self.epoch is not None:
            meta.update(epoch=self.epoch, holder=self.holder)
        return Frame(meta)

    @classmethod
    def from_frame(cls, frame: Frame) -> BeginRestoreRequest:
        generation = frame.meta.get("generation")
        if type(generation) is not int or generation < 0:
            raise refuse("generation", "a non-negative integer", generation)
        return cls(generation, *_epoch(frame.meta))


@message
class BeginRestoreReply:
    global_step: int | None
    step_floor: int | None
    registered: bool
    drained: bool

    def to_frame(self) -> Frame:
        return Frame({"global_step": self.global_step, "step_floor": self.step_floor, "registered": self.registered,
                      "drained": self.drained})

    @classmethod
    def from_frame(cls, frame: Frame) -> BeginRestoreReply:
        meta = frame.meta
        return cls(optional_int(meta, "global_step"), optional_int(meta, "step_floor"), strict_bool(meta, "registered"),
                   strict_bool(meta, "drained"))


@message
class ReaderPositionsRequest:
    """Every worker's recorded reader position; with ``incarnation``, ``worker``'s process claims it first."""

    METHOD: ClassVar[str] = "ReaderPositions"
    worker: str | None = None
    incarnation: int | None = None

    def to_frame(self) -> Frame:
        return Frame({"worker": self.worker, "incarnation": self.incarnation})

    @classmethod
    def from_frame(cls, frame: Frame) -> ReaderPositionsRequest:
        worker, incarnation = frame.meta.get("worker"), frame.meta.get("incarnation")
        if incarnation is not None and (type(incarnation) is not int or incarnation < 0 or not isinstance(worker, str)):
            raise InvalidRequest(f"'incarnation' must be a non-negative integer sent with 'worker', got "
                                 f"{incarnation!r:.40} for {worker!r:.100}")
        return cls(worker if isinstance(worker, str) else None, incarnation)


@message
class ReaderPositionsReply:
    positions: Mapping[str, str]

    def to_frame(self) -> Frame:
        return Frame({"positions": dict(self.positions)})

    @classmethod
    def from_frame(cls, frame: Frame) -> ReaderPositionsReply:
        positions = frame.meta.get("positions") or {}
        if not isinstance(positions, dict):
            raise refuse("positions", "a mapping", positions)
        return cls({k: v for k, v in positions.items() if isinstance(k, str) and isinstance(v, str)})


# ---- CheckpointStatus -------------------------------------------------------------------------------------
@message
class SaveOutcome:
    """One save's outcome, as the chief reports it to the ledger. ``report_id``: the report's id, unique in the run
    (a resend after a failover carries the same, and the ledger counts it once); empty: counted each time."""

    saved: bool
    global_step: int | None = None
    path: str = ""
    error: str = ""
    writer: str = ""
    report_id: str = ""


@message
class CheckpointStatusRequest:
    """Reads the checkpoint ledger; sets its lineage if none is set; counts one save's outcome."""

    METHOD: ClassVar[str] = "CheckpointStatus"
    lineage_if_unset: str | None = None
    outcome: SaveOutcome | None = None

    def to_frame(self) -> Frame:
        meta: dict[str, Any] = {}
        if self.lineage_if_unset is not None:
            meta["lineage_if_unset"] = self.lineage_if_unset
        if self.outcome is not None:
            o = self.outcome
            meta["outcome"] = {"saved": o.saved, "global_step": o.global_step, "path": o.path, "error": o.error,
                               "writer": o.writer, **({"report_id": o.report_id} if o.report_id else {})}
        return Frame(meta)

    @classmethod
    def from_frame(cls, frame: Frame) -> CheckpointStatusRequest:
        outcome = frame.meta.get("outcome")
        parsed = None
        if outcome is not None:
            if not isinstance(outcome, dict) or type(outcome.get("saved")) is not bool:
                raise InvalidRequest("outcome must be {saved: bool, global_step, path, error, writer}")
            step = outcome.get("global_step")
            parsed = SaveOutcome(outcome["saved"], step if type(step) is int else None,
                                 str(outcome.get("path", ""))[:1000], str(outcome.get("error", ""))[:2000],
                                 str(outcome.get("writer", ""))[:200], str(outcome.get("report_id", ""))[:200])
        return cls(_lineage(frame.meta, "lineage_if_unset"), parsed)


@message
class CheckpointStatusReply:
    """The ledger: the lineage, the save counts, the newest saved step and path, the newest failures
    (each ``{seq, global_step, error, writer, time}``)."""

    lineage: str | None
    saved: int = 0
    failed: int = 0
    failed_in_a_row: int = 0
    last_saved_step: int | None = None
    last_saved_path: str | None = None
    failures: Sequence[Mapping[str, Any]] = ()

    def as_dict(self) -> dict[str, Any]:
        return {"lineage": self.lineage, "saved": self.saved, "failed": self.failed,
                "failed_in_a_row": self.failed_in_a_row, "last_saved_step": self.last_saved_step,
                "last_saved_path": self.last_saved_path, "failures": [dict(f) for f in self.failures]}

    def to_frame(self) -> Frame:
        return Frame(self.as_dict())

    @classmethod
    def from_frame(cls, frame: Frame) -> CheckpointStatusReply:
        meta = frame.meta
        failures = meta.get("failures") or []
        if not (isinstance(failures, list) and all(isinstance(f, dict) for f in failures)):
            raise refuse("failures", "a list of records", failures)
        return cls(optional_str(meta, "lineage"), optional_int(meta, "saved") or 0, optional_int(meta, "failed") or 0,
                   optional_int(meta, "failed_in_a_row") or 0, optional_int(meta, "last_saved_step"),
                   optional_str(meta, "last_saved_path"), failures)
