"""What a module's ``forward`` receives: one batch, as tensors, with its pulled embedding rows."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from psflow.data import Batch
from psflow.models.api import ModelError
from psflow.models.features import dense_matrix
from psflow.torch.embedding import LookupPlan
from psflow.torch.lookup_rows import gather_rows

__all__ = ["Inputs"]


class Inputs:
    """One batch for a module's ``forward``: labels, dense features, and the lookups of its embedding modules.

    Built by :class:`~psflow.torch.TorchModel` for every step and evaluation
    chunk; a module reads what it needs::

        def forward(self, inputs):
            x = torch.cat([self.embeddings(inputs), inputs.dense()], dim=1)
            return self.mlp(x).squeeze(1)

    On a tower of another device (``psflow train --device cuda``), every
    tensor it gives is on that device (:attr:`device`); a module that makes
    tensors of its own puts them there too (``torch.zeros(..., device=inputs.device)``).

    Attributes:
        batch: the batch (numpy).
        labels: its labels, float32 ``[n]``.
        num_examples: ``n``.
        device: where the tensors it gives are (``cpu`` unless the model runs on another device).
    """

    def __init__(self, batch: Batch, plans: Mapping[int, LookupPlan], rows: Mapping[int, torch.Tensor],
                 dense_names: Sequence[str], *, device: torch.device | None = None) -> None:
        self.batch = batch
        self.num_examples = batch.num_examples
        self.device = device if device is not None else torch.device("cpu")
        self._to = device if device is not None and device.type != "cpu" else None  # None: CPU tensors, no copies
        self.labels = self._on(torch.from_numpy(np.ascontiguousarray(batch.labels, dtype=np.float32)))
        self._plans = plans
        self._rows = rows  # per lookup module: its plan's tables' pulled rows, stacked in the plan's order
        self._dense_names = tuple(dense_names)
        self._dense: dict[tuple[str, ...], torch.Tensor] = {}
        self._gathered: dict[int, torch.Tensor] | None = None  # per lookup module: its entries' scaled rows

    def dense(self, names: Sequence[str] | None = None) -> torch.Tensor:
        """The dense features ``names`` (default: every one, in the data's order) side by side, float32 ``[n, width]``."""
        key = tuple(names) if names is not None else self._dense_names
        out = self._dense.get(key)
        if out is None:
            out = self._on(torch.from_numpy(dense_matrix(self.batch, key).astype(np.float32)))
            self._dense[key] = out
        return out

    def _on(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if self._to is None else tensor.to(self._to, non_blocking=True)

    def feature(self, name: str) -> torch.Tensor:
        """Dense feature ``name`` in its own shape, float32 ``[n, ...]`` (e.g. an image ``[n, 8, 8]``)."""
        try:
            value = self.batch.dense[name]
        except KeyError:
            raise ModelError(f"the batch has no dense feature {name!r} (it has {', '.join(self.batch.dense) or 'none'})") from None
        return self._on(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)))

    def lookup(self, module: nn.Module) -> torch.Tensor:
        """The result of an :class:`~psflow.torch.Embedding` or :class:`~psflow.torch.EmbeddingCollection` of the model."""
        plan = self._plans.get(id(module))
        if plan is None:
            raise ModelError(f"{type(module).__name__} {module!r:.80} is not an embedding module of this model "
                             "(a module must be an attribute of the model's module when the model is built)")
        if self._gathered is None:  # every group's rows at once: one node of the autograd graph (lookup_rows)
            keys = list(self._plans)
            gathered = gather_rows([(self._plans[k].index, self._plans[k].weights) for k in keys],
                                   *(self._rows[k] for k in keys))
            self._gathered = dict(zip(keys, gathered, strict=True))
        # Bags of m entries each -- one id per field, as in Criteo -- are summed by a reshape. (torch's
        # embedding_bag would pool too, but its backward sorts the entries: 2-3x slower here.)
        contrib = self._gathered[id(module)]
        m = plan.entries_per_bag
        if m == 1:
            out = contrib
        elif m > 1:
            out = contrib.reshape(plan.num_bags, m, -1).sum(dim=1)
        else:
            out = contrib.new_zeros((plan.num_bags, contrib.shape[1])).index_add(0, self._on(torch.from_numpy(plan.bags)), contrib)
        return out.reshape(plan.num_examples, -1)
