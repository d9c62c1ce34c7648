"""Sparse logistic regression: the classic parameter-server model.

``logit = sum_j value_j * w[id_j] + b``, loss = mean sigmoid cross-entropy.
Variables: ``weights`` of shape ``[num_features, 1]`` (partitionable along
axis 0, so a large table spreads over ps tasks) and ``bias`` of shape ``[1]``.

Feature ids outside ``[0, num_features)`` are folded into that range by a
fixed 64-bit hash (:func:`fold_ids`), so any id space can be trained with a
smaller table; ids already in range are kept as they are.

One training step (:meth:`LogisticRegression.train_step`):
    1. unique ids of the batch (each row pulled once),
    2. one pull per ps task of those rows and the bias,
    3. forward and backward in numpy,
    4. one push per ps task: a sparse gradient of the unique rows, a dense
       one for the bias; returns the global_step this push produced.

Step 1 can run ahead in the input pipeline: :meth:`LogisticRegression.prepare`
stores the unique ids in the batch's ``extras`` (the in-process fast path runs
it in the reader process), and the step then uses them as they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from psflow.data import SparseBatch
from psflow.placement import VariableSet
from psflow.train.client import DenseGradient, ParameterClient, SparseGradient

__all__ = ["LogisticRegression", "StepResult", "fold_ids"]

_HASH_MULT = np.uint64(0x9E3779B97F4A7C15)
#: Largest id space for which unique_ids keeps a lookup table (2^26 rows: 256 MiB of int32).
_TABLE_LIMIT = 1 << 26


def fold_ids(ids: np.ndarray, num_features: int) -> np.ndarray:
    """Maps ids into ``[0, num_features)``: in-range ids unchanged, others hashed."""
    ids = np.asarray(ids, dtype=np.int64)
    out_of_range = (ids < 0) | (ids >= num_features)
    if not out_of_range.any():
        return ids
    with np.errstate(over="ignore"):
        h = ids[out_of_range].view(np.uint64) * _HASH_MULT
        h ^= h >> np.uint64(29)
    folded = ids.copy()
    folded[out_of_range] = (h % np.uint64(num_features)).astype(np.int64)
    return folded


def _row_sums(batch: SparseBatch, x: np.ndarray) -> np.ndarray:
    """Per-row sums of ``x`` (one value per non-zero of ``batch``), as float64."""
    n = batch.num_examples
    counts = np.diff(batch.indptr)
    if n and counts.all():
        # Rows are contiguous runs of the non-zeros: reduceat sums them in order, ~4x faster than
        # bincount. It needs every row non-empty (an empty row would read its neighbour's first value).
        sums: np.ndarray = np.add.reduceat(x, batch.indptr[:-1], dtype=np.float64)
        return sums
    return np.bincount(np.repeat(np.arange(n), counts), weights=x, minlength=n)


def sigmoid(z: np.ndarray) -> np.ndarray:
    """Numerically stable logistic function."""
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


def sigmoid_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Per-example loss, as ``tf.nn.sigmoid_cross_entropy_with_logits``."""
    loss: np.ndarray = np.maximum(logits, 0) - logits * labels + np.log1p(np.exp(-np.abs(logits)))
    return loss


@dataclass(frozen=True)
class StepResult:
    """What one training step produced."""

    step: int
    loss: float
    labels: np.ndarray
    probs: np.ndarray
    completed: bool = True          # this push owns ``step`` (see PushResult)
    accepted: bool = True           # False: a stale gradient, dropped (sync)
    min_clock: int | None = None    # ssp: slowest live worker's clock


