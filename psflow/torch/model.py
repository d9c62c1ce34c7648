"""A PyTorch module trained on psflow: the module's parameters and tables live on the ps tasks.

:class:`TorchModel` is a :class:`psflow.models.Model` (the model seam), so a
module trains in every path psflow has -- between-graph and in-graph
replication, ``--in-process``, async, sync and ssp modes -- and is
checkpointed, recovered, exported and served like any model. Per step, on the
worker:

1. ``prepare`` (numpy, in the input pipeline where it can): every embedding
   module's lookup -- the batch's unique ids per table, combiner scales, bags;
2. ``lookups``: those ids' rows of each table (only the partitions holding
   them are asked), and every dense parameter whole;
3. ``compute``: the pulled values are put into the module's parameters and
   into leaf tensors of the looked-up rows; the module's ``forward`` (your
   code) gives the logits; autograd gives the gradients; dense parameters'
   gradients are pushed whole, the tables' as sparse gradients of exactly the
   rows pulled. The optimizers run on the ps tasks, with TensorFlow's formulas.

Variables: each parameter of the module is a ps variable named by its path
with ``/`` for ``.`` (``deep.layer0.kernel`` -> ``deep/layer0/kernel``), and
each :class:`~psflow.torch.Embedding` a table (its ``name``, or its path).
A parameter starts at the value the module's constructor gave it (the chief
loads those values into a fresh cluster; the module is built under
``torch.manual_seed(config.seed)``, so every process builds the same one),
unless it carries ``psflow_initializer`` (an initializer spec the ps tasks
apply, as :class:`~psflow.torch.Dense` sets).

Dynamic tables: an :class:`~psflow.torch.Embedding` given ``dynamic`` options is
a dynamic table, declared ``(0, dim)`` with no partitioner: its rows are keyed
by any int64 id, created on first use and spread over the ps tasks by id
(:mod:`psflow.ps.dynamic`). With run-wide options (``--embedding-table
dynamic``: :func:`psflow.models.api.dynamic_table` of the config) every
Embedding without options of its own becomes one with the run's, as the
built-in numpy models' tables do.

Optimizers: :meth:`TorchModel.param_groups` gives each group of parameters and
tables its optimizer (PyTorch's parameter groups, TensorFlow's per-variable
optimizers); an :class:`~psflow.torch.Embedding` may name its own; the rest
take the run's ``--optimizer``.

Towers and devices: :meth:`TorchModel.place` (``psflow train --device cuda``,
``--towers N``, ``--devices cuda:0,cuda:1``) runs each step on replicas of the
module, one per device, each on a slice of the batch, their gradients summed
on the worker and pushed once (:mod:`psflow.torch.towers`); N towers on a
batch push what one model pushes on it. On the CPU alone (the default) the
module itself computes, with no copies.

Threads: a process sharing cores with others should not run as many intra-op
threads as the machine has cores; see :func:`configure_threads`.

Not supported: module buffers (e.g. BatchNorm's running statistics: state
that would live on each worker, not on the ps tasks) are refused when the
model is built.
"""

from __future__ import annotations

import functools
import os
from abc import abstractmethod
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from psflow.data import Batch
from psflow.gradients import DenseGradient, SparseGradient
from psflow.models.api import Lookups, Model, ModelConfig, ModelError, ModelOutput, Values, VariableSpec, dynamic_table
from psflow.models.losses import binary_outputs
from psflow.optim import OptimizerSpec
from psflow.placement import fixed_size_partitioner
from psflow.torch.dense_product import dense_product
from psflow.torch.embedding import Embedding, EmbeddingCollection, LookupPlan
from psflow.torch.inputs import Inputs
from psflow.torch.towers import Tower, TowerPool, check_devices, split_batch, sum_on_cpu

__all__ = ["TorchModel", "ParamGroup", "Dense", "configure_threads", "threads_before_configured", "THREADS_ENV"]

