"""Where each row of a variable lives: partitions, a variable's placement, and the routing of ids.

A :class:`VariablePlacement` says where a :class:`~psflow.placement.api.VariableDef`
lives: one :class:`Partition` per contiguous range of rows along axis 0, each
on one ps task. An unpartitioned variable has a single partition holding all
rows; a dynamic table one partition per ps task, its ids routed by
:func:`~psflow.placement.hashing.owner_of`.

Rows split as TensorFlow splits partitioned variables: ``n`` partitions of
``d`` rows give the first ``d % n`` partitions ``d // n + 1`` rows and the
rest ``d // n`` (:func:`split_rows`). Partition ``i`` of variable ``w`` is
stored as ``w/part_i``.

:meth:`VariablePlacement.route` runs per variable per lookup: it copies no ids
where one partition holds them all, and returns read-only arrays.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from psflow.native.ids import scan_ids
from psflow.placement.api import PlacementError, VariableDef, check_int, require_keys
from psflow.placement.hashing import owner_of

__all__ = [
    "Partition",
    "RoutedRows",
    "VariablePlacement",
    "placements_from_json",
    "placements_to_json",
    "split_rows",
]


def split_rows(num_rows: int, num_partitions: int) -> list[tuple[int, int]]:
    """Splits ``num_rows`` rows into ``num_partitions`` contiguous ranges.

    As TensorFlow does: the first ``num_rows % num_partitions`` ranges get one
    row more than the others.

    Example:
        >>> split_rows(10, 3)
        [(0, 4), (4, 7), (7, 10)]

    Returns:
        ``[(row_start, row_stop), ...]``, ascending and covering
        ``[0, num_rows)``.

    Raises:
        PlacementError: If ``num_partitions < 1`` or, with more than one
            partition, ``num_partitions > num_rows``.
    """
    num_rows = check_int(num_rows, "number of rows")
    num_partitions = check_int(num_partitions, "number of partitions", minimum=1)
    if num_partitions > 1 and num_partitions > num_rows:
        raise PlacementError(f"cannot split {num_rows} rows into {num_partitions} partitions")
    base, extra = divmod(num_rows, num_partitions)
    ranges = []
    start = 0
    for i in range(num_partitions):
        stop = start + base + (1 if i < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


@dataclass(frozen=True)
class Partition:
    """One contiguous row range ``[row_start, row_stop)`` of a variable.

    Attributes:
        index: Position of the partition in its variable, from 0.
        task: Index of the ps task that holds it.
        row_start: First row (axis 0) held.
        row_stop: One past the last row held.
    """

    index: int
    task: int
    row_start: int
    row_stop: int

    def __post_init__(self) -> None:
        for key in ("index", "task", "row_start", "row_stop"):
            value = check_int(getattr(self, key), f"partition {key}")
            object.__setattr__(self, key, value)
        if self.row_stop < self.row_start:
            raise PlacementError(f"partition {self.index}: row_stop {self.row_stop} < row_start {self.row_start}")

    @property
    def num_rows(self) -> int:
        """Number of rows held."""
        return self.row_stop - self.row_start

    def name(self, var_name: str) -> str:
        """Storage name of this partition, TensorFlow style: ``w/part_0``."""
        return f"{var_name}/part_{self.index}"


@dataclass(frozen=True, eq=False)
class RoutedRows:
    """The ids of one lookup that fall in one partition.

    Attributes:
        partition: Index of the partition.
        task: ps task holding it.
        positions: Where these ids are in the looked-up array (ascending), so
            ``out[positions] = fetched`` scatters results back.
        local_rows: ``ids[positions] - row_start``: rows within the partition.

    Both arrays are read-only.
    """

    partition: int
    task: int
    positions: npt.NDArray[np.intp]
    local_rows: npt.NDArray[np.int64]


@dataclass(frozen=True)
class VariablePlacement:
    """Where each row of a variable lives.

    Guarantees checked on construction: partitions are numbered ``0..n-1`` in
    order, are contiguous, cover rows ``[0, shape[0])`` (one row for a
    scalar), and, when there are several, each holds at least one row.

    Attributes:
        var: The variable.
        partitions: Its partitions, by index.

    Raises:
        PlacementError: On construction, if the partitions break a rule above.
    """

    var: VariableDef
    partitions: tuple[Partition, ...]
    _starts: npt.NDArray[np.int64] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = tuple(self.partitions)
        object.__setattr__(self, "partitions", parts)
        what = f"variable {self.var.name!r}"
        if not parts:
            raise PlacementError(f"{what}: a placement needs at least one partition")
        if self.var.dynamic is not None:
            tasks = [p.task for p in parts]
            if any(p.index != i or p.row_start or p.row_stop for i, p in enumerate(parts)) or len(set(tasks)) != len(tasks):
                raise PlacementError(f"{what}: a dynamic table has partitions 0..n-1 on distinct ps tasks and no row "
                                     f"ranges (ids are routed by owner_of), got {parts}")
            object.__setattr__(self, "_starts", np.zeros(len(parts), dtype=np.int64))
            return
        expected_start = 0
        for i, part in enumerate(parts):
            if part.index != i or part.row_start != expected_start:
                raise PlacementError(
                    f"{what}: partition {part.index} at position {i} starts at "
                    f"row {part.row_start}; expected partition {i} starting at "
                    f"row {expected_start}"
                )
            if len(parts) > 1 and part.num_rows == 0:
                raise PlacementError(f"{what}: partition {i} holds no rows")
            expected_start = part.row_stop
        if expected_start != self.num_rows:
            raise PlacementError(f"{what}: partitions cover rows [0, {expected_start}), the variable has {self.num_rows}")
        if len(parts) > 1 and not self.var.shape:
            raise PlacementError(f"{what}: a scalar cannot be partitioned")
        starts = np.array([p.row_start for p in parts], dtype=np.int64)
        starts.flags.writeable = False
        object.__setattr__(self, "_starts", starts)

    @property
    def num_rows(self) -> int:
        """Rows along axis 0 (1 for a scalar)."""
        return self.var.shape[0] if self.var.shape else 1

    @property
    def is_partitioned(self) -> bool:
        """True when the variable has more than one partition."""
        return len(self.partitions) > 1

    @property
    def is_dynamic(self) -> bool:
        """True for a dynamic table (rows keyed by id; see :attr:`VariableDef.dynamic`)."""
        return self.var.dynamic is not None

    def storage_names(self) -> tuple[str, ...]:
        """Names the partitions are stored under: ``("w",)`` or
        ``("w/part_0", "w/part_1", ...)``."""
        if not self.is_partitioned:
            return (self.var.name,)
        return tuple(p.name(self.var.name) for p in self.partitions)

    def partition_shape(self, index: int) -> tuple[int, ...]:
        """Shape of partition ``index``: its rows, then the other dimensions."""
        if not self.var.shape:
            return ()
        return (self.partitions[index].num_rows, *self.var.shape[1:])

    def route(self, ids: npt.ArrayLike) -> list[RoutedRows]:
        """Groups row ids by the partition holding them.

        Vectorized: one ``np.searchsorted`` over partition starts plus a
        stable sort. Partitions holding none of the ids are left out; the
        result is ordered by partition index.

        Args:
            ids: 1-D array of integer row ids (duplicates allowed).

        Returns:
            One :class:`RoutedRows` per partition touched.

        Raises:
            PlacementError: If ``ids`` is not a 1-D integer array, or an id is
                ``< 0`` or ``>= shape[0]``; the message names the variable,
                the id and its position.
        """
        if not self.var.shape:
            raise PlacementError(f"variable {self.var.name!r} is a scalar and has no rows to route")
        arr = np.asarray(ids)
        if arr.ndim != 1 or (arr.dtype.kind not in "iu" and arr.size):
            raise PlacementError(f"variable {self.var.name!r}: ids must be a 1-D integer array, got shape {arr.shape} "
                                 f"dtype {arr.dtype}")
        if arr.size == 0:
            return []
        if self.is_dynamic:
            return self._route_dynamic(arr)
        rows = arr.astype(np.int64, copy=False)
        pos, _ = scan_ids(rows, self.num_rows)
        if pos >= 0:
            raise PlacementError(f"variable {self.var.name!r}: id {int(arr[pos])} at position {pos} is out of range "
                                 f"[0, {self.num_rows})")
        if not self.is_partitioned:
            # Every id, in order: read-only views, no copies (this runs per variable per step).
            return [_routed(self.partitions[0], _positions(rows.size), rows.view())]
        owner = np.searchsorted(self._starts, rows, side="right") - 1
        # 16-bit keys make numpy's stable sort a radix sort.
        key = owner.astype(np.uint16) if len(self.partitions) <= 1 << 16 else owner
        order = np.argsort(key, kind="stable")
        bounds = np.cumsum(np.bincount(owner, minlength=len(self.partitions)))
        result = []
        start = 0
        for part, stop in zip(self.partitions, bounds.tolist(), strict=True):
            if stop > start:
                positions = order[start:stop]
                result.append(_routed(part, positions, rows[positions] - part.row_start))
            start = stop
        return result

    def _route_dynamic(self, arr: npt.NDArray[Any]) -> list[RoutedRows]:
        """A dynamic table's ids by owning partition (:func:`owner_of`); ``local_rows`` are the ids themselves."""
        if arr.dtype != np.int64:
            raise PlacementError(f"dynamic table {self.var.name!r}: ids must be int64 (any value), got {arr.dtype}")
        if len(self.partitions) == 1:
            return [_routed(self.partitions[0], _positions(arr.size), arr.view())]
        owner = owner_of(arr, len(self.partitions))
        order = np.argsort(owner.astype(np.uint16), kind="stable")
        bounds = np.cumsum(np.bincount(owner, minlength=len(self.partitions)))
        result, start = [], 0
        for part, stop in zip(self.partitions, bounds.tolist(), strict=True):
            if stop > start:
                positions = order[start:stop]
                result.append(_routed(part, positions, arr[positions]))
            start = stop
        return result

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_dict` inverts it exactly."""
        return {
            "var": self.var.to_dict(),
            "partitions": [
                {
                    "index": p.index,
                    "task": p.task,
                    "row_start": p.row_start,
                    "row_stop": p.row_stop,
                }
                for p in self.partitions
            ],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VariablePlacement:
        """Builds a placement from :meth:`to_dict` output.

        Raises:
            PlacementError: If the data is malformed or breaks a placement rule.
        """
        require_keys(data, ("var", "partitions"), "variable placement")
        var = VariableDef.from_dict(data["var"])
        raw = data["partitions"]
        if not isinstance(raw, list):
            raise PlacementError(f"variable {var.name!r}: 'partitions' must be a list, got {raw!r}")
        keys = ("index", "task", "row_start", "row_stop")
        parts = []
        for p in raw:
            require_keys(p, keys, f"partition of variable {var.name!r}")
            parts.append(Partition(*(p[k] for k in keys)))
        return cls(var, tuple(parts))

    def to_json(self) -> str:
        """Deterministic JSON (sorted keys, compact): equal placements give
        equal text."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> VariablePlacement:
        """Parses :meth:`to_json` output.

        Raises:
            PlacementError: If the text is not JSON or is malformed.
        """
        return cls.from_dict(_loads(text, "variable placement"))


_ARANGE = np.arange(1 << 16, dtype=np.intp)
_ARANGE.flags.writeable = False


def _positions(n: int) -> npt.NDArray[np.intp]:
    """``arange(n)``, read-only; a view of a shared array up to 65,536."""
    return _ARANGE[:n] if n <= _ARANGE.size else np.arange(n, dtype=np.intp)


def _routed(part: Partition, positions: npt.NDArray[np.intp], local: npt.NDArray[np.int64]) -> RoutedRows:
    positions.flags.writeable = False
    local.flags.writeable = False
    return RoutedRows(part.index, part.task, positions, local)


def _loads(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PlacementError(f"{what} is not valid JSON: {e}") from e


def placements_to_json(placements: Sequence[VariablePlacement]) -> str:
    """Deterministic JSON list of placements, in the given order."""
    return json.dumps([p.to_dict() for p in placements], sort_keys=True, separators=(",", ":"))


def placements_from_json(text: str) -> tuple[VariablePlacement, ...]:
    """Parses :func:`placements_to_json` (or ``VariableSet.to_json``) output.

    Raises:
        PlacementError: If the text is not a JSON list of valid placements.
    """
    data = _loads(text, "placement list")
    if not isinstance(data, list):
        raise PlacementError(f"placement list must be a JSON list, got {data!r}")
    return tuple(VariablePlacement.from_dict(d) for d in data)
