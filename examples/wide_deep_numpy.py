"""Wide & Deep in plain numpy: a user's own model, written against psflow's public model seam.

Nothing here is part of psflow: this file only imports the seam
(``psflow.models``), and psflow finds it by its import path::

    psflow train --model examples.wide_deep_numpy:WideDeep --format criteo \\
        --train data/criteo_synthetic/train.txt --eval data/criteo_synthetic/eval.txt --num-features 16384 --embedding-dim 8 \\
        --model-param hidden=[64,32] --ps 2 --workers 2 --partitions 2

(run from the directory holding ``examples/``; every task process imports it
from there). Through the Python API, ``psflow.create_model("examples.wide_deep_numpy:WideDeep",
config)`` builds it and :class:`psflow.train.step.TrainStep` trains it.

The model is TensorFlow's ``DNNLinearCombinedClassifier`` over every feature
of the data (:class:`psflow.data.BatchSpec`):

* wide: ``logit_wide = sum_f lookup(wide/<f>, ids_f, values_f, "sum") + dense @ wide/dense + wide/bias``
  (a linear model over weighted one-hot features);
* deep: ``h0 = concat(lookup(deep/emb_<f>, ids_f, combiner_f), ..., dense)``, then
  ReLU layers of ``hidden`` units and one linear unit;
* ``logit = logit_wide + logit_deep``; loss = mean sigmoid cross-entropy;
* optimizers as TF's estimator: FTRL on the wide variables (learning rate
  ``min(0.2, 1/sqrt(#wide columns))``), Adagrad (0.05) on the deep ones.

Lookups are ``tf.nn.safe_embedding_lookup_sparse``: an example without ids in
a field gets zeros, and each table's rows are pulled once per batch and
updated sparsely (only the rows looked up).

Model parameters (``--model-param KEY=VALUE``, JSON values):
    ``hidden``         hidden layer sizes (default ``[64, 32]``);
    ``combiners``      ``{feature: "sum"|"mean"|"sqrtn"}`` for the deep lookups (default ``mean``);
    ``weighted``       features whose values weight their deep lookup (default: none);
    ``wide_optimizer``, ``deep_optimizer``: OptimizerSpec JSON (``{"name": "ftrl", "hyperparameters": {...}}``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np

from psflow.data import BINARY_LABELS, Batch
from psflow.gradients import DenseGradient, SparseGradient
from psflow.models import EmbeddingLookup, Lookups, Model, ModelConfig, ModelError, ModelOutput, Values, VariableSpec
from psflow.models.features import dense_matrix
from psflow.models.losses import binary_outputs, sigmoid_cross_entropy
from psflow.optim import OptimizerSpec
from psflow.placement import fixed_size_partitioner

__all__ = ["WideDeep"]


class WideDeep(Model):
    """Wide & Deep over every sparse and dense feature of the data."""

    labels = BINARY_LABELS  # a binary classifier: the readers refuse other labels as bad records

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        self.fields = dict(config.features.sparse)        # name -> vocabulary (table rows)
        self.dense = list(config.features.dense)
        self.dense_width = config.features.dense_width
        self.dim = config.embedding_dim
        self.hidden = [int(h) for h in config.param("hidden", [64, 32])]
        self.combiners = {f: str(config.param("combiners", {}).get(f, "mean")) for f in self.fields}
        self.weighted = set(config.param("weighted", []))
        unknown = (set(config.param("combiners", {})) | self.weighted) - set(self.fields)
        if unknown:
            raise ModelError(f"WideDeep: parameters name features {sorted(unknown)} the data does not have "
                             f"(it has {', '.join(self.fields)})")
        if not self.fields and not self.dense:
            raise ModelError("WideDeep: the data has no features")
        wide_lr = min(0.2, 1.0 / math.sqrt(len(self.fields) + len(self.dense)))
        self.wide_optimizer = self._optimizer("wide_optimizer", {"name": "ftrl", "hyperparameters": {
            "learning_rate": wide_lr, "learning_rate_power": -0.5, "initial_accumulator_value": 0.1}})
        self.deep_optimizer = self._optimizer("deep_optimizer", {"name": "adagrad", "hyperparameters": {
            "learning_rate": 0.05, "initial_accumulator_value": 0.1}})

    def _optimizer(self, key: str, default: dict[str, Any]) -> OptimizerSpec:
        return OptimizerSpec.from_json(self.config.param(key, default))

    # ---- variables ---------------------------------------------------------------
    def _table(self, name: str, rows: int, width: int, optimizer: OptimizerSpec, init: dict[str, Any]) -> VariableSpec:
        parts = min(self.config.partitions, rows)
        return VariableSpec(name, (rows, width), initializer=init, optimizer=optimizer,
                            partitioner=fixed_size_partitioner(parts) if parts > 1 else None)

    def variables(self) -> list[VariableSpec]:
        seed = self.config.seed
        specs = []
        for i, (field, vocab) in enumerate(self.fields.items()):
            emb_init = {"name": "random_normal", "stddev": 1.0 / math.sqrt(self.dim), "seed": seed + i}
            specs += [self._table(f"wide/{field}", vocab, 1, self.wide_optimizer, {"name": "zeros"}),
                      self._table(f"deep/emb_{field}", vocab, self.dim, self.deep_optimizer, emb_init)]
        if self.dense_width:
            specs.append(VariableSpec("wide/dense", (self.dense_width, 1), optimizer=self.wide_optimizer))
        specs.append(VariableSpec("wide/bias", (1,), optimizer=self.wide_optimizer))
        width = self.dim * len(self.fields) + self.dense_width
        for i, units in enumerate([*self.hidden, 1]):
            kernel_init = {"name": "glorot_uniform", "seed": seed + 1000 + i}
            specs += [VariableSpec(f"deep/layer{i}/kernel", (width, units), initializer=kernel_init,
                                   optimizer=self.deep_optimizer),
                      VariableSpec(f"deep/layer{i}/bias", (units,), optimizer=self.deep_optimizer)]
            width = units
        return specs

    # ---- one batch ---------------------------------------------------------------
    def prepare(self, batch: Batch) -> Batch:
        """Builds every lookup of the batch once (unique ids, combiner scales) into ``extras``."""
        extras = dict(batch.extras)
        for field, vocab in self.fields.items():
            column = batch.column(field)
            wide = EmbeddingLookup.build(column.indptr, column.ids, column.values, table=f"wide/{field}",
                                         vocabulary=vocab, combiner="sum", feature=field)
            deep = EmbeddingLookup.build(column.indptr, column.ids, column.values if field in self.weighted else None,
                                         table=f"deep/emb_{field}", vocabulary=vocab, combiner=self.combiners[field],
                                         feature=field)
            extras.update(wide.to_extras(f"wd.wide.{field}"))
            extras.update(deep.to_extras(f"wd.deep.{field}"))
        return replace(batch, extras=extras)

    def _lookups(self, batch: Batch) -> tuple[dict[str, EmbeddingLookup], dict[str, EmbeddingLookup]]:
        wide = {f: EmbeddingLookup.from_extras(batch.extras, f"wd.wide.{f}", table=f"wide/{f}") for f in self.fields}
        deep = {f: EmbeddingLookup.from_extras(batch.extras, f"wd.deep.{f}", table=f"deep/emb_{f}") for f in self.fields}
        return wide, deep

    def lookups(self, batch: Batch) -> Lookups:
        wide, deep = self._lookups(batch)
        requests: Lookups = {}
        for field in self.fields:
            requests[f"wide/{field}"] = wide[field].ids
            requests[f"deep/emb_{field}"] = deep[field].ids
        whole = ["wide/dense"] if self.dense_width else []
        whole.append("wide/bias")
        for i in range(len(self.hidden) + 1):
            whole += [f"deep/layer{i}/kernel", f"deep/layer{i}/bias"]
        requests.update(dict.fromkeys(whole))
        return requests

    def _forward(self, batch: Batch, values: Values) -> dict[str, Any]:
        wide, deep = self._lookups(batch)
        x = dense_matrix(batch, self.dense)
        logit = np.full(batch.num_examples, float(values["wide/bias"][0]))
        for field, lookup in wide.items():
            logit += lookup.forward(values[f"wide/{field}"])[:, 0]
        if self.dense_width:
            logit += x @ values["wide/dense"][:, 0].astype(np.float64)
        h = np.concatenate([deep[f].forward(values[f"deep/emb_{f}"]) for f in self.fields] + [x], axis=1)
        activations = [h]
        for i in range(len(self.hidden) + 1):
            a = h @ values[f"deep/layer{i}/kernel"].astype(np.float64) + values[f"deep/layer{i}/bias"].astype(np.float64)
            h = np.maximum(a, 0.0) if i < len(self.hidden) else a
            activations.append(h)
        logit += h[:, 0]
        return {"logits": logit, "activations": activations, "wide": wide, "deep": deep, "x": x}

    def compute(self, batch: Batch, values: Values) -> ModelOutput:
        f = self._forward(batch, values)
        n = batch.num_examples
        labels = batch.labels.astype(np.float64)
        outputs = binary_outputs(f["logits"])
        loss = float(np.mean(sigmoid_cross_entropy(f["logits"], labels))) if n else 0.0
        d = (outputs["predictions"] - labels) / max(n, 1)
        grads: dict[str, DenseGradient | SparseGradient] = {"wide/bias": DenseGradient(np.array([d.sum()], np.float32))}
        if self.dense_width:
            grads["wide/dense"] = DenseGradient((f["x"].T @ d)[:, None].astype(np.float32))
        for field, lookup in f["wide"].items():
            if lookup.ids.size:
                grads[f"wide/{field}"] = SparseGradient(lookup.ids, lookup.backward(d[:, None]).astype(np.float32))
        # Back through the layers: activations[i] is the input of layer i (ReLU'd for i > 0).
        g = d[:, None]
        acts = f["activations"]
        for i in reversed(range(len(self.hidden) + 1)):
            grads[f"deep/layer{i}/kernel"] = DenseGradient((acts[i].T @ g).astype(np.float32))
            grads[f"deep/layer{i}/bias"] = DenseGradient(g.sum(axis=0).astype(np.float32))
            g = g @ values[f"deep/layer{i}/kernel"].astype(np.float64).T
            if i > 0:
                g = g * (acts[i] > 0)  # ReLU: no gradient where the unit was off (TF's relu gradient at 0 is 0)
        for k, (field, lookup) in enumerate(f["deep"].items()):
            if lookup.ids.size:
                rows = lookup.backward(g[:, k * self.dim:(k + 1) * self.dim])
                grads[f"deep/emb_{field}"] = SparseGradient(lookup.ids, rows.astype(np.float32))
        return ModelOutput(loss, grads, outputs)

    def predict(self, batch: Batch, values: Values) -> dict[str, np.ndarray]:
        return binary_outputs(self._forward(batch, values)["logits"])
