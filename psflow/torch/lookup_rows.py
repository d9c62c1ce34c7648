"""One autograd node for every embedding lookup of a step: a gather of the rows forward, a scatter-add back.

Each lookup group (an :class:`~psflow.torch.Embedding` or :class:`~psflow.torch.EmbeddingCollection`)
holds its tables' pulled rows in one leaf tensor, the rows of table after table (its
:class:`~psflow.torch.embedding.LookupPlan` offsets each table's ids into one id space). Per group, the
lookup is ``rows[index] * weights`` (every entry's row, scaled by its combiner weight), then pooled into
its bags. :func:`gather_rows` does the first half for every group of a step at once, as one node of the
autograd graph (Wide & Deep: 52 tables in 2 groups, where PyTorch ops would make 3 nodes per group); the
pooling stays in PyTorch (a reshape, a sum, or an ``index_add`` into the bags), as before.

Forward, per group: ``out[e] = rows[index[e]] * weights[e]``. Backward, per group whose output was used:
``grad_rows[r] = sum of grad[e] * weights[e] over the entries e with index[e] = r``, each product rounded to
float32 and added in entry order, from +0.0: the additions of PyTorch's ``mul`` and ``index_add_``, so a
step gives the same float32 loss and gradients as the three ops per group did (tests/unit/torch/
test_fused_lookup.py compares them exactly). A group whose output no module used gets no gradient (None),
so nothing is pushed for its tables, as before.

The loops are C (``psflow/torch/_lookup.c``, :func:`kernels`) on CPU tensors where it was built and
``PSFLOW_NATIVE`` is not ``0``; elsewhere (a GPU tower, no C compiler) their torch twins below, with the same
results. Thread-safe: nothing is shared between calls (CPU towers call it from their threads).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from psflow.native.loader import load_extension

__all__ = ["gather_rows", "kernels"]

#: One group's entries: per entry its row in the group's leaf (int64) and its weight (float32).
Entries = tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]

_kernels = load_extension("psflow.torch._lookup")


def kernels() -> ModuleType | None:
    """The C loops (``psflow.torch._lookup``), or None where the torch twins run (not built, ``PSFLOW_NATIVE=0``)."""
    return _kernels


def gather_rows(entries: Sequence[Entries], *rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per group, ``rows[index] * weights[:, None]`` (``[entries, width]``): one autograd node for all groups.

    Args:
        entries: per group, its entries' ``(index, weights)`` (a :class:`LookupPlan`'s ``index`` and ``weights``).
        rows: per group, its leaf ``[rows, width]`` (float32), in the order of ``entries``.

    Returns:
        Per group, its entries' scaled rows, on the group's device.

    Raises:
        ValueError: an index outside its group's rows, or entries and rows of different lengths.
    """
    if len(entries) != len(rows):
        raise ValueError(f"gather_rows: {len(entries)} groups of entries for {len(rows)} leaves of rows")
    out: tuple[torch.Tensor, ...] = _GatherRows.apply(tuple(entries), *rows)  # type: ignore[no-untyped-call]
    return out


class _GatherRows(torch.autograd.Function):
    """The node: forward gathers and scales every group's rows; backward scatter-adds every used group's gradient."""

    @staticmethod
    def forward(ctx: Any, entries: tuple[Entries, ...], *rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.set_materialize_grads(False)  # an unused group's gradient stays None: nothing pushed for its tables
        ctx.entries = entries
        ctx.shapes = [(r.shape[0], r.shape[1], r.device) for r in rows]
        return tuple(_gather(r.detach(), index, weights) for r, (index, weights) in zip(rows, entries, strict=True))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        out: list[torch.Tensor | None] = [None]  # the entries: not a tensor
        for g, (index, weights), (num_rows, width, device) in zip(grads, ctx.entries, ctx.shapes, strict=True):
            out.append(None if g is None else _scatter(g, index, weights, num_rows, width, device))
        return tuple(out)


def _native(t: torch.Tensor) -> bool:
    return _kernels is not None and t.device.type == "cpu" and t.dtype == torch.float32


def _gather(rows: torch.Tensor, index: npt.NDArray[np.int64], weights: npt.NDArray[np.float32]) -> torch.Tensor:
    if _native(rows):
        assert _kernels is not None
        out = torch.empty((index.shape[0], rows.shape[1]), dtype=torch.float32)
        _kernels.gather_scaled(rows.contiguous().numpy(), index, weights, out.numpy())
        return out
    idx, w = _on(index, rows.device), _on(weights, rows.device)  # the twin: index_select and mul
    return rows.index_select(0, idx) * w[:, None]


def _scatter(grad: torch.Tensor, index: npt.NDArray[np.int64], weights: npt.NDArray[np.float32], num_rows: int,
             width: int, device: torch.device) -> torch.Tensor:
    if _native(grad):
        assert _kernels is not None
        out = torch.empty((num_rows, width), dtype=torch.float32)
        _kernels.scatter_scaled(grad.contiguous().numpy(), index, weights, out.numpy())
        return out
    idx, w = _on(index, device), _on(weights, device)  # the twin: mul and index_add_ into zeros
    return torch.zeros((num_rows, width), dtype=grad.dtype, device=device).index_add_(0, idx, grad * w[:, None])


def _on(a: npt.NDArray[Any], device: torch.device) -> torch.Tensor:
    t = torch.from_numpy(a)
    return t if device.type == "cpu" else t.to(device, non_blocking=True)
