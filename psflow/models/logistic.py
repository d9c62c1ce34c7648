"""Sparse logistic regression: the classic parameter-server model (``--model logistic``).

``logit = sum_j value_j * weights[row_j] + dense @ dense_weights + bias``,
loss = mean sigmoid cross-entropy. Variables, in this order:

* ``weights`` ``[num_features, 1]``: one row per hashed id, partitioned along
  axis 0 with ``--partitions`` (a large table spreads over ps tasks). Every
  sparse feature maps into it (:func:`psflow.models.features.shared_rows`):
  one feature's ids are used as they are (ids outside the table folded in by
  a fixed hash); several features' ids are salted per feature;
* ``bias`` ``[1]``;
* ``dense_weights`` ``[total dense width, 1]``, only when the data has dense
  features (Criteo's 13 integer columns).

:meth:`LogisticRegression.prepare` computes the batch's rows and their unique
ids (in the reader process on the in-process fast path); a step pulls each
unique row once and pushes a sparse gradient for them and dense ones for
``bias`` and ``dense_weights``.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from psflow.data import BINARY_LABELS, Batch
from psflow.gradients import DenseGradient, SparseGradient
from psflow.models.api import Lookups, Model, ModelConfig, ModelOutput, Values, VariableSpec, dynamic_table
from psflow.models.features import SharedRows, SharedTableRows, dense_matrix, fold_ids
from psflow.models.losses import sigmoid, sigmoid_cross_entropy
from psflow.native.loader import load_extension
from psflow.placement import fixed_size_partitioner

__all__ = ["LogisticRegression", "fold_ids", "legacy_config"]


def legacy_config(shapes: Mapping[str, tuple[int, ...]]) -> ModelConfig | None:
    """The config of the logistic model whose variables have ``shapes``, or None if they are not its.

    Checkpoints and exports written before models were recorded hold only
    this model (``weights`` ``[N, 1]`` and ``bias`` ``[1]``); this reads them.
    """
    if set(shapes) != {"weights", "bias"} or len(shapes["weights"]) != 2 or shapes["weights"][1] != 1:
        return None
    return ModelConfig(num_features=int(shapes["weights"][0]))


#: The C loops of :func:`_entry_products` and :func:`_row_gradients` (``psflow/models/_logistic.c``), or None:
#: their numpy twins, which give the same numbers.
_KERNELS = load_extension("psflow.models._logistic")


def _native(rows: SharedRows) -> bool:
    """Whether the C loops take ``rows``' arrays as they are (1-d, C-contiguous, the dtypes they read)."""
    return (_KERNELS is not None and rows.values.dtype == np.float32 and rows.inverse.dtype == np.int64
            and rows.indptr.dtype == np.int64 and rows.values.ndim == 1 and rows.values.flags.c_contiguous
            and rows.inverse.flags.c_contiguous and rows.indptr.flags.c_contiguous)


def _entry_products(rows: SharedRows, w: np.ndarray) -> np.ndarray:
    """Per entry ``j``, ``rows.values[j] * w[rows.inverse[j]]`` as float64 (``w``: the rows' weights, float64)."""
    if _KERNELS is not None and _native(rows) and w.dtype == np.float64 and w.ndim == 1 and w.flags.c_contiguous:
        out = np.empty(rows.values.shape[0], dtype=np.float64)
        _KERNELS.entry_products(rows.values, w, rows.inverse, out)
        return out
    products: np.ndarray = rows.values * w[rows.inverse]
    return products


def _row_gradients(rows: SharedRows, d: np.ndarray) -> np.ndarray:
    """Per unique row, the sum of ``value * d[example]`` over its entries, added in entry order (float64)."""
    if _KERNELS is not None and _native(rows) and d.dtype == np.float64 and d.flags.c_contiguous:
        out = np.zeros(rows.uniq.size, dtype=np.float64)
        _KERNELS.row_gradients(rows.values, rows.inverse, rows.indptr, d, out)
        return out
    return np.bincount(rows.inverse, weights=rows.values * np.repeat(d, np.diff(rows.indptr)), minlength=rows.uniq.size)


def _row_sums(indptr: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per-example sums of ``x`` (one value per entry of the CSR rows ``indptr``), as float64."""
    n = len(indptr) - 1
    counts = np.diff(indptr)
    if n and counts.all():
        # Examples are contiguous runs of the entries: reduceat sums them in order, ~4x faster than
        # bincount. It needs every example non-empty (an empty one would read its neighbour's first value).
        sums: np.ndarray = np.add.reduceat(x, indptr[:-1], dtype=np.float64)
        return sums
    return np.bincount(np.repeat(np.arange(n), counts), weights=x, minlength=n)


class LogisticRegression(Model):
    """Sparse logistic regression; it holds no parameters itself (they live on the ps tasks)."""

    labels = BINARY_LABELS  # a binary classifier: 0 or 1 (LIBSVM: -1, 0, +1)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.num_features = config.num_features
        self._dense = list(config.features.dense)
        self._dense_width = config.features.dense_width
        self._dynamic = dynamic_table(config)
        self._rows = SharedTableRows("logistic", 0 if self._dynamic is not None else config.num_features)

    def variables(self) -> list[VariableSpec]:
        partitions = self.config.partitions
        weights = (VariableSpec("weights", (0, 1), dynamic=self._dynamic) if self._dynamic is not None else
                   VariableSpec("weights", (self.num_features, 1),
                                partitioner=fixed_size_partitioner(partitions) if partitions > 1 else None))
        specs = [weights, VariableSpec("bias", (1,))]
        if self._dense_width:
            specs.append(VariableSpec("dense_weights", (self._dense_width, 1)))
        return specs

    def prepare(self, batch: Batch) -> Batch:
        """``batch`` with its table rows and their unique ids in ``extras``."""
        return self._rows.prepare(batch)

    def lookups(self, batch: Batch) -> Lookups:
        requests: Lookups = {"weights": self._rows.get(batch).uniq, "bias": None}
        if self._dense_width:
            requests["dense_weights"] = None
        return requests

    def _logits(self, batch: Batch, values: Values) -> tuple[np.ndarray, SharedRows, np.ndarray]:
        """(logits, the batch's shared rows, its dense features)."""
        rows = self._rows.get(batch)
        w = values["weights"][:, 0].astype(np.float64)
        z = _row_sums(rows.indptr, _entry_products(rows, w)) + float(values["bias"][0])
        x = dense_matrix(batch, self._dense)
        if self._dense_width:
            z += x @ values["dense_weights"][:, 0].astype(np.float64)
        return z, rows, x

    def compute(self, batch: Batch, values: Values) -> ModelOutput:
        z, rows, x = self._logits(batch, values)
        n = batch.num_examples
        labels = batch.labels.astype(np.float64)
        probs = sigmoid(z)
        loss = float(np.mean(sigmoid_cross_entropy(z, labels))) if n else 0.0
        d = (probs - labels) / max(n, 1)
        grad_w = _row_gradients(rows, d)
        grads: dict[str, DenseGradient | SparseGradient] = {
            "weights": SparseGradient(rows.uniq, grad_w.astype(np.float32)[:, None]),
            "bias": DenseGradient(np.array([d.sum()], dtype=np.float32)),
        }
        if self._dense_width:
            grads["dense_weights"] = DenseGradient((x.T @ d).astype(np.float32)[:, None])
        return ModelOutput(loss, grads, {"predictions": probs, "logits": z})

    def predict(self, batch: Batch, values: Values) -> dict[str, np.ndarray]:
        z = self._logits(batch, values)[0]
        return {"predictions": sigmoid(z), "logits": z}