#: Environment variable: intra-op threads of PyTorch in this process (the launcher sets it per task).
THREADS_ENV = "PSFLOW_TORCH_THREADS"
_threads_set = False
_threads_before: int | None = None  # PyTorch's intra-op threads before configure_threads first changed them


def configure_threads(threads: int | None = None) -> int:
    """Sets PyTorch's intra-op threads once per process; returns the number in use.

    ``threads``, else ``$PSFLOW_TORCH_THREADS``, else PyTorch's default (one
    per core). ``psflow train`` sets the variable for each task it starts to
    the cores divided by the worker processes sharing them (at least 1), so
    two workers on two cores run one thread each instead of four threads
    fighting over two cores; ``--in-process`` uses the cores minus one (its
    reader process parses on the other: with two intra-op threads sharing that
    core, W&D trained slower, 37-44k against 47-51k examples/s).
    Inter-op threads are set to 1 (a step is one chain of ops).
    """
    global _threads_set, _threads_before
    wanted = threads if threads is not None else int(os.environ.get(THREADS_ENV, "0") or 0)
    if wanted > 0 and wanted != torch.get_num_threads():
        if _threads_before is None:
            _threads_before = int(torch.get_num_threads())
        torch.set_num_threads(wanted)
    if not _threads_set:
        _threads_set = True
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set, or parallel work has already started in this process
            pass
    return int(torch.get_num_threads())


def threads_before_configured() -> int | None:
    """PyTorch's intra-op threads in this process before :func:`configure_threads` first changed them; None if
    it never did. What a caller that scoped a run's threads restores when PyTorch was first imported by the run
    (``run_in_process``)."""
    return _threads_before


@dataclass(frozen=True)
class ParamGroup:
    """Parameters and tables that share an optimizer on the ps tasks.

    Attributes:
        members: modules (every parameter and :class:`~psflow.torch.Embedding`
            inside them) and/or parameters.
        optimizer: their optimizer: an :class:`~psflow.optim.OptimizerSpec`
            or its JSON form (``{"name": "adagrad", "hyperparameters": {...}}``).
    """

    members: nn.Module | nn.Parameter | Iterable[nn.Module | nn.Parameter]
    optimizer: OptimizerSpec | Mapping[str, Any]

    def spec(self) -> OptimizerSpec:
        return self.optimizer if isinstance(self.optimizer, OptimizerSpec) else OptimizerSpec.from_json(dict(self.optimizer))

    def member_ids(self) -> set[int]:
        """``id()`` of every parameter and Embedding the group holds."""
        members = self.members
        items: Iterable[nn.Module | nn.Parameter] = [members] if isinstance(members, (nn.Module, nn.Parameter)) else members
        out: set[int] = set()
        for item in items:
            if isinstance(item, nn.Parameter):
                out.add(id(item))
            else:
                out.update(id(p) for p in item.parameters())
                out.update(id(m) for m in item.modules() if isinstance(m, Embedding))
        return out


class Dense(nn.Module):
    """A fully connected layer in TensorFlow's layout: ``x @ kernel + bias``, kernel ``[in, out]``.

    Its parameters start from initializer specs applied on the ps tasks
    (default: Glorot-uniform kernel, zero bias, as ``tf.layers.dense``), so a
    checkpoint of it reads like TensorFlow's. The product and its gradients run in oneDNN on the CPU where
    PyTorch has it (:mod:`psflow.torch.dense_product`: about twice MKL's speed here, equal to float32 rounding).
    """

    def __init__(self, in_features: int, out_features: int, *, seed: int = 0,
                 kernel_initializer: Mapping[str, Any] | None = None) -> None:
        super().__init__()
        self.kernel = nn.Parameter(torch.zeros(in_features, out_features))
        self.bias = nn.Parameter(torch.zeros(out_features))
        init = dict(kernel_initializer) if kernel_initializer is not None else {"name": "glorot_uniform", "seed": seed}
        self.kernel.psflow_initializer = init  # type: ignore[attr-defined]
        self.bias.psflow_initializer = {"name": "zeros"}  # type: ignore[attr-defined]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense_product(x, self.kernel, self.bias)


