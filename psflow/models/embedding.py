"""Embedding lookups of sparse features, forward and backward, in numpy.

The semantics are TensorFlow's ``tf.nn.safe_embedding_lookup_sparse``:

* example ``e`` of a sparse feature has ids ``i_1..i_k`` with weights
  ``w_1..w_k`` (1.0 each when the lookup is unweighted);
* its embedding is ``sum_j s_j * table[i_j]`` with ``s_j = w_j`` (combiner
  ``sum``), ``w_j / sum_j w_j`` (``mean``) or ``w_j / sqrt(sum_j w_j**2)``
  (``sqrtn``);
* an example with no ids gets a zero vector; with weights, ids whose weight
  is ``<= 0`` are dropped first (as TF prunes them);
* the gradient reaches only the rows looked up: a :class:`~psflow.gradients.SparseGradient`
  over the batch's unique ids (each row pulled once and pushed once).

A lookup is prepared once per batch (:meth:`EmbeddingLookup.build`: unique ids,
per-entry scale, grouping) and then used by the forward pass and by the
backward pass. Arithmetic is in float64; results are cast by the caller.

Ids must lie in ``[0, vocabulary)``: an id outside raises
:class:`~psflow.models.api.ModelError` naming the feature, the table and the id
(nothing is pulled or pushed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from psflow.models.api import ModelError
from psflow.native.ids import unique_inverse

__all__ = ["COMBINERS", "EmbeddingLookup", "unique_ids"]

COMBINERS = ("sum", "mean", "sqrtn")


def unique_ids(ids: npt.ArrayLike) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.intp]]:
    """``(uniq, inverse)``: sorted unique ids and, per id, its index in ``uniq`` (``uniq[inverse] == ids``)."""
    return unique_inverse(ids)


@dataclass(frozen=True)
class EmbeddingLookup:
    """One sparse feature looked up in one table, for one batch.

    Attributes:
        table: the table's variable name.
        ids: sorted unique ids: the rows to pull, and the rows of the gradient.
        inverse: per kept entry, its row's index in ``ids``.
        example: per kept entry, its example (ascending).
        scale: per kept entry, ``s_j`` of the module docstring (float64).
        num_examples: examples in the batch.
    """

    table: str
    ids: npt.NDArray[np.int64]
    inverse: npt.NDArray[np.intp]
    example: npt.NDArray[np.intp]
    scale: npt.NDArray[np.float64]
    num_examples: int

    @classmethod
    def build(cls, indptr: npt.NDArray[np.int64], ids: npt.NDArray[np.int64], weights: npt.NDArray[np.floating] | None,
              *, table: str, vocabulary: int, combiner: str = "mean", feature: str = "") -> EmbeddingLookup:
        """Prepares the lookup of a CSR sparse feature (``ids[indptr[e]:indptr[e + 1]]`` for example ``e``).

        Args:
            indptr, ids: the feature's CSR rows.
            weights: per-id weights (the feature's values), or None for an unweighted lookup.
            table: the table's variable name (for errors and gradients).
            vocabulary: the table's rows; every id must be in ``[0, vocabulary)``.
            combiner: ``sum``, ``mean`` or ``sqrtn``.
            feature: the feature's name, for errors.

        Raises:
            ModelError: an unknown combiner, or an id outside the vocabulary.
        """
        if combiner not in COMBINERS:
            raise ModelError(f"table {table!r}: combiner must be one of {', '.join(COMBINERS)}, got {combiner!r}")
        n = len(indptr) - 1
        ids = np.asarray(ids, dtype=np.int64)
        example = np.repeat(np.arange(n, dtype=np.intp), np.diff(indptr))
        if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocabulary):
            at = int(np.flatnonzero((ids < 0) | (ids >= vocabulary))[0])
            raise ModelError(f"feature {feature or '?'!r}: id {int(ids[at])} (example {int(example[at])} of the batch) is "
                             f"outside the vocabulary of table {table!r} ({vocabulary} rows)")
        if weights is None:
            w = np.ones(ids.size, dtype=np.float64)
        else:
            w = np.asarray(weights, dtype=np.float64)
            keep = w > 0
            if not keep.all():
                ids, example, w = ids[keep], example[keep], w[keep]
        if combiner == "sum":
            scale = w
        else:
            denom = np.bincount(example, weights=w if combiner == "mean" else w * w, minlength=n)
            if combiner == "sqrtn":
                denom = np.sqrt(denom)
            scale = w / denom[example]
        uniq, inverse = unique_ids(ids)
        return cls(table, uniq, inverse, example, scale, n)

    def to_extras(self, key: str) -> dict[str, npt.NDArray[np.generic]]:
        """The lookup as arrays named ``<key>.<part>``, for :attr:`Batch.extras <psflow.data.Batch.extras>`
        (so :meth:`Model.prepare` can build it in the input pipeline, even in another process)."""
        return {f"{key}.ids": self.ids, f"{key}.inverse": self.inverse, f"{key}.example": self.example,
                f"{key}.scale": self.scale, f"{key}.n": np.array([self.num_examples], dtype=np.int64)}

    @classmethod
    def from_extras(cls, extras: Mapping[str, npt.NDArray[np.generic]], key: str, *, table: str) -> EmbeddingLookup:
        """The lookup :meth:`to_extras` stored under ``key``.

        Raises:
            KeyError: nothing stored under ``key`` (the batch was not prepared).
        """
        return cls(table, extras[f"{key}.ids"].astype(np.int64, copy=False), extras[f"{key}.inverse"].astype(np.intp, copy=False),
                   extras[f"{key}.example"].astype(np.intp, copy=False), extras[f"{key}.scale"].astype(np.float64, copy=False),
                   int(extras[f"{key}.n"][0]))

    def forward(self, rows: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
        """The combined embedding of every example, ``[num_examples, dim]`` (zeros for an example without ids).

        Args:
            rows: the table's rows for :attr:`ids`, ``[len(ids), dim]``.
        """
        dim = rows.shape[1]
        out = np.zeros((self.num_examples, dim), dtype=np.float64)
        if self.example.size:
            contrib = rows[self.inverse].astype(np.float64) * self.scale[:, None]
            starts = np.flatnonzero(np.r_[True, self.example[1:] != self.example[:-1]])
            out[self.example[starts]] = np.add.reduceat(contrib, starts, axis=0)
        return out

    def backward(self, d_out: npt.NDArray[np.floating]) -> npt.NDArray[np.float64]:
        """The gradient of the rows of :attr:`ids`, ``[len(ids), dim]``, given d loss / d output ``[num_examples, dim]``."""
        grad = np.zeros((self.ids.size, d_out.shape[1]), dtype=np.float64)
        if self.example.size:
            contrib = np.asarray(d_out, dtype=np.float64)[self.example] * self.scale[:, None]
            order = np.argsort(self.inverse, kind="stable")
            starts = np.flatnonzero(np.r_[True, np.diff(self.inverse[order]) != 0])
            grad[self.inverse[order[starts]]] = np.add.reduceat(contrib[order], starts, axis=0)
        return grad
