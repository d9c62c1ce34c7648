"""A dynamic table's options and counters, and its error type.

:class:`DynamicTableSpec` checks every option on construction, so a table is
never built from an invalid spec; :class:`DynamicTableStats` is a plain copy
of a table's counters. Every error of this package is a
:class:`DynamicTableError` (a :class:`StoreError`; both defined in :mod:`psflow.errors`, as
:func:`~psflow.placement.hashing.owner_of` below the ps raises it too) whose message names the table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from psflow.errors import DynamicTableError
from psflow.optim import OptimizerSpec
from psflow.ps.initializers import validate_initializer

__all__ = ["EVICTION_POLICIES", "OPTIONS", "BoolArray", "DynamicTableError", "DynamicTableSpec", "DynamicTableStats",
           "FloatArray", "share_spec", "table_totals"]

#: A table's rows and a mask over its ids (ids themselves are :data:`psflow.placement.hashing.IdArray`).
FloatArray = npt.NDArray[np.float32]
BoolArray = npt.NDArray[np.bool_]

EVICTION_POLICIES = ("lfu", "lru")


def _int_option(table: str, key: str, value: object, low: int, *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DynamicTableError(f"dynamic table {table!r}: {key} must be an int >= {low}, got {value!r}")


@dataclass(frozen=True)
class DynamicTableSpec:
    """A dynamic table's options, checked on construction (errors name the table).

    Attributes:
        name: the variable's name. dim: values per row (>= 1).
        optimizer: its optimizer, or None (not trainable).
        initializer: an initializer spec of psflow.ps.initializers (not glorot_uniform).
        admit_after: admit an id at its N-th sighting (N >= 1); None or 1 admits all.
        admit_probability: admit at each sighting with probability p in (0, 1].
        ttl_steps: drop rows unused for more than T global steps (:meth:`DynamicTable.evict`).
        capacity_rows, capacity_bytes: row limit of this table share, in rows
            and/or in bytes of rows, slots, per-row metadata and index.
        policy: ``"lfu"`` or ``"lru"``: which rows the capacity evicts.
        seed: seeds admission by probability and eviction sampling.
        sketch_width, sketch_depth: the admission sketch (4 bytes per counter; default 4 MiB).
        eviction_sample: sampled candidates per evicted row (>= 1).
        ttl_scan_rows: slots one :meth:`DynamicTable.evict` call scans at most.
        initial_rows: rows allocated up front.
    """

    name: str
    dim: int
    optimizer: OptimizerSpec | None = None
    initializer: Mapping[str, Any] = field(default_factory=lambda: {"name": "zeros"}, hash=False)
    admit_after: int | None = None
    admit_probability: float | None = None
    ttl_steps: int | None = None
    capacity_rows: int | None = None
    capacity_bytes: int | None = None
    policy: str = "lfu"
    seed: int = 0
    sketch_width: int = 1 << 18
    sketch_depth: int = 4
    eviction_sample: int = 8
    ttl_scan_rows: int = 1 << 16
    initial_rows: int = 1024

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise DynamicTableError(f"dynamic table name must be a non-empty string, got {self.name!r}")
        table = self.name
        for key, low in (("dim", 1), ("seed", 0), ("sketch_depth", 1), ("eviction_sample", 1),
                         ("ttl_scan_rows", 1), ("initial_rows", 1)):
            _int_option(table, key, getattr(self, key), low, optional=False)
        for key in ("admit_after", "ttl_steps", "capacity_rows", "capacity_bytes"):
            _int_option(table, key, getattr(self, key), 1)
        if self.sketch_width < 1 or self.sketch_width & (self.sketch_width - 1):
            raise DynamicTableError(f"dynamic table {table!r}: sketch_width must be a power of two, got {self.sketch_width!r}")
        p = self.admit_probability
        if p is not None and (isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0):
            raise DynamicTableError(f"dynamic table {table!r}: admit_probability must be in (0, 1], got {p!r}")
        if p is not None and self.admit_after is not None:
            raise DynamicTableError(f"dynamic table {table!r}: give admit_after or admit_probability, not both")
        if self.policy not in EVICTION_POLICIES:
            raise DynamicTableError(f"dynamic table {table!r}: policy must be one of {EVICTION_POLICIES}, got {self.policy!r}")
        if self.optimizer is not None and not isinstance(self.optimizer, OptimizerSpec):
            raise DynamicTableError(f"dynamic table {table!r}: optimizer must be an OptimizerSpec, got {self.optimizer!r}")
        try:
            init = validate_initializer(self.initializer)
        except ValueError as e:
            raise DynamicTableError(f"dynamic table {table!r}: {e}") from e
        if init["name"] == "glorot_uniform":
            raise DynamicTableError(f"dynamic table {table!r}: glorot_uniform needs a row count; a dynamic table has none")
        object.__setattr__(self, "initializer", init)

    def to_json(self) -> dict[str, Any]:
        """Every field; the optimizer as :meth:`OptimizerSpec.to_json`. ``from_json`` reads it back."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["optimizer"] = self.optimizer.to_json() if self.optimizer is not None else None
        out["initializer"] = dict(self.initializer)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DynamicTableSpec:
        """Raises DynamicTableError on unknown keys or invalid values (OptimizerError for the optimizer)."""
        known = {f.name for f in fields(cls)}
        extra = sorted(str(key) for key in data if key not in known)
        if extra:
            raise DynamicTableError(f"dynamic table {data.get('name')!r}: unknown keys {extra}")
        given = dict(data)
        if given.get("optimizer") is not None:
            given["optimizer"] = OptimizerSpec.from_json(given["optimizer"])
        return cls(**given)