@dataclass(frozen=True)
class _Table:
    name: str
    module: Embedding


@dataclass(frozen=True)
class _Group:
    key: str
    module: nn.Module
    tables: tuple[_Table, ...]
    concat: bool


class TorchModel(Model):
    """A model whose computation is a ``torch.nn.Module`` (see the module docstring).

    Subclass it and implement :meth:`build`; override :meth:`loss`,
    :meth:`outputs`, :meth:`param_groups` or :meth:`metrics` as needed::

        class MyModel(TorchModel):
            def build(self):
                return MyNet(self.config)        # forward(inputs: psflow.torch.Inputs) -> logits [n]

    and train it with ``psflow train --model mypackage.mymodule:MyModel``.
    """

    def __init__(self, config: ModelConfig) -> None:
        super().__init__(config)
        configure_threads()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(config.seed)
            self.module = self.build()
        if not isinstance(self.module, nn.Module):
            raise ModelError(f"{type(self).__name__}.build() must return a torch.nn.Module, got {type(self.module).__name__}")
        buffers = [name for name, _ in self.module.named_buffers()]
        if buffers:
            raise ModelError(f"{type(self).__name__}: module buffers ({', '.join(buffers)}) are state outside the ps tasks; "
                             "psflow holds parameters only (use a layer without running statistics)")
        self._params = [(name.replace(".", "/"), p) for name, p in self.module.named_parameters()]
        self._groups, self._tables = self._find_embeddings()
        names = [n for n, _ in self._params] + [t.name for t in self._tables]
        duplicate = sorted({n for n in names if names.count(n) > 1})
        if duplicate:
            raise ModelError(f"{type(self).__name__}: variable names {duplicate} are used twice")
        self._optimizers = self._resolve_optimizers()
        self._dense_names = list(config.features.dense)
        self._devices: tuple[torch.device, ...] | None = None  # None: the module itself, on the CPU (see place)
        self._towers: list[Tower] = []  # built on the first step (place is called in processes that never step)
        self._pool: TowerPool | None = None

    # ---- what a subclass provides ---------------------------------------------------
    @abstractmethod
    def build(self) -> nn.Module:
        """The module (built from :attr:`config`); its ``forward(inputs)`` returns the logits."""

    def loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The batch's mean loss (default: sigmoid cross-entropy of logits ``[n]`` or ``[n, 1]``)."""
        return F.binary_cross_entropy_with_logits(logits.reshape(-1), labels)

    def outputs(self, logits: torch.Tensor) -> dict[str, np.ndarray]:
        """Per-example outputs for metrics and ``psflow predict`` (default: a binary classifier's ``predictions``, ``logits``)."""
        return binary_outputs(logits.detach().reshape(-1).numpy().astype(np.float64))

    def param_groups(self) -> Sequence[ParamGroup]:
        """Optimizers per group of parameters and tables (default: none; every variable takes the run's optimizer)."""
        return ()

    # ---- the seam ---------------------------------------------------------------------
    def _find_embeddings(self) -> tuple[list[_Group], list[_Table]]:
        run_dynamic = dynamic_table(self.config)  # --embedding-table dynamic: every table without options of its own
        tables: dict[int, _Table] = {}
        for path, m in self.module.named_modules():
            if isinstance(m, Embedding):
                if m.dynamic is None and run_dynamic is not None:
                    m.dynamic = dict(run_dynamic)
                tables[id(m)] = _Table(m.table_name or path.replace(".", "/"), m)
        groups: list[_Group] = []
        grouped: dict[int, str] = {}
        for path, m in self.module.named_modules():
            if isinstance(m, EmbeddingCollection):
                for e in m.embeddings:
                    if id(e) in grouped:
                        raise ModelError(f"{type(self).__name__}: table {tables[id(e)].name!r} is in two embedding "
                                         f"collections ({grouped[id(e)]!r} and {path!r})")
                    grouped[id(e)] = path
                groups.append(_Group(f"torch.{len(groups)}", m, tuple(tables[id(e)] for e in m.embeddings),
                                     m.pooling == "concat"))
        for key, table in tables.items():
            if key not in grouped:
                groups.append(_Group(f"torch.{len(groups)}", table.module, (table,), True))
        return groups, list(tables.values())

    def _resolve_optimizers(self) -> dict[str, OptimizerSpec]:
        by_id = {id(p): n for n, p in self._params} | {id(t.module): t.name for t in self._tables}
        out: dict[str, OptimizerSpec] = {}
        for group in self.param_groups():
            spec = group.spec()
            for member in group.member_ids():
                name = by_id.get(member)
                if name is not None:
                    out.setdefault(name, spec)
        for t in self._tables:
            if t.module.optimizer is not None:
                out[t.name] = t.module.optimizer
        return out

    def variables(self) -> list[VariableSpec]:
        specs = []
        seed = self.config.seed
        for i, t in enumerate(self._tables):
            e = t.module
            if e.dynamic is not None:  # rows keyed by any int64 id, spread over the ps tasks by id: no partitioner
                specs.append(VariableSpec(t.name, (0, e.embedding_dim), initializer=e.default_initializer(seed + i),
                                          optimizer=self._optimizers.get(t.name), dynamic=dict(e.dynamic)))
                continue
            parts = min(e.partitions or self.config.partitions, e.num_embeddings)
            specs.append(VariableSpec(t.name, (e.num_embeddings, e.embedding_dim), initializer=e.default_initializer(seed + i),
                                      partitioner=fixed_size_partitioner(parts) if parts > 1 else None,
                                      optimizer=self._optimizers.get(t.name)))
        for name, p in self._params:
            init = getattr(p, "psflow_initializer", None) or {"name": "zeros"}
            specs.append(VariableSpec(name, tuple(p.shape), initializer=init, optimizer=self._optimizers.get(name),
                                      trainable=p.requires_grad))
        return specs

    def initial_values(self) -> dict[str, np.ndarray]:
        """The module's parameters as built, except those with a ``psflow_initializer``."""
        return {name: p.detach().numpy().astype(np.float32, copy=True) for name, p in self._params
                if getattr(p, "psflow_initializer", None) is None}

    def prepare(self, batch: Batch) -> Batch:
        """Every embedding module's :class:`~psflow.torch.embedding.LookupPlan`, into ``extras`` (numpy only)."""
        extras = dict(batch.extras)
        cache: dict[Any, Any] = {}
        for g in self._groups:
            plan = LookupPlan.build(batch, [(t.name, t.module) for t in g.tables], concat=g.concat, cache=cache)
            extras.update(plan.to_extras(g.key))
        return replace(batch, extras=extras)

    def _plans(self, batch: Batch) -> list[LookupPlan]:
        try:
            return [LookupPlan.from_extras(batch.extras, g.key, tuple(t.name for t in g.tables)) for g in self._groups]
        except KeyError:
            raise ModelError(f"model {self.name!r}: the batch was not prepared (call model.prepare(batch) first)") from None

    def lookups(self, batch: Batch) -> Lookups:
        requests: Lookups = {}
        for plan in self._plans(batch):
            for table, ids in zip(plan.tables, plan.ids, strict=True):
                requests[table] = ids
        requests.update(dict.fromkeys(name for name, _ in self._params))
        return requests

    def _inputs(self, batch: Batch, values: Values, *, grad: bool) -> tuple[Inputs, list[LookupPlan], list[torch.Tensor]]:
        """The module's input, the batch's plans, and per plan one leaf tensor: its tables' pulled rows stacked
        in the plan's order (one gather in forward, one gradient in backward, for all of a group's tables)."""
        with torch.no_grad():
            for name, p in self._params:
                p.copy_(torch.from_numpy(_readable(values[name])).reshape(p.shape))
        plans = self._plans(batch)
        stacked = [torch.from_numpy(rows).requires_grad_(grad) for rows in self._stacked_rows(plans, values)]
        by_module = {id(g.module): plan for g, plan in zip(self._groups, plans, strict=True)}
        weights = {id(g.module): w for g, w in zip(self._groups, stacked, strict=True)}
        return Inputs(batch, by_module, weights, self._dense_names), plans, stacked

    def compute(self, batch: Batch, values: Values) -> ModelOutput:
        if self._devices is not None:
            return self._compute_on_towers(batch, values)
        inputs, plans, stacked = self._inputs(batch, values, grad=True)
        if not self.module.training:  # train() walks every submodule: ~0.3 ms a step otherwise
            self.module.train()
        for _, p in self._params:
            p.grad = None
        logits = self.module(inputs)
        loss = self.loss(logits, inputs.labels)
        loss.backward()  # type: ignore[no-untyped-call]
        grads: dict[str, DenseGradient | SparseGradient] = {}
        for name, p in self._params:
            if p.grad is not None:
                grads[name] = DenseGradient(p.grad.numpy())
        for plan, weight in zip(plans, stacked, strict=True):
            if weight.grad is None:
                continue
            g = weight.grad.numpy()
            start = 0
            for table, ids in zip(plan.tables, plan.ids, strict=True):
                if ids.size:
                    grads[table] = SparseGradient(ids, g[start:start + ids.size])
                start += ids.size
        return ModelOutput(float(loss.detach()), grads, self.outputs(logits))

    def predict(self, batch: Batch, values: Values) -> dict[str, np.ndarray]:
        if self._devices is not None:
            return self._predict_on_tower(batch, values)
        inputs, _, _ = self._inputs(batch, values, grad=False)
        if self.module.training:
            self.module.eval()
        with torch.no_grad():
            return self.outputs(self.module(inputs))

    # ---- towers and devices (psflow.torch.towers) ------------------------------------------
    def place(self, devices: Sequence[str]) -> None:
        """Runs the steps on ``devices``, one tower (a replica of the module) on each; see :mod:`psflow.torch.towers`.

        ``("cpu",)`` (the default) keeps the module itself on the CPU, with no
        copies. Anything else -- a GPU, or several towers -- builds the towers
        on the first step; :meth:`predict` then runs on the first tower.

        Raises:
            ModelError: a device PyTorch does not see (``PyTorch sees no GPU (torch.cuda.is_available() is False)``).
        """
        parsed = check_devices(devices)
        self._devices = None if parsed == (torch.device("cpu"),) else parsed
        self._towers = []
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def describe(self) -> str:
        """One line for logs; with towers, where they run (``..., 2 towers: cpu, cpu``)."""
        line = super().describe()
        if self._devices is None:
            return line
        return f"{line}, {len(self._devices)} tower{'s' if len(self._devices) > 1 else ''}: " + \
            ", ".join(str(d) for d in self._devices)

    def _tower_pool(self) -> tuple[list[Tower], TowerPool]:
        if self._pool is None or not self._towers:
            self._towers = [Tower.replicate(self.module, device) for device in self._devices or ()]
            self._pool = TowerPool(len(self._towers))
        return self._towers, self._pool

    def _tower_inputs(self, tower: Tower, batch: Batch, plans: Sequence[LookupPlan], rows: Sequence[np.ndarray], *,
                      grad: bool) -> tuple[Inputs, list[torch.Tensor]]:
        """``batch`` (a tower's slice, ``plans`` cut to it) as the tower's input, and its leaf tensors of the pulled rows."""
        leaves = [torch.from_numpy(r).to(tower.device).requires_grad_(grad) for r in rows]
        modules = [tower.counterpart[id(g.module)] for g in self._groups]
        by_module = {id(m): plan for m, plan in zip(modules, plans, strict=True)}
        weights = {id(m): leaf for m, leaf in zip(modules, leaves, strict=True)}
        device = tower.device if tower.device.type != "cpu" else None
        return Inputs(batch, by_module, weights, self._dense_names, device=device), leaves

    def _stacked_rows(self, plans: Sequence[LookupPlan], values: Values) -> list[np.ndarray]:
        """Per plan, its tables' pulled rows stacked in the plan's order (as :meth:`_inputs` stacks them)."""
        out = []
        for plan in plans:
            parts = [values[table] for table in plan.tables]
            out.append(_readable(parts[0]) if len(parts) == 1 else np.concatenate(parts, axis=0, dtype=np.float32))
        return out

    def _tower_step(self, tower: Tower, batch: Batch, plans: Sequence[LookupPlan], rows: Sequence[np.ndarray],
                    values: Values, share: float) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor | None],
                                                           list[torch.Tensor | None]]:
        """One tower's forward and backward on its slice, its loss weighted by ``share`` (its examples / the batch's).

        Returns its loss (unweighted), logits, and the weighted gradients of its parameters and of its row leaves.
        """
        tower.load(lambda name: _readable(values[name]))
        inputs, leaves = self._tower_inputs(tower, batch, plans, rows, grad=True)
        if not tower.module.training:
            tower.module.train()
        for _, p in tower.params:
            p.grad = None
        logits = tower.module(inputs)
        loss = self.loss(logits, inputs.labels)
        (loss * share).backward()  # type: ignore[no-untyped-call]
        return loss.detach(), logits.detach(), [p.grad for _, p in tower.params], [leaf.grad for leaf in leaves]

    def _compute_on_towers(self, batch: Batch, values: Values) -> ModelOutput:
        towers, pool = self._tower_pool()
        plans = self._plans(batch)
        rows = self._stacked_rows(plans, values)
        n = batch.num_examples
        slices = split_batch(n, len(towers))  # towers beyond the examples sit the step out
        shares = [(b - a) / n if n else 1.0 for a, b in slices]
        calls = [functools.partial(self._tower_step, tower, batch.slice(a, b), [p.slice_examples(a, b) for p in plans],
                                   rows, values, share)
                 for tower, (a, b), share in zip(towers, slices, shares, strict=False)]
        results = pool.map(calls)
        loss = float(sum(share * float(r[0]) for share, r in zip(shares, results, strict=True)))
        grads: dict[str, DenseGradient | SparseGradient] = {}
        for i, (name, _) in enumerate(self._params):
            dense = [d for r in results if (d := r[2][i]) is not None]
            if dense:
                grads[name] = DenseGradient(sum_on_cpu(dense).numpy())
        for j, plan in enumerate(plans):
            rows_grads = [w for r in results if (w := r[3][j]) is not None]
            if not rows_grads:
                continue
            g = sum_on_cpu(rows_grads).numpy()
            start = 0
            for table, ids in zip(plan.tables, plan.ids, strict=True):
                if ids.size:
                    grads[table] = SparseGradient(ids, g[start:start + ids.size])
                start += ids.size
        logits = torch.cat([r[1].to("cpu") for r in results])
        return ModelOutput(loss, grads, self.outputs(logits))

    def _predict_on_tower(self, batch: Batch, values: Values) -> dict[str, np.ndarray]:
        tower = self._tower_pool()[0][0]
        plans = self._plans(batch)
        tower.load(lambda name: _readable(values[name]))
        inputs, _ = self._tower_inputs(tower, batch, plans, self._stacked_rows(plans, values), grad=False)
        if tower.module.training:
            tower.module.eval()
        with torch.no_grad():
            return self.outputs(tower.module(inputs).to("cpu"))


def _readable(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous float32 array torch may wrap (a copy when it is read-only or of another dtype)."""
    if a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable:
        return a
    return np.array(a, dtype=np.float32, order="C")
