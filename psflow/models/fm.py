"""Factorization machine (``--model fm``): a linear part plus pairwise interactions (Rendle, 2010).

For an example with features ``x_i`` (sparse ids with their values, and every
dense value), each with a weight ``w_i`` and an embedding ``v_i`` of
``--embedding-dim`` values:

    logit = bias + sum_i w_i x_i + sum_{i<j} <v_i, v_j> x_i x_j
          = bias + sum_i w_i x_i + 1/2 sum_f ((sum_i v_if x_i)^2 - sum_i v_if^2 x_i^2)

loss = mean sigmoid cross-entropy. Variables, in this order:

* ``linear`` ``[num_features, 1]`` and ``embedding`` ``[num_features, dim]``:
  one row per hashed id of every sparse feature, as
  :func:`psflow.models.features.shared_rows` maps them (one feature: its ids;
  several: salted per feature); both partitioned with ``--partitions``;
* ``bias`` ``[1]``;
* ``dense_linear`` ``[width, 1]`` and ``dense_embedding`` ``[width, dim]``,
  one row per dense value, when the data has dense features.

Embeddings start at ``random_normal(stddev=init_stddev)`` (model parameter
``init_stddev``, 0.01; seeded by ``--seed``), the rest at zero. The linear part
(``linear``, ``bias``, ``dense_linear``) takes the run's optimizer
(``--optimizer``, ``--learning-rate``: FTRL 0.5 by default, as ``--model
logistic``, which it equals while the interactions are zero). The embeddings
(the factors) take Adagrad: ``embedding`` with learning rate 0.05 (model
parameter ``embedding_optimizer``, an OptimizerSpec JSON), as TensorFlow's
canned CTR models do, and ``dense_embedding`` with a tenth of that, 0.005
(``dense_embedding_optimizer``). A step pulls each unique row of ``linear`` and
``embedding`` once and pushes sparse gradients for them.

Why the dense factors learn slower: a dense value is not a one-hot 1 (Criteo's
``log1p`` counts reach 14 and sum to ~24 per example) and every example has
every dense feature, so each step moves every dense factor, and Adagrad's first
steps are ~its learning rate per coordinate whatever the gradient's scale. At
0.05 the dense pairs' term overshoots (on the Criteo sample it grows to a
logit of +2..+9 that ``dense_linear`` cancels at -5..-16), the more so with
stale asynchronous pushes: eval AUC 0.53-0.73 with the push order at batch
512 with 2 workers, where logistic regression reaches 0.73; at 0.005, fm's
0.73 (benchmarks/bench_model_defaults.py, docs/models.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from psflow.data import BINARY_LABELS, Batch
from psflow.gradients import DenseGradient, SparseGradient
from psflow.models.api import Lookups, Model, ModelConfig, ModelError, ModelOutput, Values, VariableSpec, dynamic_table
from psflow.models.features import SharedRows, SharedTableRows, dense_matrix, segment_sum, sum_by_index
from psflow.models.losses import binary_outputs, sigmoid, sigmoid_cross_entropy
from psflow.optim import OptimizerSpec
from psflow.placement import fixed_size_partitioner

__all__ = ["FactorizationMachine"]

#: The sparse features' factors' default optimizer (TF's canned CTR models: FTRL on the linear part, Adagrad on
#: embeddings). Measured on the Criteo sample (8,000 rows train, 2,000 eval, 3 epochs): the run's FTRL 0.5 on the
#: embeddings too gives eval AUC 0.65; Adagrad 0.05 0.71; Adagrad 0.01 0.72 (the interactions then add ~nothing).
_EMBEDDING_OPTIMIZER = {"name": "adagrad", "hyperparameters": {"learning_rate": 0.05, "initial_accumulator_value": 0.1}}
#: The dense features' factors' default optimizer: a tenth of the embeddings' learning rate (see the module docstring).
_DENSE_EMBEDDING_OPTIMIZER = {"name": "adagrad", "hyperparameters": {"learning_rate": 0.005, "initial_accumulator_value": 0.1}}


@dataclass(frozen=True)
class _Forward:
    """A forward pass: logits, per example ``s = sum_i v_i x_i``, per entry ``v_i x_i``, the dense values, the rows."""

    logits: np.ndarray
    s: np.ndarray
    xv: np.ndarray
    xd: np.ndarray
    rows: SharedRows


class FactorizationMachine(Model):
    """A second-order factorization machine for binary labels; parameters live on the ps tasks."""

    labels = BINARY_LABELS  # a binary classifier: 0 or 1 (LIBSVM: -1, 0, +1)

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.num_features = config.num_features
        self.dim = config.embedding_dim
        self.init_stddev = float(config.param("init_stddev", 0.01))
        if not self.init_stddev > 0:
            raise ModelError(f"fm: init_stddev must be > 0, got {self.init_stddev}")
        self.embedding_optimizer = OptimizerSpec.from_json(config.param("embedding_optimizer", _EMBEDDING_OPTIMIZER))
        self.dense_embedding_optimizer = OptimizerSpec.from_json(
            config.param("dense_embedding_optimizer", _DENSE_EMBEDDING_OPTIMIZER))
        self._dense = list(config.features.dense)
        self._dense_width = config.features.dense_width
        self._dynamic = dynamic_table(config)
        self._rows = SharedTableRows("fm", 0 if self._dynamic is not None else config.num_features)

    def variables(self) -> list[VariableSpec]:
        partitions = self.config.partitions
        partitioner = fixed_size_partitioner(partitions) if partitions > 1 else None
        init = {"name": "random_normal", "stddev": self.init_stddev, "seed": self.config.seed}
        emb_opt = self.embedding_optimizer
        rows = 0 if self._dynamic is not None else self.num_features
        if self._dynamic is not None:
            partitioner = None
        specs = [VariableSpec("linear", (rows, 1), partitioner=partitioner, dynamic=self._dynamic),
                 VariableSpec("embedding", (rows, self.dim), initializer=init, partitioner=partitioner,
                              optimizer=emb_opt, dynamic=self._dynamic),
                 VariableSpec("bias", (1,))]
        if self._dense_width:
            dense_init = {**init, "seed": self.config.seed + 1}
            specs += [VariableSpec("dense_linear", (self._dense_width, 1)),
                      VariableSpec("dense_embedding", (self._dense_width, self.dim), initializer=dense_init,
                                   optimizer=self.dense_embedding_optimizer)]
        return specs

    def prepare(self, batch: Batch) -> Batch:
        """``batch`` with its table rows (merged over features) and their unique ids in ``extras``."""
        return self._rows.prepare(batch)

    def lookups(self, batch: Batch) -> Lookups:
        uniq = self._rows.get(batch).uniq
        requests: Lookups = {"linear": uniq, "embedding": uniq, "bias": None}
        if self._dense_width:
            requests.update(dense_linear=None, dense_embedding=None)
        return requests

    def _forward(self, batch: Batch, values: Values) -> _Forward:
        """Logits and what the backward pass reuses."""
        rows = self._rows.get(batch)
        x = rows.values.astype(np.float64)
        xv = values["embedding"].astype(np.float64)[rows.inverse] * x[:, None]         # [nnz, dim]
        s = segment_sum(xv, rows.indptr)                                               # [n, dim]: sum_i v_i x_i
        q = segment_sum(np.einsum("ij,ij->i", xv, xv), rows.indptr)                    # [n]: sum_i |v_i x_i|^2
        z = segment_sum(values["linear"][:, 0].astype(np.float64)[rows.inverse] * x, rows.indptr)
        z += float(values["bias"][0])
        xd = dense_matrix(batch, self._dense)
        if self._dense_width:
            vd = values["dense_embedding"].astype(np.float64)
            z += xd @ values["dense_linear"][:, 0].astype(np.float64)
            s += xd @ vd
            q += (xd * xd) @ np.einsum("ij,ij->i", vd, vd)
        z += 0.5 * (np.einsum("ij,ij->i", s, s) - q)
        return _Forward(z, s, xv, xd, rows)

    def compute(self, batch: Batch, values: Values) -> ModelOutput:
        f = self._forward(batch, values)
        rows, n = f.rows, batch.num_examples
        x = rows.values.astype(np.float64)
        labels = batch.labels.astype(np.float64)
        probs = sigmoid(f.logits)
        loss = float(np.mean(sigmoid_cross_entropy(f.logits, labels))) if n else 0.0
        d = (probs - labels) / max(n, 1)                                                # dL/dz per example
        per_example = np.diff(rows.indptr)
        d_entry = np.repeat(d, per_example)
        # d z / d v_i = x_i (s - v_i x_i): the sum over the example's other features.
        grad_v = sum_by_index(d_entry[:, None] * x[:, None] * (np.repeat(f.s, per_example, axis=0) - f.xv),
                              rows.inverse, rows.uniq.size)
        grads: dict[str, DenseGradient | SparseGradient] = {
            "linear": SparseGradient(rows.uniq, sum_by_index(d_entry * x, rows.inverse, rows.uniq.size).astype(np.float32)[:, None]),
            "embedding": SparseGradient(rows.uniq, grad_v.astype(np.float32)),
            "bias": DenseGradient(np.array([d.sum()], dtype=np.float32)),
        }
        if self._dense_width:
            vd = values["dense_embedding"].astype(np.float64)
            grads["dense_linear"] = DenseGradient((f.xd.T @ d).astype(np.float32)[:, None])
            grad_vd = f.xd.T @ (d[:, None] * f.s) - vd * ((f.xd * f.xd).T @ d)[:, None]
            grads["dense_embedding"] = DenseGradient(grad_vd.astype(np.float32))
        return ModelOutput(loss, grads, {"predictions": probs, "logits": f.logits})

    def predict(self, batch: Batch, values: Values) -> dict[str, np.ndarray]:
        return binary_outputs(self._forward(batch, values).logits)