@dataclass(frozen=True)
class DynamicTableStats:
    """Counters since the table was created (lookups and gradients count id occurrences)."""

    rows: int
    row_limit: int
    admitted: int  # rows created
    rejected_lookups: int  # ids a creating lookup returned as zeros (not admitted)
    absent_reads: int  # ids a read-only lookup (create=False) returned as zeros
    dropped_gradients: int  # gradient rows of ids without a row
    evicted_ttl: int
    evicted_capacity: int
    index_rebuilds: int
    memory_bytes: int
    sketch_bytes: int


#: The options a dynamic table variable may carry (``VariableDef.dynamic``): every spec field but those the variable gives.
OPTIONS = tuple(f.name for f in fields(DynamicTableSpec) if f.name not in ("name", "dim", "optimizer", "initializer"))


def share_spec(name: str, dim: int, options: Mapping[str, Any], *, optimizer: OptimizerSpec | None,
               initializer: Mapping[str, Any], num_shares: int) -> DynamicTableSpec:
    """The spec of one ps task's share of dynamic table ``name`` spread over ``num_shares`` tasks.

    ``options`` are the whole table's (:data:`OPTIONS`): ``capacity_rows`` and
    ``capacity_bytes`` are divided evenly, rounded up (ids spread evenly by
    :func:`owner_of`), the others apply to every share as given.

    Raises:
        DynamicTableError: an unknown option or an invalid value (names the table).
    """
    extra = sorted(str(key) for key in options if key not in OPTIONS)
    if extra:
        raise DynamicTableError(f"dynamic table {name!r}: unknown options {extra} (known: {', '.join(OPTIONS)})")
    given = dict(options)
    for key in ("capacity_rows", "capacity_bytes"):
        value = given.get(key)
        _int_option(name, key, value, 1)
        if value is not None:
            given[key] = -(-int(value) // num_shares)
    return DynamicTableSpec(name=name, dim=dim, optimizer=optimizer, initializer=dict(initializer), **given)


def table_totals(ps_stats: Sequence[Mapping[str, Any]], *, tables: Sequence[str] = ()) -> dict[str, dict[str, Any]]:
    """Each dynamic table's counters summed over its shares, by variable name, from the ps tasks' ``Stats`` replies.

    ``row_limit`` and ``memory_bytes`` are sums too (the whole table's). Every dynamic table spans every ps task
    (:func:`~psflow.placement.hashing.owner_of` spreads its ids over all of them), so a task not read (its
    stand-in: an ``error`` and no ``dynamic_tables``; exited, not answering, or a replicated shard none of whose
    members answered) held a share of each table: each table's counters are then None (not known: summed over the
    shares read they would be short by that share's, as if complete) and ``shares_unread`` names each such task
    (``task``, ``error``). So does a task that answered not ready with no share (a ps task killed after training
    and started again empty, which nobody restores; no ``error``): its share is not known, not zero. A ready task
    with no share held none (a table pinned to another ps task: :mod:`psflow.placement.device_setter`).

    ``tables``: the run's dynamic tables (the model's variables with ``dynamic`` options). Where some task is not
    read, each one no reply names (every task unread: ``--ps 1`` with that task lost; or one pinned to an unread
    task) is reported too, each :class:`DynamicTableStats` counter None, with ``shares_unread``: never left out.
    Where every task is read, they add nothing (a declared table every ready task holds no share of is not guessed).
    """
    totals: dict[str, dict[str, Any]] = {}
    unread = [{"task": stats.get("task"), "error": _why_unread(stats)} for stats in ps_stats
              if "dynamic_tables" not in stats and (stats.get("error") is not None or not stats.get("ready"))]
    for stats in ps_stats:
        for key, counters in (stats.get("dynamic_tables") or {}).items():
            table = totals.setdefault(str(key).rsplit("/part_", 1)[0], {})
            for name, value in counters.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    table[name] = table.get(name, 0) + value
    if unread:
        for name in tables:
            totals.setdefault(name, dict.fromkeys(f.name for f in fields(DynamicTableStats)))
        totals = {name: {**dict.fromkeys(table), "shares_unread": unread} for name, table in totals.items()}
    return totals


def _why_unread(stats: Mapping[str, Any]) -> str:
    """Why a ps task not ready (or its stand-in) names no share of the dynamic tables (a clause of
    :func:`table_totals`' ``shares_unread``)."""
    if stats.get("error") is not None:
        return str(stats["error"])
    return "not ready, holding no share: restarted empty and not restored"
