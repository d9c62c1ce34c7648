"""Batch: a batch of examples with named features -- sparse id lists, dense values -- and labels.

A batch of ``n`` examples holds:

* ``labels``: float32 ``[n]``;
* ``sparse``: named sparse features (:class:`SparseColumn`), each a CSR
  matrix: example ``i`` has the ids ``ids[indptr[i]:indptr[i + 1]]`` with the
  values ``values[indptr[i]:indptr[i + 1]]`` (per-id weights; 1.0 when the
  source has none), in the order the source stored them (neither sorted nor
  de-duplicated). An example may have no ids in a feature;
* ``dense``: named fixed-length features, each an array whose first axis is
  the example (``[n]`` or ``[n, k]``);
* ``extras``: arrays a model derived from the whole batch in the input
  pipeline (see :meth:`psflow.models.Model.prepare`), not features.

LIBSVM gives one sparse feature (:data:`DEFAULT_SPARSE_FEATURE`); Criteo TSV
13 dense and 26 sparse ones; TFRecord what its schema names. Every batch of a
dataset has the same feature names, in the same order.

:class:`BatchSpec` describes a dataset's batches without data: each sparse
feature's id space and each dense feature's width. Models size their tables
from it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["Batch", "BatchSource", "BatchSpec", "SparseColumn", "DEFAULT_SPARSE_FEATURE", "gather_ranges"]

#: Name of the one sparse feature of LIBSVM data and of the default TFRecord schema.
DEFAULT_SPARSE_FEATURE = "features"


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
class SparseColumn:
    """One sparse feature of a batch, as CSR rows.

    Attributes:
        indptr: int64 ``[n + 1]``, ``indptr[0] == 0``, non-decreasing.
        ids: int64 ``[nnz]``: ids as stored (LIBSVM ids are not shifted to
            0-based; Criteo and string features hold hashed ids).
        values: float32 ``[nnz]``: each id's value (weight).

    Instances are plain containers; methods never modify ``self``.
    """

    indptr: npt.NDArray[np.int64]
    ids: npt.NDArray[np.int64]
    values: npt.NDArray[np.float32]

    @property
    def num_examples(self) -> int:
        return int(self.indptr.shape[0]) - 1

    @property
    def nnz(self) -> int:
        """Number of (id, value) entries."""
        return int(self.ids.shape[0])

    @staticmethod
    def empty(num_examples: int = 0) -> SparseColumn:
        """A column of ``num_examples`` examples without ids."""
        return SparseColumn(np.zeros(num_examples + 1, dtype=np.int64), np.zeros(0, dtype=np.int64),
                            np.zeros(0, dtype=np.float32))

    def slice(self, start: int, stop: int) -> SparseColumn:
        """Examples ``[start, stop)`` (already clipped by the caller)."""
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        return SparseColumn(self.indptr[start : stop + 1] - lo, self.ids[lo:hi], self.values[lo:hi])

    def take(self, rows: npt.NDArray[np.int64]) -> SparseColumn:
        """The given examples, in the given order (vectorized)."""
        starts = self.indptr[rows]
        lengths = self.indptr[rows + 1] - starts
        indptr = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=indptr[1:])
        entries = gather_ranges(starts, lengths)
        return SparseColumn(indptr, self.ids[entries], self.values[entries])

    @staticmethod
    def concat(columns: Sequence[SparseColumn]) -> SparseColumn:
        """The examples of every column, in order."""
        if len(columns) == 1:
            return columns[0]
        offsets = np.cumsum([0] + [c.nnz for c in columns[:-1]])
        indptr = np.concatenate([np.zeros(1, dtype=np.int64)] + [c.indptr[1:] + off for c, off in zip(columns, offsets, strict=True)])
        return SparseColumn(indptr.astype(np.int64, copy=False), np.concatenate([c.ids for c in columns]),
                            np.concatenate([c.values for c in columns]))

    def validate(self, name: str, n: int) -> None:
        """Checks dtypes, shapes and CSR invariants for a batch of ``n`` examples.

        Raises:
            ValueError: naming the feature and the first violated invariant.
        """
        indptr, ids, values = self.indptr, self.ids, self.values
        checks: list[tuple[bool, str]] = [
            (indptr.dtype == np.int64 and indptr.shape == (n + 1,), f"indptr must be int64 [{n + 1}], got {indptr.dtype} {indptr.shape}"),
            (ids.dtype == np.int64 and ids.ndim == 1, f"ids must be int64 [nnz], got {ids.dtype} {ids.shape}"),
            (values.dtype == np.float32 and values.shape == ids.shape,
             f"values must be float32 {ids.shape}, got {values.dtype} {values.shape}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"invalid batch: sparse feature {name!r}: {message}")
        if indptr[0] != 0 or indptr[-1] != ids.shape[0]:
            raise ValueError(f"invalid batch: sparse feature {name!r}: indptr must run from 0 to nnz={ids.shape[0]}, "
                             f"got {int(indptr[0])}..{int(indptr[-1])}")
        if np.any(np.diff(indptr) < 0):
            raise ValueError(f"invalid batch: sparse feature {name!r}: indptr decreases")


@dataclass(frozen=True)
class BatchSpec:
    """What a dataset's batches hold, without data: feature names and sizes, in order.

    Attributes:
        sparse: sparse feature name -> size of its id space (the rows a table
            for it needs: a declared vocabulary, a hash bucket count, or the
            run's ``--num-features``).
        dense: dense feature name -> values per example.
    """

    sparse: Mapping[str, int] = field(default_factory=dict)
    dense: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sparse", {str(k): int(v) for k, v in self.sparse.items()})
        object.__setattr__(self, "dense", {str(k): int(v) for k, v in self.dense.items()})
        both = sorted(set(self.sparse) & set(self.dense))
        if both:
            raise ValueError(f"feature names {both} are both sparse and dense")
        for name, size in [*self.sparse.items(), *self.dense.items()]:
            if size < 1:
                raise ValueError(f"feature {name!r}: size must be >= 1, got {size}")

    @property
    def dense_width(self) -> int:
        """Dense values per example, all dense features together."""
        return sum(self.dense.values())

    def to_dict(self) -> dict[str, Any]:
        return {"sparse": dict(self.sparse), "dense": dict(self.dense)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BatchSpec:
        return cls(dict(data.get("sparse") or {}), dict(data.get("dense") or {}))


@dataclass(frozen=True)
class BatchSource:
    """Where a batch's records came from: for each file, its first and last record and how many.

    Made once per batch by the dataset (a few numpy calls, no per-record Python),
    for error messages: a non-finite loss names the batch by it.

    Attributes:
        spans: ``(path, first, last, count)`` per file, in the epoch's file
            order: ``first``/``last`` are the smallest and
            largest record index of the batch's records of that file (0-based
            TFRecord record indices; for text formats 1-based line numbers),
            ``count`` how many of them there are (fewer than ``last - first + 1``
            when shuffled or sharded by record). At most :data:`MAX_SPANS` files.
        files: files the records came from (``len(spans)`` unless more than
            :data:`MAX_SPANS`).
        epoch: the epoch (0-based) the batch belongs to.
        line_based: the indices are 1-based line numbers (text formats).
    """

    spans: tuple[tuple[str, int, int, int], ...]
    files: int
    epoch: int
    line_based: bool = False

    #: Files named at most in :attr:`spans` (a shuffled batch may draw from many).
    MAX_SPANS = 4

    def describe(self) -> str:
        """The batch's files and record ranges in one line: ``"a9a lines 1409-1536, epoch 1"``, or where
        the records are not all of a range (shuffled, sharded by record) ``"a9a: 128 records of lines
        3-2990, epoch 0"``."""
        unit = "lines" if self.line_based else "records"
        parts = []
        for path, first, last, count in self.spans:
            if count == 1:
                parts.append(f"{path} {unit[:-1]} {first}")
            elif count == last - first + 1:
                parts.append(f"{path} {unit} {first}-{last}")
            else:
                parts.append(f"{path}: {count} records of {unit} {first}-{last}")
        more = f" and {self.files - len(self.spans)} more files" if self.files > len(self.spans) else ""
        return f"{'; '.join(parts)}{more}, epoch {self.epoch}"


