"""The model seam: what a model tells the runtime, and what the runtime gives it back.

A model is a Python class that holds no parameters (they live on the ps
tasks). The runtime (:mod:`psflow.train.step`) drives it through one step, in
this order, the same in every path (between-graph, in-process, in-graph, sync
and ssp workers, evaluation, export and predict):

1. :meth:`Model.variables` -- once: every variable the model has, in a fixed
   order (name, shape, dtype, initializer, partitioner, optimizer). The
   runtime places them (:mod:`psflow.placement`) and registers them on the
   ps tasks; every process computes the same layout from the same config.
2. :meth:`Model.prepare` -- per batch, in the input pipeline where it can
   (a prefetch thread or the reader process): work that depends on the batch
   alone, e.g. each table's unique ids. Must be a pure function of the batch
   (it may run in another process); what it derives goes into
   :attr:`Batch.extras <psflow.data.Batch.extras>`.
3. :meth:`Model.lookups` -- per batch: which rows of which variables the
   step needs (``{name: ids}``; ``None`` for a whole variable). The runtime
   pulls each requested row from the partition holding it, one RPC per ps
   task, and may pull them while the previous step's push travels.
4. :meth:`Model.compute` -- the loss, the gradients (:class:`DenseGradient`
   for whole variables, :class:`SparseGradient` for rows) and the outputs the
   metrics need, from the batch and the pulled values. The runtime pushes the
   gradients (one RPC per ps task) and the ps tasks apply each variable's
   optimizer.
5. :meth:`Model.predict` -- evaluation and serving: outputs only.
6. :meth:`Model.metrics` -- a metrics dict from labels and outputs (default:
   AUC, log-loss and accuracy of ``outputs["predictions"]``).

A model declares the labels it accepts in :attr:`Model.labels` (a
:class:`~psflow.data.LabelSpec`; a class attribute, read without building the
model): the readers refuse a record with another label as a bad record, naming
its file and record, under the run's bad-record policy, so :meth:`Model.compute`
never sees one. NaN and infinite labels are always refused.

Guarantees the runtime gives a model:
    * ``values[name]`` in :meth:`compute` / :meth:`predict` holds the rows of
      exactly the ids :meth:`lookups` returned for ``name``, in that order (the
      whole variable for ``None``), as float arrays of the variable's dtype.
    * A lookup or gradient naming a variable the model did not declare, or a
      gradient for a non-trainable one, is refused before anything is sent
      (:class:`ModelError` naming the model and the variable).
    * Ids outside a variable's rows are refused before anything is sent
      (naming the variable and the id); nothing stored changes.

Two settings of how a model trains, besides its variables:
    * :attr:`Model.clip_gradient_norm` -- a model may declare that its
      step's gradients are clipped by global norm (TensorFlow's
      ``clip_by_global_norm``, :mod:`psflow.train.clipping`) before they are
      pushed; the run's ``--clip-gradient-norm`` replaces what it declares.
    * :meth:`Model.place` -- the devices a worker's model computes on (one
      replica, a *tower*, per device; ``--device``, ``--towers``,
      ``--devices``). The default accepts the CPU only: a numpy model runs
      there; :class:`psflow.torch.TorchModel` takes ``cuda:N`` and towers.

What the runtime asks of a model: the same config gives the same variables
on every process; :meth:`prepare` is pure; :meth:`compute` and
:meth:`predict` do not keep state between calls (two batches may be in
flight: the lookahead pulls the next batch's rows before the current one is
pushed).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from psflow.data import FINITE_LABELS, Batch, BatchSpec, LabelSpec
from psflow.errors import PsflowError
from psflow.gradients import DenseGradient, Gradients, SparseGradient
from psflow.models.metrics import binary_metrics
from psflow.optim import OptimizerSpec
from psflow.placement import DTYPE_SIZES, Partitioner

__all__ = [
    "Model",
    "ModelConfig",
    "ModelError",
    "ModelOutput",
    "VariableSpec",
    "DYNAMIC_TABLE_PARAM",
    "DYNAMIC_TABLE_FLAGS",
    "dynamic_table",
    "Lookups",
    "Values",
    "DenseGradient",
    "SparseGradient",
]

#: Variable name -> the ids whose rows a step needs (int64, 1-d), or None for the whole variable.
Lookups = dict[str, np.ndarray | None]
#: Variable name -> the pulled rows (for ids) or the whole variable (for None).
Values = Mapping[str, np.ndarray]


class ModelError(PsflowError, ValueError):
    """A model is unknown, misconfigured, or asked for something it did not declare (names it)."""


#: The model parameter holding the run's dynamic table options (``--embedding-table dynamic``).
DYNAMIC_TABLE_PARAM = "dynamic_table"
#: The ``psflow train`` flag of each dynamic table option that has one (the others of
#: :data:`psflow.ps.dynamic.OPTIONS` have none): the CLI reads the options from these flags, and its errors and
#: a resume's refusal name the flag.
DYNAMIC_TABLE_FLAGS = {"capacity_rows": "--capacity", "capacity_bytes": "--capacity-bytes", "admit_after": "--admit-after",
                       "admit_probability": "--admit-probability", "ttl_steps": "--ttl-steps",
                       "policy": "--eviction-policy"}


def dynamic_table(config: ModelConfig) -> dict[str, Any] | None:
    """The options of the run's dynamic embedding tables (``--embedding-table dynamic``), or None (static tables).

    Built-in models then declare every id-keyed table as a dynamic table with these options and look its rows up
    by the raw ids (no folding into ``num_features`` rows).
    """
    options = config.params.get(DYNAMIC_TABLE_PARAM)
    if options is None:
        return None
    if not isinstance(options, Mapping):
        raise ModelError(f"model config: {DYNAMIC_TABLE_PARAM} must be a mapping of dynamic table options, got {options!r}")
    return dict(options)


@dataclass(frozen=True)
class VariableSpec:
    """One variable a model declares.

    Attributes:
        name: TensorFlow-style name, ``"deep/emb_C1"``.
        shape: its shape; tables are ``[vocabulary, dim]``.
        dtype: one of :data:`psflow.placement.DTYPE_SIZES` (float32 for trainable ones).
        initializer: JSON-able initializer spec (:mod:`psflow.ps.initializers`):
            ``{"name": "random_normal", "stddev": 0.01, "seed": 1}``; default zeros.
        partitioner: splits the variable along axis 0 over ps tasks (tables);
            e.g. :func:`psflow.fixed_size_partitioner`.
        optimizer: the optimizer applied to this variable on its ps tasks;
            None: the run's optimizer (``--optimizer``, with
            ``--learning-rate-schedule``). Its ``learning_rate`` may be a
            schedule (:class:`psflow.optim.schedules.ScheduleSpec`), read at each
            update's global step, e.g. ``OptimizerSpec("rmsprop",
            {"learning_rate": ScheduleSpec("exponential_decay", {...})})``.
        trainable: whether gradients are pushed for it.
        device: pins it to a ps task (``"/job:ps/task:1"``); None: the run's
            placement strategy chooses.
        dynamic: a dynamic table's options (:data:`psflow.ps.dynamic.OPTIONS`:
            ``capacity_rows``, ``admit_after``, ``ttl_steps``, ...), its shape
            ``(0, dim)``: rows keyed by any int64 id, created on first use,
            spread over every ps task by id (see :mod:`psflow.ps.dynamic`).
            None: a static variable. :func:`dynamic_table` reads the run's.
        moving_average_decay: keep a moving average of the variable on its ps
            tasks (TensorFlow's ``ExponentialMovingAverage(decay,
            num_updates=global_step)``, :mod:`psflow.ps.averages`), used by
            evaluation with ``--eval-moving-averages`` and by ``psflow export
            --moving-averages``. None: the run's ``--moving-average-decay``
            (none by default); a number in (0, 1]: this decay; 0.0: not
            averaged whatever the run says (an average with decay 0 is the
            variable itself; e.g. a large table, whose average costs a pass
            over it every step). Only trainable static variables are averaged.
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    initializer: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({"name": "zeros"}))
    partitioner: Partitioner | None = None
    optimizer: OptimizerSpec | None = None
    trainable: bool = True
    device: str | None = None
    dynamic: Mapping[str, Any] | None = None
    moving_average_decay: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    def average_decay(self, run_decay: float | None) -> float | None:
        """The decay of this variable's moving average in a run whose ``--moving-average-decay`` is
        ``run_decay``: its own if declared (0.0: None), else the run's for a trainable static variable."""
        decay = self.moving_average_decay
        if decay is None:
            return run_decay if self.trainable and self.dynamic is None and run_decay else None
        return decay if decay != 0.0 else None


