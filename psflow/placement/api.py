"""Placement data types: variable definitions, partitions, layouts, routing.

A :class:`VariableDef` says what a variable is (name, shape, dtype, opaque
initializer and optimizer configs). A :class:`VariablePlacement` says where it
lives: one :class:`Partition` per contiguous range of rows along axis 0, each
on one ps task. An unpartitioned variable has a single partition holding all
rows.

Rows split as TensorFlow splits partitioned variables: ``n`` partitions of
``d`` rows give the first ``d % n`` partitions ``d // n + 1`` rows and the
rest ``d // n`` (:func:`split_rows`). Partition ``i`` of variable ``w`` is
stored as ``w/part_i``.

``layout.py`` compares two layouts built from these types.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from psflow.errors import PsflowError
from psflow.native.ids import scan_ids
from psflow.placement.hashing import owner_of

__all__ = [
    "DTYPE_SIZES",
    "LayoutMismatchError",
    "Partition",
    "Partitioner",
    "PlacementError",
    "PlacementStrategy",
    "RoutedRows",
    "VariableDef",
    "VariableLike",
    "VariablePlacement",
    "placements_from_json",
    "placements_to_json",
    "split_rows",
]

#: Bytes per element of each dtype a variable may have.
DTYPE_SIZES: Mapping[str, int] = MappingProxyType(
    {
        "bool": 1,
        "int8": 1,
        "uint8": 1,
        "int16": 2,
        "uint16": 2,
        "float16": 2,
        "bfloat16": 2,
        "int32": 4,
        "uint32": 4,
        "float32": 4,
        "int64": 8,
        "uint64": 8,
        "float64": 8,
        "complex64": 8,
        "complex128": 16,
    }
)

# TensorFlow's op-name rule, with '/' as the scope separator.
_VAR_NAME_RE = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\-]*(/[A-Za-z0-9_.\-]+)*\Z")


class PlacementError(PsflowError, ValueError):
    """A variable cannot be defined, placed or routed as asked."""


class LayoutMismatchError(PlacementError):
    """Two clients computed different layouts for the same model."""


class VariableLike(Protocol):
    """What a :data:`PlacementStrategy` may look at."""

    @property
    def name(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> str: ...

    @property
    def nbytes(self) -> int: ...


#: Chooses the ps task (``0 <= task < num_ps_tasks``) for one variable or one
#: partition. May keep state (round-robin does), so a layout depends on the
#: order of the calls.
PlacementStrategy = Callable[[VariableLike], int]

#: TensorFlow partitioner: ``(shape, dtype) -> partitions per axis``.
Partitioner = Callable[[tuple[int, ...], str], list[int]]


def _json_copy(value: object, what: str) -> Any:
    """Deep copy through JSON, so the value is JSON-able and round-trips equal."""
    try:
        return json.loads(json.dumps(value, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as e:
        raise PlacementError(f"{what} must be JSON-serializable: {e}") from e


def _check_int(value: object, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise PlacementError(f"{what} must be an int, got {value!r}")
    if value < minimum:
        raise PlacementError(f"{what} must be >= {minimum}, got {value}")
    return int(value)


def _zeros() -> Mapping[str, object]:
    return MappingProxyType({"name": "zeros"})


@dataclass(frozen=True)
class VariableDef:
    """What a variable is, independent of where it lives.

    Attributes:
        name: Variable name, TensorFlow style: ``dense/kernel``.
        shape: Dimensions, each ``>= 0``; a list is stored as a tuple.
        dtype: One of :data:`DTYPE_SIZES`.
        initializer: Opaque JSON-able config, passed through to the ps
            (default ``{"name": "zeros"}``).
        optimizer: Opaque JSON-able optimizer config for this variable, or
            ``None`` to use the model's optimizer.
        trainable: Whether gradients are pushed for it.
        dynamic: ``None`` (a static variable), or the options of a *dynamic
            table* (:mod:`psflow.ps.dynamic`): rows keyed by any int64 id,
            created on first use and evicted, spread over the ps tasks by
            :func:`psflow.ps.dynamic.owner_of`. Its shape is ``(0, dim)`` (it
            has no row count); the options (``capacity_rows``,
            ``capacity_bytes``, ``admit_after``, ``admit_probability``,
            ``ttl_steps``, ``policy``, ...) are the whole table's, checked by
            the ps tasks (:func:`psflow.ps.dynamic.share_spec`).
        moving_average_decay: ``None`` (not averaged), or the decay in (0, 1]
            of a moving average the ps tasks keep of it after every step
            (:mod:`psflow.ps.averages`); only a trainable static variable.

    Raises:
        PlacementError: On construction with an invalid field; the message
            names the variable.
    """

    name: str
    shape: tuple[int, ...]
    _: KW_ONLY
    dtype: str = "float32"
    initializer: Mapping[str, object] = field(default_factory=_zeros, hash=False)
    optimizer: Mapping[str, object] | None = field(default=None, hash=False)
    trainable: bool = True
    dynamic: Mapping[str, object] | None = field(default=None, hash=False)
    moving_average_decay: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _VAR_NAME_RE.match(self.name):
            raise PlacementError(f"invalid variable name {self.name!r}: expected TensorFlow-style names such as 'dense/kernel'")
        what = f"variable {self.name!r}"
        if isinstance(self.shape, (str, bytes)) or not isinstance(self.shape, Sequence):
            raise PlacementError(f"{what}: shape must be a tuple of ints")
        shape = tuple(_check_int(d, f"{what}: shape dimension") for d in self.shape)
        object.__setattr__(self, "shape", shape)
        if self.dtype not in DTYPE_SIZES:
            raise PlacementError(f"{what}: unsupported dtype {self.dtype!r} (supported: {', '.join(DTYPE_SIZES)})")
        for key in ("initializer", "optimizer", "dynamic"):
            value = getattr(self, key)
            if value is None and key in ("optimizer", "dynamic"):
                continue
            if not isinstance(value, Mapping):
                raise PlacementError(f"{what}: {key} must be a mapping, got {value!r}")
            copy = _json_copy(dict(value), f"{what}: {key}")
            object.__setattr__(self, key, MappingProxyType(copy))
        if not isinstance(self.trainable, bool):
            raise PlacementError(f"{what}: trainable must be a bool, got {self.trainable!r}")
        if self.dynamic is not None and (len(self.shape) != 2 or self.shape[0] != 0 or self.shape[1] < 1
                                         or self.dtype != "float32"):
            raise PlacementError(f"{what}: a dynamic table has shape (0, dim) with dim >= 1 and dtype float32 "
                                 f"(its rows are created by id), got shape {self.shape} ({self.dtype})")
        self._check_average(what)

    def _check_average(self, what: str) -> None:
        decay = self.moving_average_decay
        if decay is None:
            return
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay <= 1.0:
            raise PlacementError(f"{what}: moving_average_decay must be a number in (0, 1], got {decay!r}")
        if not self.trainable or self.dynamic is not None:
            raise PlacementError(f"{what}: only a trainable static variable has a moving average "
                                 f"({'a dynamic table' if self.dynamic is not None else 'not trainable'})")
        object.__setattr__(self, "moving_average_decay", float(decay))

    @property
    def nbytes(self) -> int:
        """Size of the whole variable in bytes."""
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_dict` inverts it exactly."""
        return {
            "name": self.name,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "initializer": dict(self.initializer),
            "optimizer": None if self.optimizer is None else dict(self.optimizer),
            "trainable": self.trainable,
            **({"dynamic": dict(self.dynamic)} if self.dynamic is not None else {}),
            **({"moving_average_decay": self.moving_average_decay} if self.moving_average_decay is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VariableDef:
        """Builds a definition from :meth:`to_dict` output.

        Raises:
            PlacementError: If a key is missing or a value is invalid.
        """
        _require_keys(data, ("name", "shape"), "variable definition")
        return cls(
            data["name"],
            _as_shape(data["shape"], data["name"]),
            dtype=data.get("dtype", "float32"),
            initializer=data.get("initializer", {"name": "zeros"}),
            optimizer=data.get("optimizer"),
            trainable=data.get("trainable", True),
            dynamic=data.get("dynamic"),
            moving_average_decay=data.get("moving_average_decay"),
        )


def _require_keys(data: object, keys: Sequence[str], what: str) -> None:
    if not isinstance(data, Mapping):
        raise PlacementError(f"{what} must be an object, got {data!r}")
    missing = [k for k in keys if k not in data]
    if missing:
        raise PlacementError(f"{what} is missing {', '.join(map(repr, missing))}")


def _as_shape(value: object, name: object) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise PlacementError(f"variable {name!r}: shape must be a list, got {value!r}")
    return tuple(value)


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
    num_rows = _check_int(num_rows, "number of rows")
    num_partitions = _check_int(num_partitions, "number of partitions", minimum=1)
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
            value = _check_int(getattr(self, key), f"partition {key}")
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
        _require_keys(data, ("var", "partitions"), "variable placement")
        var = VariableDef.from_dict(data["var"])
        raw = data["partitions"]
        if not isinstance(raw, list):
            raise PlacementError(f"variable {var.name!r}: 'partitions' must be a list, got {raw!r}")
        keys = ("index", "task", "row_start", "row_stop")
        parts = []
        for p in raw:
            _require_keys(p, keys, f"partition of variable {var.name!r}")
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
