"""Built-in click-through-rate models on PyTorch: ``wide_deep``, ``deepfm`` and ``dnn``.

Each model uses every feature of the data (:class:`psflow.data.BatchSpec`):
every sparse feature ``f`` gets its own embedding table ``[vocabulary_f,
dim]`` (``--embedding-dim``; Criteo: ``--num-features`` rows per field), and
the dense features are fed as they are. With ``--embedding-table dynamic``
every table (wide and deep) is a dynamic table of the run's options instead,
``(0, dim)``, keyed by the raw ids (Criteo: the full 64-bit hashes; see
:mod:`psflow.ps.dynamic`). The deep part is
``concat(embeddings, dense) -> ReLU layers of --hidden units -> 1``.

* ``wide_deep`` -- TensorFlow's ``DNNLinearCombinedClassifier``:
  ``logit = wide + deep``, where ``wide = sum_f lookup(wide/<f>, "sum") +
  dense @ wide/dense + wide/bias`` (a linear model over weighted one-hot
  features). Variables: ``wide/<f>``, ``wide/dense``, ``wide/bias``,
  ``deep/emb_<f>``, ``deep/layer<i>/kernel`` and ``/bias``.
* ``deepfm`` -- DeepFM (Guo et al., 2017): ``logit = linear + fm + deep``
  where the FM part is the pairwise interactions of the field embeddings,
  ``1/2 sum_d ((sum_f e_fd)^2 - sum_f e_fd^2)``, and the deep part reads the
  same embeddings. Variables: ``linear/<f>``, ``linear/dense``,
  ``linear/bias``, ``deep/emb_<f>``, ``deep/layer<i>/*``.
* ``dnn`` -- TensorFlow's ``DNNClassifier``: the deep part alone.

Optimizers, as TensorFlow's ``DNNLinearCombinedClassifier`` but for the wide
part's learning rate: FTRL on the wide (linear) variables with learning rate
0.3 (``--wide-optimizer``), Adagrad with learning rate 0.05 on the deep ones
(``--deep-optimizer``); both with initial accumulator 0.1. The wide rate sits
between TensorFlow's, ``min(0.2, 1/sqrt(number of columns))`` (0.16 for
Criteo's 39 columns; ``--wide-optimizer ftrl:learning_rate=0.16``), and ``--model
logistic``'s 0.5, as each loses where the other wins (batch 512, 2 workers,
benchmarks/bench_model_defaults.py): on the Criteo sample (47 steps) TF's left
``wide_deep`` at eval AUC 0.70 where logistic regression reaches 0.73; on the
200,000 rows of the W&D peer workload (391 steps) 0.5 cost ``wide_deep`` and
``deepfm`` ~0.009 against TF's. 0.3 is within 0.012 of logistic on the first
and 0.002 of TF's rate on the second. Kernels start Glorot-uniform, biases and wide variables at zero, embeddings
``truncated_normal(stddev=1/sqrt(dim))``, each seeded from ``--seed``.

Model parameters (``--model-param KEY=VALUE`` with a JSON value, or the flags):
    ``hidden``          hidden layer sizes (``--hidden 256,128``; default ``[256, 128]``);
    ``wide_optimizer``, ``deep_optimizer``: ``{"name", "hyperparameters"}``
                        (``--wide-optimizer ftrl:learning_rate=0.1``); given
                        hyperparameters of the default optimizer replace only those;
    ``combiners``       ``{feature: "sum"|"mean"|"sqrtn"}`` of the deep lookups (default ``mean``);
    ``weighted``        features whose values weight their deep lookup (default none; the
                        wide lookups are always weighted by the values, as TF's
                        ``weighted_categorical_column``);
    ``partition_min_rows``  tables of fewer rows stay whole under ``--partitions`` (default 0:
                        every table is split; TF's W&D benchmark splits those of >= 10,000).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from psflow.data import BINARY_LABELS
from psflow.models.api import ModelConfig, ModelError, dynamic_table
from psflow.optim import OptimizerError, OptimizerSpec
from psflow.torch.embedding import Embedding, EmbeddingCollection
from psflow.torch.inputs import Inputs
from psflow.torch.model import Dense, ParamGroup, TorchModel

__all__ = ["WideDeep", "DeepFM", "DNN", "DEFAULT_HIDDEN"]

DEFAULT_HIDDEN = (256, 128)
_DEEP_OPTIMIZER = {"name": "adagrad", "hyperparameters": {"learning_rate": 0.05, "initial_accumulator_value": 0.1}}
#: The wide part's default: FTRL at 0.3, between TF's min(0.2, 1/sqrt(columns)) and --model logistic's 0.5 (see the
#: module docstring), TF's other FTRL defaults.
_WIDE_OPTIMIZER = {"name": "ftrl", "hyperparameters": {"learning_rate": 0.3, "learning_rate_power": -0.5,
                                                       "initial_accumulator_value": 0.1}}


def _optimizer(config: ModelConfig, key: str, default: Mapping[str, Any]) -> OptimizerSpec:
    """The optimizer of model parameter ``key``; hyperparameters of the default's optimizer fill the gaps."""
    given = config.param(key, None)
    if given is None:
        return OptimizerSpec.from_json(default)
    try:
        if given.get("name") == default["name"]:
            given = {"name": given["name"], "hyperparameters": {**default["hyperparameters"], **given.get("hyperparameters", {})}}
        return OptimizerSpec.from_json(given)
    except (OptimizerError, AttributeError, TypeError) as e:
        raise ModelError(f"--{key.replace('_', '-')}: {e}") from e