@dataclass
class Batch:
    """A batch of examples: labels, named sparse features, named dense features.

    Attributes:
        labels: float32 ``[n]``.  Text formats map labels to 0.0/1.0 (any label
            ``> 0`` is 1.0, so LIBSVM's ``+1/-1`` and ``1/0`` agree); TFRecord
            labels are the stored values, cast to float32.
        sparse: sparse features by name, each a :class:`SparseColumn` of ``n`` examples.
        dense: fixed-length features by name, each with first axis ``n``.
        extras: arrays derived from the whole batch by the input pipeline's
            ``prepare`` step (:func:`~psflow.data.dataset.open_dataset`), e.g. a
            model's unique ids computed in the reader process; not features.
            :meth:`slice`, :meth:`take` and :meth:`concat` drop them.
        source: where the records came from (:class:`BatchSource`), set on the
            batches a :class:`~psflow.data.dataset.Dataset` hands out; None on
            others. :meth:`slice`, :meth:`take` and :meth:`concat` drop it.

    Instances are plain containers; methods never modify ``self``.
    """

    labels: npt.NDArray[np.float32]
    sparse: dict[str, SparseColumn] = field(default_factory=dict)
    dense: dict[str, npt.NDArray[Any]] = field(default_factory=dict)
    extras: dict[str, npt.NDArray[Any]] = field(default_factory=dict)
    source: BatchSource | None = None

    @staticmethod
    def from_csr(labels: npt.ArrayLike, indptr: npt.ArrayLike, ids: npt.ArrayLike, values: npt.ArrayLike, *,
                 name: str = DEFAULT_SPARSE_FEATURE, dense: Mapping[str, npt.NDArray[Any]] | None = None) -> Batch:
        """A batch with one sparse feature ``name`` (as LIBSVM data gives), arrays cast to their dtypes."""
        column = SparseColumn(np.asarray(indptr, dtype=np.int64), np.asarray(ids, dtype=np.int64),
                              np.asarray(values, dtype=np.float32))
        return Batch(np.asarray(labels, dtype=np.float32), {name: column}, dict(dense or {}))

    @property
    def num_examples(self) -> int:
        """Number of examples."""
        return int(self.labels.shape[0])

    @property
    def nnz(self) -> int:
        """Number of (id, value) entries, over every sparse feature."""
        return sum(c.nnz for c in self.sparse.values())

    def column(self, name: str | None = None) -> SparseColumn:
        """The sparse feature ``name``; without a name, the batch's only sparse feature.

        Raises:
            KeyError: no such feature, or no name given and the batch has zero or
                several sparse features (the message lists them).
        """
        if name is None:
            if len(self.sparse) == 1:
                return next(iter(self.sparse.values()))
            raise KeyError(f"the batch has {len(self.sparse)} sparse features ({', '.join(self.sparse) or 'none'}); "
                           "name the one you want")
        try:
            return self.sparse[name]
        except KeyError:
            raise KeyError(f"the batch has no sparse feature {name!r} (it has {', '.join(self.sparse) or 'none'})") from None

    def slice(self, start: int, stop: int) -> Batch:
        """Examples ``[start, stop)`` as a new batch (Python slice rules for bounds)."""
        start, stop, _ = slice(start, stop).indices(self.num_examples)
        stop = max(stop, start)
        return Batch(self.labels[start:stop], {k: c.slice(start, stop) for k, c in self.sparse.items()},
                     {k: v[start:stop] for k, v in self.dense.items()})

    def take(self, rows: npt.ArrayLike) -> Batch:
        """The given examples, in the given order, as a new batch (vectorized)."""
        rows = np.asarray(rows, dtype=np.int64)
        return Batch(self.labels[rows], {k: c.take(rows) for k, c in self.sparse.items()},
                     {k: v[rows] for k, v in self.dense.items()})

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Concatenates batches example-wise.

        Raises:
            ValueError: ``batches`` is empty or their features differ.
        """
        if not batches:
            raise ValueError("Batch.concat needs at least one batch")
        if len(batches) == 1:
            return batches[0]
        first = batches[0]
        for i, b in enumerate(batches):
            if list(b.sparse) != list(first.sparse) or list(b.dense) != list(first.dense):
                raise ValueError(f"Batch.concat: batch {i} has features {list(b.sparse)} + {list(b.dense)}, "
                                 f"batch 0 has {list(first.sparse)} + {list(first.dense)}")
        return Batch(np.concatenate([b.labels for b in batches]),
                     {k: SparseColumn.concat([b.sparse[k] for b in batches]) for k in first.sparse},
                     {k: np.concatenate([b.dense[k] for b in batches]) for k in first.dense})

    def validate(self) -> None:
        """Checks dtypes, shapes and CSR invariants.

        Raises:
            ValueError: naming the feature and the first violated invariant.
        """
        labels = self.labels
        if labels.dtype != np.float32 or labels.ndim != 1:
            raise ValueError(f"invalid batch: labels must be float32 [n], got {labels.dtype} {labels.shape}")
        n = labels.shape[0]
        for name, column in self.sparse.items():
            column.validate(name, n)
        for name, array in self.dense.items():
            if array.ndim == 0 or array.shape[0] != n:
                raise ValueError(f"invalid batch: dense feature {name!r} has shape {array.shape}, want ({n}, ...)")
            if name in self.sparse:
                raise ValueError(f"invalid batch: feature {name!r} is both sparse and dense")
