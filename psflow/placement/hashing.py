"""Ids: their array types, their validation, the 64-bit mix, and which ps task owns each.

Everything here is integer arithmetic mod 2**64 on numpy arrays, with no seed
and no Python ``hash``, so every process on every platform computes the same
values. :func:`mix64` is a bijection of 64-bit values; a dynamic table's sketch,
id index and initial rows (``psflow.ps.dynamic``) all derive their hashes from it.

:func:`owner_of` is placement's: :class:`~psflow.placement.assignment.VariablePlacement`
routes a dynamic table's ids by it, and the ps tasks split and re-split their
shares by it. It lives below both, so placement imports nothing of the ps. Bad
ids or a bad ``num_ps`` raise :class:`~psflow.errors.DynamicTableError` (as they
did when this module was ``psflow.ps.dynamic.hashing``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from psflow.errors import DynamicTableError

__all__ = [
    "GAMMA",
    "IdArray",
    "U64Array",
    "check_ids",
    "finalize",
    "mix64",
    "owner_of",
]

IdArray = npt.NDArray[np.int64]
U64Array = npt.NDArray[np.uint64]

#: splitmix64's increment (2**64 / golden ratio, odd).
GAMMA = np.uint64(0x9E3779B97F4A7C15)


def finalize(z: U64Array) -> U64Array:
    """splitmix64's output function, elementwise mod 2**64."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    out: U64Array = z ^ (z >> np.uint64(31))
    return out


def mix64(x: U64Array) -> U64Array:
    """splitmix64 of state ``x``: ``finalize(x + 0x9E3779B97F4A7C15)``; a bijection of 64-bit values."""
    return finalize(x + GAMMA)


def check_ids(ids: object, where: str) -> IdArray:
    """``ids`` itself if it is a 1-D int64 numpy array; else DynamicTableError, prefixed with ``where``."""
    if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
        kind = f"{ids.dtype} array of shape {ids.shape}" if isinstance(ids, np.ndarray) else type(ids).__name__
        raise DynamicTableError(f"{where}: ids must be a 1-D int64 numpy array, got {kind}")
    return ids


def owner_of(ids: IdArray, num_ps: int) -> IdArray:
    """The ps task (``0 .. num_ps - 1``) that owns each id: ``splitmix64(id) mod num_ps``.

    splitmix64 (Steele, Lea and Flood 2014; Vigna's ``splitmix64.c``) of the
    id's 64 bits read as unsigned: ``z = id + 0x9E3779B97F4A7C15; z = (z ^ z >> 30)
    * 0xBF58476D1CE4E5B9; z = (z ^ z >> 27) * 0x94D049BB133111EB; z ^= z >> 31``,
    all mod 2**64. Integer arithmetic only, no seed and no Python ``hash``, so
    every process on every platform computes the same owners (e.g. id 0 has
    ``0xE220A8397B1DCDAF % num_ps``). Neighbouring ids spread evenly.

    Raises:
        DynamicTableError: ``ids`` is not a 1-D int64 array, or ``num_ps < 1``.
    """
    check_ids(ids, "owner_of")
    if isinstance(num_ps, bool) or not isinstance(num_ps, (int, np.integer)) or num_ps < 1:
        raise DynamicTableError(f"owner_of: num_ps must be an int >= 1, got {num_ps!r}")
    return (mix64(ids.view(np.uint64)) % np.uint64(num_ps)).astype(np.int64)