class _Deep(nn.Module):
    """``concat(embeddings, dense) -> ReLU(Dense) ... -> Dense(1)``; kernels ``layer<i>/kernel`` in TF's layout."""

    def __init__(self, embeddings: EmbeddingCollection | None, dense_width: int, hidden: Sequence[int], seed: int) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.num_layers = len(hidden) + 1
        width = (embeddings.output_dim if embeddings is not None else 0) + dense_width
        for i, units in enumerate([*hidden, 1]):
            setattr(self, f"layer{i}", Dense(width, units, seed=seed + 1000 + i))
            width = units

    def forward(self, embedded: torch.Tensor | None, dense: torch.Tensor | None) -> torch.Tensor:
        parts = [t for t in (embedded, dense) if t is not None]
        h = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
        for i in range(self.num_layers):
            h = getattr(self, f"layer{i}")(h)
            if i < self.num_layers - 1:
                h = torch.relu_(h)
        return h.reshape(-1)


def _unsplit(rows: int, min_rows: int) -> int | None:
    """A table's ``partitions``: 1 (whole) below ``min_rows`` rows, else None (the run's ``--partitions``)."""
    return 1 if rows < min_rows else None


class _Linear(nn.Module):
    """``sum_f lookup(<prefix>/<f>, "sum", weighted) + dense @ <prefix>/dense + <prefix>/bias``."""

    def __init__(self, prefix: str, fields: Mapping[str, int], dense_width: int, partition_min_rows: int = 0,
                 dynamic: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.prefix = prefix
        zeros = {"name": "zeros"}
        self.tables = (EmbeddingCollection([Embedding(f, v, 1, combiner="sum", weighted=True, initializer=zeros,
                                                      name=f"{prefix}/{f}", partitions=_unsplit(v, partition_min_rows),
                                                      dynamic=dynamic)
                                            for f, v in fields.items()], pooling="sum")
                       if fields else None)
        self.dense = nn.Parameter(torch.zeros(dense_width, 1)) if dense_width else None
        self.bias = nn.Parameter(torch.zeros(1))
        for p in self.parameters():
            p.psflow_initializer = zeros  # type: ignore[attr-defined]

    def forward(self, inputs: Inputs, dense: torch.Tensor | None) -> torch.Tensor:
        out = self.bias.expand(inputs.num_examples)
        if self.tables is not None:
            out = out + self.tables(inputs).reshape(-1)
        if self.dense is not None and dense is not None:
            out = out + (dense @ self.dense).reshape(-1)
        return out


class _CtrModel(TorchModel):
    """What the three models share: fields, dense width, embedding tables, the deep part, optimizers."""

    labels = BINARY_LABELS  # a binary classifier: 0 or 1 (LIBSVM: -1, 0, +1)

    def __init__(self, config: ModelConfig) -> None:
        self.fields = dict(config.features.sparse)
        self.dense_width = config.features.dense_width
        self.hidden = [int(h) for h in config.param("hidden", list(DEFAULT_HIDDEN))]
        if any(h < 1 for h in self.hidden):
            raise ModelError(f"--hidden: layer sizes must be >= 1, got {self.hidden}")
        self.combiners = {f: str(c) for f, c in dict(config.param("combiners", {})).items()}
        self.weighted = {str(f) for f in config.param("weighted", [])}
        self.partition_min_rows = int(config.param("partition_min_rows", 0))
        if self.partition_min_rows < 0:
            raise ModelError(f"partition_min_rows must be >= 0, got {self.partition_min_rows}")
        unknown = (set(self.combiners) | self.weighted) - set(self.fields)
        if unknown:
            raise ModelError(f"model parameters name features {sorted(unknown)} the data does not have "
                             f"(it has {', '.join(self.fields) or 'none'})")
        if not self.fields and not self.dense_width:
            raise ModelError("the data has no features")
        self.wide_optimizer = _optimizer(config, "wide_optimizer", _WIDE_OPTIMIZER)
        self.deep_optimizer = _optimizer(config, "deep_optimizer", _DEEP_OPTIMIZER)
        self._dynamic = dynamic_table(config)  # --embedding-table dynamic: every table a dynamic one
        super().__init__(config)

    #: Embeddings' initial stddev; None: TF's embedding columns' 1/sqrt(dim) (model parameter ``init_stddev``).
    init_stddev: float | None = None

    def _embeddings(self) -> EmbeddingCollection | None:
        if not self.fields:
            return None
        dim = self.config.embedding_dim
        stddev = float(self.config.param("init_stddev", self.init_stddev or 1.0 / math.sqrt(dim)))
        return EmbeddingCollection([
            Embedding(f, v, dim, combiner=self.combiners.get(f, "mean"), weighted=f in self.weighted, name=f"deep/emb_{f}",
                      initializer={"name": "truncated_normal", "stddev": stddev, "seed": self.config.seed + i},
                      partitions=_unsplit(v, self.partition_min_rows), dynamic=self._dynamic)
            for i, (f, v) in enumerate(self.fields.items())], pooling="concat")

    #: The linear part's name (``wide``, ``linear``: its variables' prefix), or None for none.
    linear: str | None = None
    #: Whether the FM interactions of the field embeddings are added (DeepFM).
    fm: bool = False

    def build(self) -> nn.Module:
        deep = _Deep(self._embeddings(), self.dense_width, self.hidden, self.config.seed)
        linear = (_Linear(self.linear, self.fields, self.dense_width, self.partition_min_rows, self._dynamic)
                  if self.linear else None)
        return _CtrNet(linear, deep, self.dense_width, self.fm)

    def param_groups(self) -> Sequence[ParamGroup]:
        net = self.module
        assert isinstance(net, _CtrNet)
        linear = net.linear_part()
        deep = [ParamGroup(net.deep, self.deep_optimizer)]
        return deep if linear is None else [ParamGroup(linear, self.wide_optimizer), *deep]


class _CtrNet(nn.Module):
    """``logit = linear part (if any) + FM interactions (if fm) + deep part``."""

    def __init__(self, linear: _Linear | None, deep: _Deep, dense_width: int, fm: bool) -> None:
        super().__init__()
        self.linear_name = linear.prefix if linear is not None else None
        if linear is not None:  # registered under its prefix, first: variables wide/... (or linear/...), then deep/...
            self.add_module(linear.prefix, linear)
        self.deep = deep
        self.dense_width = dense_width
        self.fm = fm

    def linear_part(self) -> _Linear | None:
        part = getattr(self, self.linear_name) if self.linear_name else None
        assert part is None or isinstance(part, _Linear)
        return part

    def forward(self, inputs: Inputs) -> torch.Tensor:
        dense = inputs.dense() if self.dense_width else None
        embedded = self.deep.embeddings(inputs) if self.deep.embeddings is not None else None
        linear = self.linear_part()
        logit = linear(inputs, dense) if linear is not None else None
        if self.fm and embedded is not None:
            num_fields = len(self.deep.embeddings.embeddings) if self.deep.embeddings is not None else 0
            e = embedded.reshape(embedded.shape[0], num_fields, -1)
            s = e.sum(dim=1)
            pairs = 0.5 * (s * s - (e * e).sum(dim=1)).sum(dim=1)
            logit = pairs if logit is None else logit + pairs
        deep: torch.Tensor = self.deep(embedded, dense)
        return deep if logit is None else logit + deep


class WideDeep(_CtrModel):
    """``--model wide_deep``: TensorFlow's DNNLinearCombinedClassifier (see the module docstring)."""

    linear = "wide"


class DeepFM(_CtrModel):
    """``--model deepfm``: a linear part, FM interactions of the field embeddings, and a DNN over them.

    Embeddings start at ``truncated_normal(stddev=0.01)``: with TF's 1/sqrt(dim) the
    pairwise term of 26 fields starts with logits of stddev ~6 (Criteo sample, 3 epochs:
    eval AUC 0.62 instead of 0.7x).
    """

    linear = "linear"
    fm = True
    init_stddev = 0.01


class DNN(_CtrModel):
    """``--model dnn``: TensorFlow's DNNClassifier over the embeddings and dense features."""
