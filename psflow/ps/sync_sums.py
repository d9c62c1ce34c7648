"""The sum of a sync step's sparse gradients (:class:`~psflow.ps.sync.SyncAggregator`), in C where built."""

from __future__ import annotations

import numpy as np

from psflow.native.loader import load_extension

__all__ = ["sum_rows"]

#: ``psflow.ps._kernels`` (its merge_sum sums a step's sparse pieces), or None: numpy then.
_KERNELS = load_extension("psflow.ps._kernels")
if _KERNELS is not None and not hasattr(_KERNELS, "merge_sum"):  # a build older than the merge
    _KERNELS = None


def sum_rows(pieces: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Sums sparse gradients; returns sorted unique rows and float64 sums.

    Each row's sum adds its values in the order of ``pieces`` (and within a
    piece, in row order), starting from 0.0, in float64: the same result as
    ``np.add.at`` over the concatenation. Where every piece is strictly increasing
    (clients send sorted distinct rows) and the C kernels are built, one
    merge in C (``psflow.ps._kernels.merge_sum``) gives the same arrays. A stable argsort merges the pieces
    (each usually sorted already: a linear merge of sorted runs); one-column
    values (embedding rows of width 1, e.g. a weight table) are summed by
    ``np.bincount`` and wider rows level by level over the merged order, both
    several times faster than ``np.add.at``.
    """
    rows = np.concatenate([r for r, _ in pieces])
    if _KERNELS is not None and rows.size and rows.dtype == np.int64 and all(v.dtype == np.float32 for _, v in pieces):
        # Every piece sorted and distinct (what clients send): one C merge, the same sums bit for bit.
        flat = np.ascontiguousarray(np.concatenate([v for _, v in pieces]))
        bounds = np.cumsum([0] + [r.size for r, _ in pieces], dtype=np.int64)
        out_rows, out_sums = np.empty(rows.size, np.int64), np.empty(flat.shape, np.float64)
        wide = flat.ndim == 2 and flat.shape[1] > 1
        count = _KERNELS.merge_sum(rows, flat, bounds, out_rows, out_sums, not wide)
        if count >= 0:
            return out_rows[:count], out_sums[:count]
    values = np.concatenate([v for _, v in pieces]).astype(np.float64)
    order = np.argsort(rows, kind="stable")
    ordered = rows[order]
    first = np.empty(ordered.size, dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    uniq = ordered[first]
    inverse = np.empty(rows.size, dtype=np.intp)
    inverse[order] = np.cumsum(first) - 1
    if values.ndim == 1:
        return uniq, np.bincount(inverse, weights=values, minlength=uniq.size)
    if values.ndim == 2 and values.shape[1] == 1:
        return uniq, np.bincount(inverse, weights=values[:, 0], minlength=uniq.size)[:, None]
    # Rows of several columns: the entries in row order (stable: a row's pieces keep their order), then
    # each row's run added up front to back, one vectorized level per position in the run (a row sent by
    # each of N workers: N levels). The same additions in the same order as np.add.at, several times
    # faster. (np.add.reduceat is faster still but may sum a long run pairwise: other last bits.)
    ordered_values = values[order]
    starts = np.flatnonzero(first)
    lengths = np.diff(np.append(starts, rows.size))
    out = ordered_values[starts]
    for depth in range(1, int(lengths.max())):
        longer = np.flatnonzero(lengths > depth)
        out[longer] += ordered_values[starts[longer] + depth]
    return uniq, out
