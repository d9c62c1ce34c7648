"""Placement data types: what a variable is, what a strategy sees, and the errors.

A :class:`VariableDef` says what a variable is (name, shape, dtype, opaque
initializer and optimizer configs, a dynamic table's options). A
:data:`PlacementStrategy` sees a :class:`VariableLike` and picks its ps task;
a :data:`Partitioner` says how many partitions a variable gets.

Where the rows then live (:class:`~psflow.placement.assignment.Partition`,
:class:`~psflow.placement.assignment.VariablePlacement` and its routing) is
``assignment.py``; ``layout.py`` compares two layouts built from these types.
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

from psflow.errors import PsflowError

__all__ = [
    "DTYPE_SIZES",
    "LayoutMismatchError",
    "Partitioner",
    "PlacementError",
    "PlacementStrategy",
    "VariableDef",
    "VariableLike",
    "check_int",
    "require_keys",
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


def check_int(value: object, what: str, *, minimum: int = 0) -> int:
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
        shape = tuple(check_int(d, f"{what}: shape dimension") for d in self.shape)
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
        require_keys(data, ("name", "shape"), "variable definition")
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


def require_keys(data: object, keys: Sequence[str], what: str) -> None:
    if not isinstance(data, Mapping):
        raise PlacementError(f"{what} must be an object, got {data!r}")
    missing = [k for k in keys if k not in data]
    if missing:
        raise PlacementError(f"{what} is missing {', '.join(map(repr, missing))}")


def _as_shape(value: object, name: object) -> tuple[int, ...]:
    if not isinstance(value, (list, tuple)):
        raise PlacementError(f"variable {name!r}: shape must be a list, got {value!r}")
    return tuple(value)
