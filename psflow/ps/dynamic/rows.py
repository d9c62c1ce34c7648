"""Rows of a batch: the initial values of new ids, a call's distinct ids, and its gradients summed per id.

Pure functions of their arguments (no table state), so each result depends on
the call alone: never on slot layout or on how many ps tasks share the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from psflow.native.ids import unique_inverse
from psflow.placement.hashing import GAMMA, IdArray, U64Array, finalize
from psflow.ps.dynamic.spec import FloatArray

__all__ = ["initial_rows", "sum_by_id", "unique_ids"]



def _uniform_at(seed: int, k: U64Array) -> npt.NDArray[np.float64]:
    """Uniform [0, 1) doubles at flat indices ``k``: the formula of psflow.ps.initializers."""
    z = k * GAMMA + np.uint64((seed * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) % (1 << 64))
    out: npt.NDArray[np.float64] = (finalize(z) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return out


def _standard_normal(seed: int, k: U64Array) -> npt.NDArray[np.float64]:
    u1, u2 = _uniform_at(seed, k), _uniform_at(seed ^ 0x5DEECE66D, k)
    z: npt.NDArray[np.float64] = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
    return z


def initial_rows(spec: Mapping[str, Any], ids: IdArray, dim: int) -> FloatArray:
    """Initial rows of ``ids``: element j of id x is the static initializer's value at flat index x * dim + j.

    A tested copy of psflow.ps.initializers' counter-based formulas, evaluated
    at arbitrary flat indices (that module computes contiguous ranges only).
    """
    name, shape = spec["name"], (ids.size, dim)
    if name in ("zeros", "ones", "constant"):
        return np.full(shape, {"zeros": 0.0, "ones": 1.0}.get(name, spec.get("value", 0.0)), dtype=np.float32)
    k = np.asarray(ids.view(np.uint64)[:, None] * np.uint64(dim) + np.arange(dim, dtype=np.uint64), np.uint64).reshape(-1)
    seed = int(spec["seed"])
    if name == "random_uniform":
        lo, hi = float(spec["minval"]), float(spec["maxval"])
        values = lo + (hi - lo) * _uniform_at(seed, k)
    else:
        z = _standard_normal(seed, k)
        if name == "truncated_normal":
            for redraw in range(1, 9):  # the same redraw streams as the static initializer
                outside = np.flatnonzero(np.abs(z) > 2.0)
                if outside.size == 0:
                    break
                z[outside] = _standard_normal(seed + redraw * 0x632BE5AB, k[outside])
            z = np.clip(z, -2.0, 2.0)
        values = float(spec["mean"]) + float(spec["stddev"]) * z
    return values.astype(np.float32).reshape(shape)


def unique_ids(ids: IdArray) -> tuple[IdArray, IdArray]:
    """``np.unique(ids, return_inverse=True)``, in O(n): sorted distinct ids (what clients send) are
    returned themselves, with ``arange``; others go through :func:`psflow.native.ids.unique_inverse`."""
    if ids.size < 2 or bool(np.all(ids[1:] > ids[:-1])):
        return ids, np.arange(ids.size)
    return unique_inverse(ids)


def sum_by_id(grads: FloatArray, inverse: IdArray) -> FloatArray:
    """Gradients summed per unique id (``inverse`` from np.unique), in the order they appear in the call.

    The order depends on the call alone, not on slots, so a table restored onto
    another number of ps tasks goes on bit for bit as before.
    """
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse)
    starts = np.concatenate([np.zeros(1, np.int64), np.cumsum(counts[:-1])])
    summed: FloatArray = np.add.reduceat(grads[order], starts, axis=0)
    return summed
