"""Feature plumbing shared by models with one table for every sparse feature (``logistic``, ``fm``).

Such a model keeps one table of ``num_rows`` rows (``--num-features``) and
maps each sparse feature's ids into it (:func:`shared_rows`):

* a batch with one sparse feature (LIBSVM, the default TFRecord schema): the
  ids themselves, ids outside ``[0, num_rows)`` folded in by a fixed hash
  (:func:`fold_ids`), so any id space trains with a smaller table;
* several sparse features (Criteo, a multi-feature schema): each feature's
  ids salted by the feature's name (:func:`psflow.data.hashing.salted_ids`),
  so equal ids of two features land on different rows (collisions only as
  hashing makes them).

With ``num_rows == 0`` (a dynamic table, ``--embedding-table dynamic``) nothing
is folded: one feature's ids are used as they are, several features' ids are
salted into the full 64-bit range (``salted_ids(..., 0)``).

Dense features become one float64 matrix (:func:`dense_matrix`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from psflow.data import Batch, SparseColumn
from psflow.data.hashing import name_salt, salted_ids
from psflow.native.ids import unique_inverse

__all__ = ["fold_ids", "shared_rows", "dense_matrix", "segment_sum", "sum_by_index", "UniqueIds", "SharedRows",
           "SharedTableRows"]

_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)
#: Largest id space for which UniqueIds keeps a lookup table (2^26 rows: 256 MiB of int32).
_TABLE_LIMIT = 1 << 26


def fold_ids(ids: npt.ArrayLike, num_rows: int) -> npt.NDArray[np.int64]:
    """Maps ids into ``[0, num_rows)``: in-range ids unchanged, others hashed (``num_rows`` 0: every id unchanged)."""
    ids = np.asarray(ids, dtype=np.int64)
    if num_rows == 0:
        return ids
    out_of_range = (ids < 0) | (ids >= num_rows)
    if not out_of_range.any():
        return ids
    with np.errstate(over="ignore"):
        h = ids[out_of_range].view(np.uint64) * _HASH_MULT
        h ^= h >> np.uint64(29)
    folded = ids.copy()
    folded[out_of_range] = (h % np.uint64(num_rows)).astype(np.int64)
    return folded


def shared_rows(batch: Batch, num_rows: int) -> SparseColumn:
    """Every sparse feature of ``batch`` as rows of one table of ``num_rows`` rows, example by example.

    One feature: its CSR rows with folded ids. Several: their entries merged
    per example (in feature order within an example), each feature's ids
    salted by its name. The values are the features' values.
    """
    columns = list(batch.sparse.items())
    if len(columns) == 1:
        column = columns[0][1]
        return SparseColumn(column.indptr, fold_ids(column.ids, num_rows), column.values)
    n = batch.num_examples
    if not columns:
        return SparseColumn.empty(n)
    rows = np.concatenate([salted_ids(c.ids, name_salt(name), num_rows) for name, c in columns])
    values = np.concatenate([c.values for _, c in columns])
    example = np.concatenate([np.repeat(np.arange(n, dtype=np.int64), np.diff(c.indptr)) for _, c in columns])
    order = np.argsort(example, kind="stable")
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(example, minlength=n), out=indptr[1:])
    return SparseColumn(indptr, rows[order], values[order])


def dense_matrix(batch: Batch, names: Sequence[str]) -> npt.NDArray[np.float64]:
    """The dense features ``names`` side by side, ``[n, total width]``, as float64."""
    n = batch.num_examples
    if not names:
        return np.zeros((n, 0), dtype=np.float64)
    try:
        parts = [np.asarray(batch.dense[name], dtype=np.float64).reshape(n, -1) for name in names]
    except KeyError as e:
        raise KeyError(f"the batch has no dense feature {e.args[0]!r} (it has {', '.join(batch.dense) or 'none'})") from None
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)


def segment_sum(values: npt.NDArray[np.floating], indptr: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Per-example sums of per-entry ``values`` (``[nnz]`` or ``[nnz, d]``) of CSR rows ``indptr``, as float64."""
    n = len(indptr) - 1
    out = np.zeros((n, *values.shape[1:]), dtype=np.float64)
    counts = np.diff(indptr)
    nonempty = counts > 0
    if values.shape[0]:
        # reduceat sums contiguous runs in order; an empty example would read its neighbour's value, so only
        # non-empty examples are summed (their starts are strictly increasing).
        out[nonempty] = np.add.reduceat(values, indptr[:-1][nonempty], axis=0, dtype=np.float64)
    return out


