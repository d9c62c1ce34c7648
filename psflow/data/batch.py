"""SparseBatch: a batch of examples as a CSR sparse matrix plus labels.

Row ``i`` of a batch has the feature ids ``ids[indptr[i]:indptr[i + 1]]`` with
the values ``values[indptr[i]:indptr[i + 1]]`` in the order the source stored
them (ids are neither sorted nor de-duplicated).  Fixed-length features ride
along in ``dense`` as arrays whose first axis is the row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

__all__ = ["SparseBatch", "gather_ranges"]


def gather_ranges(starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64], step: int = 1) -> npt.NDArray[np.int64]:
    """Returns the concatenation of ``arange(s, s + n * step, step)`` for each ``(s, n)`` pair.

    Vectorized: no Python loop over the ranges.  ``lengths`` must be >= 0.
    """
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    keep = lengths > 0
    starts, lengths = starts[keep], lengths[keep]
    steps = np.full(total, step, dtype=np.int64)
    heads = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=heads[1:])
    steps[0] = starts[0]
    # At the head of each range jump from the last element of the previous range.
    steps[heads[1:]] = starts[1:] - (starts[:-1] + (lengths[:-1] - 1) * step)
    return np.cumsum(steps)


@dataclass
class SparseBatch:
    """A batch of examples: labels, a CSR matrix of (id, value) pairs, dense features.

    Attributes:
        labels: float32 ``[n]``.  Text formats map labels to 0.0/1.0 (any label
            ``> 0`` is 1.0, so LIBSVM's ``+1/-1`` and ``1/0`` agree); TFRecord
            labels are the stored values, cast to float32.
        indptr: int64 ``[n + 1]``, ``indptr[0] == 0``, non-decreasing.
        ids: int64 ``[nnz]``: feature ids exactly as stored (LIBSVM ids are not
            shifted to 0-based; Criteo ids are the hashed ids).
        values: float32 ``[nnz]``.
        dense: fixed-length features by name, each with first axis ``n``.
        extras: arrays derived from the whole batch by the input pipeline's
            ``prepare`` step (:func:`~psflow.data.dataset.open_dataset`), e.g. a
            model's unique ids computed in the reader process; not features.
            :meth:`slice`, :meth:`take` and :meth:`concat` drop them.

    Instances are plain containers; methods never modify ``self``.
    """

    labels: npt.NDArray[np.float32]
    indptr: npt.NDArray[np.int64]
    ids: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]
    dense: dict[str, npt.NDArray[np.generic]] = field(default_factory=dict)
    extras: dict[str, npt.NDArray[np.generic]] = field(default_factory=dict)

    @property
    def num_examples(self) -> int:
        """Number of rows."""
        return int(self.labels.shape[0])

    @property
    def nnz(self) -> int:
        """Number of (id, value) entries in the batch."""
        return int(self.ids.shape[0])

    @staticmethod
    def empty(dense_like: SparseBatch | None = None) -> SparseBatch:
        """Returns a batch with no rows (dense keys copied from ``dense_like``)."""
        dense = {k: v[:0].copy() for k, v in dense_like.dense.items()} if dense_like else {}
        return SparseBatch(
            labels=np.zeros(0, dtype=np.float32),
            indptr=np.zeros(1, dtype=np.int64),
            ids=np.zeros(0, dtype=np.int64),
            values=np.zeros(0, dtype=np.float32),
            dense=dense,
        )

    def slice(self, start: int, stop: int) -> SparseBatch:
        """Returns rows ``[start, stop)`` as a new batch (Python slice rules for bounds)."""
        start, stop, _ = slice(start, stop).indices(self.num_examples)
        stop = max(stop, start)
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        return SparseBatch(
            labels=self.labels[start:stop],
            indptr=self.indptr[start : stop + 1] - lo,
            ids=self.ids[lo:hi],
            values=self.values[lo:hi],
            dense={k: v[start:stop] for k, v in self.dense.items()},
        )

    def take(self, rows: npt.NDArray[np.int64]) -> SparseBatch:
        """Returns the given rows, in the given order, as a new batch (vectorized)."""
        rows = np.asarray(rows, dtype=np.int64)
        starts = self.indptr[rows]
        lengths = self.indptr[rows + 1] - starts
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        entries = gather_ranges(starts, lengths)
        return SparseBatch(
            labels=self.labels[rows],
            indptr=indptr,
            ids=self.ids[entries],
            values=self.values[entries],
            dense={k: v[rows] for k, v in self.dense.items()},
        )

    @staticmethod
    def concat(batches: Sequence[SparseBatch]) -> SparseBatch:
        """Concatenates batches row-wise.

        Raises:
            ValueError: ``batches`` is empty or their dense keys differ.
        """
        if not batches:
            raise ValueError("SparseBatch.concat needs at least one batch")
        if len(batches) == 1:
            return batches[0]
        keys = set(batches[0].dense)
        for i, b in enumerate(batches):
            if set(b.dense) != keys:
                raise ValueError(f"SparseBatch.concat: batch {i} has dense keys {sorted(b.dense)}, batch 0 has {sorted(keys)}")
        offsets = np.cumsum([0] + [b.nnz for b in batches[:-1]])
        indptr = np.concatenate([batches[0].indptr[:1]] + [b.indptr[1:] + off for b, off in zip(batches, offsets, strict=True)])
        return SparseBatch(
            labels=np.concatenate([b.labels for b in batches]),
            indptr=indptr.astype(np.int64, copy=False),
            ids=np.concatenate([b.ids for b in batches]),
            values=np.concatenate([b.values for b in batches]),
            dense={k: np.concatenate([b.dense[k] for b in batches]) for k in batches[0].dense},
        )

    def validate(self) -> None:
        """Checks dtypes, shapes and CSR invariants.

        Raises:
            ValueError: naming the first violated invariant.
        """
        n = self.labels.shape[0] if self.labels.ndim == 1 else -1
        labels, indptr, ids, values = self.labels, self.indptr, self.ids, self.values
        checks: list[tuple[bool, str]] = [
            (labels.dtype == np.float32 and labels.ndim == 1, f"labels must be float32 [n], got {labels.dtype} {labels.shape}"),
            (indptr.dtype == np.int64 and indptr.shape == (n + 1,), f"indptr must be int64 [{n + 1}], got {indptr.dtype} {indptr.shape}"),
            (ids.dtype == np.int64 and ids.ndim == 1, f"ids must be int64 [nnz], got {ids.dtype} {ids.shape}"),
            (
                values.dtype == np.float32 and values.shape == ids.shape,
                f"values must be float32 {ids.shape}, got {values.dtype} {values.shape}",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid SparseBatch: {message}")
        if self.indptr[0] != 0 or self.indptr[-1] != self.ids.shape[0]:
            raise ValueError(
                f"invalid SparseBatch: indptr must run from 0 to nnz={self.ids.shape[0]}, got {int(self.indptr[0])}..{int(self.indptr[-1])}"
            )
        if np.any(np.diff(self.indptr) < 0):
            raise ValueError("invalid SparseBatch: indptr decreases")
        for name, array in self.dense.items():
            if array.ndim == 0 or array.shape[0] != n:
                raise ValueError(f"invalid SparseBatch: dense feature {name!r} has shape {array.shape}, want ({n}, ...)")