@dataclass(frozen=True)
class ModelConfig:
    """What a model is built from: the data's features and the run's model settings.

    Recorded with checkpoints and exported models, so ``psflow predict``
    rebuilds the same model. JSON-able (see :meth:`to_dict`).

    Attributes:
        features: the batch's features (names and sizes), from the data format
            and schema; a model sizes its tables from them.
        num_features: size of the shared hashed id space of models with one
            table for every sparse feature (``logistic``, ``fm``).
        partitions: partitions of each large table along axis 0 (1: none).
        embedding_dim: width of embedding tables.
        params: model-specific settings (``--model-param KEY=VALUE``).
        seed: seed of random initializers.
    """

    features: BatchSpec = field(default_factory=BatchSpec)
    num_features: int = 1 << 20
    partitions: int = 1
    embedding_dim: int = 8
    params: Mapping[str, Any] = field(default_factory=dict)
    seed: int = 0

    def __post_init__(self) -> None:
        checks = [
            (self.num_features >= 1, f"num_features must be >= 1, got {self.num_features}"),
            (self.partitions >= 1, f"partitions must be >= 1, got {self.partitions}"),
            (self.embedding_dim >= 1, f"embedding_dim must be >= 1, got {self.embedding_dim}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ModelError(f"model config: {message}")
        try:
            object.__setattr__(self, "params", MappingProxyType(json.loads(json.dumps(dict(self.params)))))
        except (TypeError, ValueError) as e:
            raise ModelError(f"model config: params must be JSON-able: {e}") from e

    def param(self, key: str, default: Any) -> Any:
        """``params[key]``, or ``default`` when it is not set."""
        return self.params.get(key, default)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; :meth:`from_dict` inverts it."""
        return {"features": self.features.to_dict(), "num_features": self.num_features, "partitions": self.partitions,
                "embedding_dim": self.embedding_dim, "params": dict(self.params), "seed": self.seed}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ModelConfig:
        """Raises ModelError on a malformed dict."""
        try:
            return cls(BatchSpec.from_dict(data.get("features") or {}), int(data.get("num_features", 1 << 20)),
                       int(data.get("partitions", 1)), int(data.get("embedding_dim", 8)), dict(data.get("params") or {}),
                       int(data.get("seed", 0)))
        except (TypeError, ValueError, AttributeError) as e:
            raise ModelError(f"bad model config {dict(data)!r:.200}: {e}") from e


@dataclass(frozen=True)
class ModelOutput:
    """What :meth:`Model.compute` returns for one batch.

    Attributes:
        loss: the batch's mean loss.
        gradients: variable name -> gradient of ``loss`` (variables without
            one this step are left out).
        outputs: per-example arrays the metrics need (first axis: examples).
            ``"predictions"`` is what evaluation scores and ``psflow predict``
            writes (for a binary classifier: the probability of the positive
            class); models may add others (``"logits"``).
    """

    loss: float
    gradients: Gradients
    outputs: Mapping[str, np.ndarray]


class Model(ABC):
    """Base class of every model; see the module docstring for the step's order.

    Subclasses are built with ``cls(config)`` (override :meth:`__init__` to
    read ``config``) and found by name through :mod:`psflow.models.registry`.
    """

    #: Written into logs and errors; the registry sets it to the name a model was created by.
    name: str = "model"
    #: The labels this model accepts (a class attribute: the launcher reads it from the class); the readers
    #: refuse others as bad records. Default any finite label; a binary classifier sets
    #: :data:`psflow.data.BINARY_LABELS` (0 or 1), a classifier of k classes ``LabelSpec(0, k - 1, integer=True)``.
    labels: ClassVar[LabelSpec] = FINITE_LABELS
    #: Clip each step's gradients, all of them together, to this global norm before the push (None: no
    #: clipping). A subclass may set it; the run's ``--clip-gradient-norm`` replaces it (psflow.train.build).
    clip_gradient_norm: float | None = None

    def __init__(self, config: ModelConfig) -> None:
        self.config = config

    @abstractmethod
    def variables(self) -> Sequence[VariableSpec]:
        """Every variable, in a fixed order (the same on every process for the same config)."""

    def prepare(self, batch: Batch) -> Batch:
        """``batch`` with what the step derives from it alone in ``extras`` (default: unchanged).

        Runs in the input pipeline when it can (possibly another process):
        a pure function of the batch, with the same rows.
        """
        return batch

    @abstractmethod
    def lookups(self, batch: Batch) -> Lookups:
        """Variable name -> the ids whose rows this batch needs, or None for the whole variable."""

    @abstractmethod
    def compute(self, batch: Batch, values: Values) -> ModelOutput:
        """Loss, gradients and outputs of ``batch`` given the pulled ``values`` (see :data:`Values`)."""

    @abstractmethod
    def predict(self, batch: Batch, values: Values) -> dict[str, np.ndarray]:
        """The outputs of ``batch`` (as in :attr:`ModelOutput.outputs`), without gradients."""

    def metrics(self, labels: np.ndarray, outputs: Mapping[str, np.ndarray]) -> dict[str, float]:
        """Metrics of one set of outputs (default: a binary classifier's AUC, log-loss, accuracy)."""
        return binary_metrics(labels, outputs["predictions"])

    def initial_values(self) -> Mapping[str, np.ndarray]:
        """Values the chief loads into a fresh cluster in place of some variables' initializers (default: none).

        For models whose parameters start from values computed on the client,
        e.g. a PyTorch module as its constructor initialized it
        (:mod:`psflow.torch`). Called only by the chief, only when it
        initializes a fresh cluster (never on a restore); a ``--warm-start``
        overrides these values. Each array must have its variable's shape and
        dtype (checked before anything is sent).
        """
        return {}

    def place(self, devices: Sequence[str]) -> None:
        """Computes the training steps on ``devices``: one replica of the model (a tower) on each.

        Called once, before the first step, with the run's devices
        (``--device``, ``--towers``, ``--devices``; ``("cpu",)`` by default).
        The default accepts only ``("cpu",)``: a numpy model computes on the
        CPU, in one replica. :class:`psflow.torch.TorchModel` splits each batch
        over its towers (see its docstring).

        Raises:
            ModelError: devices or towers this model cannot use (names the model).
        """
        if list(devices) != ["cpu"]:
            raise ModelError(f"model {self.name!r} computes with numpy on the CPU, in one replica: towers and devices "
                             f"({', '.join(devices)}) need a PyTorch model (psflow.torch.TorchModel)")

    def describe(self) -> str:
        """One line for logs: the model, its variables and their size."""
        specs = list(self.variables())
        total = sum(int(np.prod(s.shape, dtype=np.int64)) * DTYPE_SIZES[s.dtype] for s in specs)
        size = f"{total / 2**20:.1f} MiB" if total >= 2**20 else f"{total / 2**10:.1f} KiB"
        return f"model {self.name!r}: {len(specs)} variables, {size} (before optimizer slots)"