def sum_by_index(values: npt.NDArray[np.floating], index: npt.NDArray[np.intp], size: int) -> npt.NDArray[np.float64]:
    """``out[k] = sum of values[j] where index[j] == k``, for ``[nnz]`` or ``[nnz, d]`` values, as float64."""
    if values.ndim == 1:
        out1: npt.NDArray[np.float64] = np.bincount(index, weights=values, minlength=size).astype(np.float64, copy=False)
        return out1
    out = np.zeros((size, values.shape[1]), dtype=np.float64)
    if index.size:
        order = np.argsort(index, kind="stable")
        sorted_index = index[order]
        starts = np.flatnonzero(np.r_[True, sorted_index[1:] != sorted_index[:-1]])
        out[sorted_index[starts]] = np.add.reduceat(values[order], starts, axis=0, dtype=np.float64)
    return out


class UniqueIds:
    """``(uniq, inverse)`` of ids in ``[0, num_rows)``, fast: a sort plus a lookup table instead of an argsort.

    ~3x faster than ``np.unique(..., return_inverse=True)`` on 20,000 ids. The
    table (4 bytes a row) is kept between calls; above 2^26 rows ``np.unique``
    is used. Thread-safe: calls share the table one at a time (a worker's
    prefetch thread prepares training batches while the chief's evaluation
    prepares its own; numpy releases the GIL inside large fancy indexing).
    """

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self._table: npt.NDArray[np.int32] | None = None
        self._lock = threading.Lock()

    def __call__(self, ids: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]:
        """Sorted unique ids and, per id, its index in them (as ``np.unique(..., return_inverse=True)``)."""
        if self.num_rows > _TABLE_LIMIT or self.num_rows == 0 or ids.size == 0:
            return unique_inverse(ids)  # raw 64-bit ids (a dynamic table), or a table too big to keep
        # Ids fit int32 here (the table limit is far below 2^31), and numpy sorts int32 ~2x faster.
        s = np.sort(ids.astype(np.int32))
        keep = np.empty(s.size, dtype=bool)
        keep[0] = True
        np.not_equal(s[1:], s[:-1], out=keep[1:])
        uniq = s[keep].astype(np.int64)
        with self._lock:
            if self._table is None:
                self._table = np.empty(self.num_rows, dtype=np.int32)
            # Only entries written here are read back below, so the table never needs clearing.
            self._table[uniq] = np.arange(uniq.size, dtype=np.int32)
            inverse = self._table[ids].astype(np.intp)
        return uniq, inverse


@dataclasses.dataclass(frozen=True)
class SharedRows:
    """A batch's entries as rows of one shared table: entry ``j`` of example ``e``
    (``indptr[e] <= j < indptr[e + 1]``) is row ``uniq[inverse[j]]`` with value ``values[j]``."""

    uniq: npt.NDArray[np.int64]
    inverse: npt.NDArray[np.intp]
    indptr: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]


class SharedTableRows:
    """A batch's sparse features as rows of one shared table, prepared once per batch and read back.

    :meth:`prepare` stores in ``batch.extras`` (under keys tagged with the
    model and the table size, so a batch prepared for another id space is
    prepared again) the sorted unique rows, each entry's index in them, and,
    unless the batch has exactly one sparse feature (whose layout and values
    are used in place), the merged layout and values; :meth:`get` reads them
    back (preparing the batch first if nobody did).

    Args:
        tag: the model's name in the keys (``"logistic"``).
        num_rows: rows of the shared table (0: a dynamic table, ids not folded).
    """

    def __init__(self, tag: str, num_rows: int) -> None:
        self.num_rows = num_rows
        self._unique = UniqueIds(num_rows)
        prefix = f"{tag}.{num_rows}"
        self._keys = (f"{prefix}.uniq", f"{prefix}.inverse", f"{prefix}.indptr", f"{prefix}.values")

    def prepare(self, batch: Batch) -> Batch:
        """``batch`` with its shared rows in ``extras``."""
        rows = shared_rows(batch, self.num_rows)
        uniq, inverse = self._unique(rows.ids)
        extras = {**batch.extras, self._keys[0]: uniq, self._keys[1]: inverse}
        if len(batch.sparse) != 1:  # merged (or no) features: keep their example-major layout too
            extras.update({self._keys[2]: rows.indptr, self._keys[3]: rows.values})
        return dataclasses.replace(batch, extras=extras)

    def get(self, batch: Batch) -> SharedRows:
        """The batch's entries as shared-table rows (see :class:`SharedRows`)."""
        if self._keys[0] not in batch.extras:
            batch = self.prepare(batch)
        extras = batch.extras
        if len(batch.sparse) == 1:
            column = next(iter(batch.sparse.values()))
            indptr, values = column.indptr, column.values
        else:
            indptr, values = extras[self._keys[2]], extras[self._keys[3]]
        return SharedRows(extras[self._keys[0]], extras[self._keys[1]], indptr, values)
