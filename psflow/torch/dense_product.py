"""Dense's ``x @ kernel + bias`` and its gradients: oneDNN's matrix products where PyTorch has them.

On the CPU, ``torch.addmm`` and the products of its backward run in MKL, which on this project's AMD EPYC
machines takes its AVX2 path (~110 GFLOP/s on one core); oneDNN, which PyTorch ships beside it, runs the
same float32 products in AVX-512 at ~230 GFLOP/s. A W&D step (batch 512, hidden 256, 128) spends most of
its CPU in these products: six per step, ~2.7 ms with MKL, ~1.3 ms with oneDNN (benchmarks/RESULTS.md,
section wd_step_onednn).

:func:`dense_product` is one autograd node: forward ``y = x @ kernel + bias``; backward
``dx = dy @ kernel^T``, ``dkernel = x^T @ dy``, ``dbias = dy.sum(0)`` (the sum ``addmm``'s backward takes),
each product by oneDNN's linear op (``torch.ops.mkldnn._linear_pointwise``, the op PyTorch's own compiler
emits for a linear layer on the CPU) on views, without copies.

Where it runs: 2-d float32 CPU tensors whose product has at least :data:`MIN_MACS` multiply-adds (a
smaller one, as W&D's ``128 -> 1`` layer, costs more in oneDNN's set-up than it saves), in a PyTorch
built with oneDNN. Everywhere else (a GPU tower, float64, a batched ``x``, a small product, a PyTorch
without the op) it is ``torch.addmm`` (``torch.matmul`` for a batched ``x``) and its own backward, exactly.

Results: oneDNN adds the products' terms in another order than MKL, so a step's loss and gradients agree
with the MKL step's to float32 rounding (relative ~1e-6), not bit for bit; the same inputs give the same
bits every time, at a given number of intra-op threads (:func:`psflow.torch.configure_threads`).
Thread-safe: nothing is shared between calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["MIN_MACS", "available", "dense_product", "runs_onednn"]

#: Products of fewer multiply-adds (rows x inputs x outputs) stay in ``torch.addmm``: W&D's last layer
#: (512 x 128 x 1) took 15 us in oneDNN against 5 us in MKL; its hidden layers (>= 16M) half MKL's time.
MIN_MACS = 1 << 20


def _find_linear() -> Callable[..., torch.Tensor] | None:
    """oneDNN's linear op, or None where this PyTorch was built without oneDNN (or lacks the op)."""
    if not torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        return None
    try:
        op: Callable[..., torch.Tensor] = torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None
    return op


#: ``linear(input, weight, bias)`` = ``input @ weight^T + bias`` by oneDNN, or None (then addmm runs).
_LINEAR = _find_linear()


def available() -> bool:
    """Whether oneDNN's products run here (PyTorch has the op)."""
    return _LINEAR is not None


def runs_onednn(x: torch.Tensor, kernel: torch.Tensor) -> bool:
    """Whether :func:`dense_product` of ``x`` and ``kernel`` runs in oneDNN (see the module docstring)."""
    return (_LINEAR is not None and x.dim() == 2 and kernel.dim() == 2 and x.dtype == torch.float32
            and kernel.dtype == torch.float32 and x.device.type == "cpu" and kernel.device.type == "cpu"
            and x.shape[0] * x.shape[1] * kernel.shape[1] >= MIN_MACS)


def dense_product(x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x @ kernel + bias`` (``x`` ``[n, in]``, ``kernel`` ``[in, out]``, ``bias`` ``[out]``), differentiable.

    Returns a new ``[n, out]`` tensor; in oneDNN where :func:`runs_onednn` holds, else ``torch.addmm``.
    """
    if not runs_onednn(x, kernel):
        if x.dim() == 2:
            return torch.addmm(bias, x, kernel)
        return torch.matmul(x, kernel) + bias
    out: torch.Tensor = _DenseProduct.apply(x, kernel, bias)  # type: ignore[no-untyped-call]
    return out


def _linear(a: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``a @ weight^T (+ bias)`` by oneDNN."""
    op = _LINEAR
    if op is None:  # runs_onednn checked it before the node was made; only a switch in between gets here
        raise RuntimeError("psflow.torch.dense_product: oneDNN's linear op was switched off during a step")
    return op(a, weight, bias, "none", [], "")


class _DenseProduct(torch.autograd.Function):
    """The node: forward and backward products in oneDNN, each on views of the saved tensors."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x, kernel)
        return _linear(x, kernel.t(), bias)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, kernel = ctx.saved_tensors
        grad = grad.contiguous()
        need_x, need_kernel, need_bias = ctx.needs_input_grad
        dx = _linear(grad, kernel, None) if need_x else None  # dy @ kernel^T
        dkernel = _linear(x.t(), grad.t(), None) if need_kernel else None  # x^T @ dy
        dbias = grad.sum(0) if need_bias else None
        return dx, dkernel, dbias