class LogisticRegression:
    """The model; it holds no parameters itself (they live on the ps tasks)."""

    def __init__(self, num_features: int, *, partitioner: Callable[..., Any] | None = None) -> None:
        """Args:
            num_features: rows of the weight table.
            partitioner: splits ``weights`` along axis 0 (e.g. ``fixed_size_partitioner(2)``).
        """
        if num_features < 1:
            raise ValueError(f"num_features must be >= 1, got {num_features}")
        self.num_features = num_features
        self.partitioner = partitioner
        self._table: np.ndarray | None = None
        self._extra_keys = (f"logistic.unique_ids.{num_features}", f"logistic.unique_inverse.{num_features}")
        # (next batch, its uniq, inverse, pulled rows, step they were read at), from a push_pull
        self._carry: tuple[SparseBatch, np.ndarray, np.ndarray, dict[str, np.ndarray], int | None] | None = None

    def build(self, variables: VariableSet) -> None:
        """Declares ``weights`` and ``bias`` in ``variables`` (in this order)."""
        variables.get_variable("weights", (self.num_features, 1), partitioner=self.partitioner)
        variables.get_variable("bias", (1,))

    def logits(self, batch: SparseBatch, weights: np.ndarray, bias: float, inverse: np.ndarray | None = None) -> np.ndarray:
        """Logits of a batch given pulled weights (``weights[inverse]`` per non-zero)."""
        w = weights[inverse] if inverse is not None else weights
        return _row_sums(batch, batch.values * w) + bias

    def compute(self, batch: SparseBatch, pulled: dict[str, np.ndarray], uniq: np.ndarray,
                inverse: np.ndarray) -> tuple[dict[str, DenseGradient | SparseGradient], float, np.ndarray]:
        """Gradients of the batch's mean loss, the loss and the probabilities.

        ``pulled`` holds ``weights`` rows for ``uniq`` and the ``bias``;
        ``uniq[inverse]`` are the batch's (folded) ids.
        """
        w = pulled["weights"][:, 0].astype(np.float64)
        b = float(pulled["bias"][0])
        n = batch.num_examples
        z = self.logits(batch, w, b, inverse)
        labels = batch.labels.astype(np.float64)
        probs = sigmoid(z)
        loss = float(np.mean(sigmoid_cross_entropy(z, labels))) if n else 0.0
        d = (probs - labels) / max(n, 1)
        grad_w = np.bincount(inverse, weights=batch.values * np.repeat(d, np.diff(batch.indptr)), minlength=uniq.size)
        grads: dict[str, DenseGradient | SparseGradient] = {
            "weights": SparseGradient(uniq, grad_w.astype(np.float32)[:, None]),
            "bias": DenseGradient(np.array([d.sum()], dtype=np.float32)),
        }
        return grads, loss, probs

    def prepare(self, batch: SparseBatch) -> SparseBatch:
        """``batch`` with its :meth:`unique_ids` in ``extras``, which :meth:`train_step` then uses.

        For the input pipeline (``open_dataset(prepare=...)``): the work moves
        off the training loop.  The ids are tagged with ``num_features``, so a
        model with another id space recomputes them.
        """
        uniq, inverse = self.unique_ids(batch)
        return replace(batch, extras={**batch.extras, self._extra_keys[0]: uniq, self._extra_keys[1]: inverse})

    def _unique(self, batch: SparseBatch) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`unique_ids`, from ``batch.extras`` if :meth:`prepare` put them there."""
        uniq_key, inverse_key = self._extra_keys
        uniq = batch.extras.get(uniq_key)
        if uniq is not None:
            return uniq, batch.extras[inverse_key]
        return self.unique_ids(batch)

    def unique_ids(self, batch: SparseBatch) -> tuple[np.ndarray, np.ndarray]:
        """``(uniq, inverse)`` of the batch's folded ids: sorted unique ids and, per
        non-zero, its index in ``uniq`` (as ``np.unique(..., return_inverse=True)``).

        Uses a sort of the values plus a lookup table over the id space (4 bytes
        per feature, kept between steps) instead of an argsort: ~3x faster on
        20,000 ids. Falls back to ``np.unique`` for id spaces over 2^26.
        """
        ids = fold_ids(batch.ids, self.num_features)
        if self.num_features > _TABLE_LIMIT or ids.size == 0:
            uniq, inverse = np.unique(ids, return_inverse=True)
            return uniq, inverse.reshape(-1)
        # Folded ids fit int32 here (the table limit is far below 2^31), and numpy sorts int32 ~2x faster.
        s = np.sort(ids.astype(np.int32))
        keep = np.empty(s.size, dtype=bool)
        keep[0] = True
        np.not_equal(s[1:], s[:-1], out=keep[1:])
        uniq = s[keep].astype(np.int64)
        if self._table is None:
            self._table = np.empty(self.num_features, dtype=np.int32)
        # Only entries written here are read back below, so the table never needs clearing.
        self._table[uniq] = np.arange(uniq.size, dtype=np.int32)
        return uniq, self._table[ids].astype(np.intp)

    def train_step(self, client: ParameterClient, batch: SparseBatch, *, clock: int | None = None,
                   pause: float = 0.0, next_batch: SparseBatch | None = None) -> StepResult:
        """Pulls, computes the gradient and pushes it (see module docstring).

        With ``next_batch``, the push and the next step's pull travel in one
        RPC per ps task (:meth:`ParameterClient.push_pull`); the pulled rows
        are kept for the next call, which must then be for ``next_batch``.
        Values are the same as with separate calls; only round trips are saved.

        Args:
            client: connected to the ps tasks.
            batch: the examples of this step.
            clock: this worker's iteration count, including this one (ssp).
            pause: fault injection: seconds between pull and push, i.e. a
                slow worker whose gradient is computed from older parameters.
            next_batch: the batch of the next step, if any.
        """
        carry, self._carry = self._carry, None
        if carry is not None and carry[0] is batch:
            _, uniq, inverse, pulled, read_step = carry
        else:
            uniq, inverse = self._unique(batch)
            pulled = client.pull({"weights": uniq, "bias": None})
            read_step = client.last_pull_step
        grads, loss, probs = self.compute(batch, pulled, uniq, inverse)
        if pause:
            time.sleep(pause)
        if next_batch is None:
            r = client.push_detailed(grads, examples=batch.num_examples, loss=loss, clock=clock, read_step=read_step)
        else:
            next_uniq, next_inverse = self._unique(next_batch)
            r, next_pulled = client.push_pull(grads, {"weights": next_uniq, "bias": None}, examples=batch.num_examples,
                                              loss=loss, clock=clock, read_step=read_step)
            self._carry = (next_batch, next_uniq, next_inverse, next_pulled, client.last_pull_step)
        return StepResult(r.step, loss, batch.labels, probs, r.completed, r.accepted, r.min_clock)

    def predict(self, batch: SparseBatch, weights: np.ndarray, bias: float) -> np.ndarray:
        """Probabilities for a batch, from the full weight table."""
        ids = fold_ids(batch.ids, self.num_features)
        w = np.asarray(weights, dtype=np.float64).reshape(-1)[ids]
        return sigmoid(self.logits(batch, w, float(bias)))
