"""psflow.torch.dense_product: Dense's ``x @ kernel + bias`` and its gradients, by oneDNN where PyTorch has it.

oneDNN adds the products in another order than MKL (``torch.addmm``), so the two agree to float32 rounding,
not bit for bit: compared within a tolerance here. What must hold exactly: the same inputs give the same
bits every time (a run is reproducible), and where oneDNN does not run (switched off, a small product, a
tensor that is not a 2-d float32 CPU one) the result is ``torch.addmm``'s and its autograd's, bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_torch_model import VOCAB, numpy_values, random_batch  # noqa: E402

from psflow.data import BatchSpec  # noqa: E402
from psflow.models import ModelConfig, create_model  # noqa: E402
from psflow.torch import Dense, dense_product  # noqa: E402

pytestmark = pytest.mark.timeout(120)

needs_onednn = pytest.mark.skipif(not dense_product.available(), reason="this PyTorch has no oneDNN linear op")

#: The W&D command's products (batch 512, 26 x 8 + 13 inputs, hidden 256, 128) and odd sizes.
SHAPES = [(512, 221, 256), (512, 256, 128), (37, 300, 70), (1, 64, 1024)]


def leaves(n: int, k: int, m: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, k, generator=g).requires_grad_()
    kernel = (torch.randn(k, m, generator=g) / k ** 0.5).requires_grad_()
    bias = torch.randn(m, generator=g).requires_grad_()
    upstream = torch.randn(n, m, generator=g)
    return x, kernel, bias, upstream


def run(product: object, x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor,
        upstream: torch.Tensor) -> list[np.ndarray]:
    """The output and the gradients of x, kernel and bias for ``upstream``, as numpy (fresh leaves each call)."""
    x, kernel, bias = (t.detach().clone().requires_grad_() for t in (x, kernel, bias))
    out = product(x, kernel, bias)  # type: ignore[operator]
    out.backward(upstream)
    return [t.detach().numpy().copy() for t in (out, x.grad, kernel.grad, bias.grad)]


def addmm(x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    return torch.addmm(bias, x, kernel)


@needs_onednn
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_onednn_product_and_gradients_equal_addmms_to_float32_rounding(shape: tuple[int, int, int]) -> None:
    x, kernel, bias, upstream = leaves(*shape, seed=sum(shape))
    assert dense_product.runs_onednn(x, kernel) == (shape[0] * shape[1] * shape[2] >= dense_product.MIN_MACS)
    got = run(dense_product.dense_product, x, kernel, bias, upstream)
    want = run(addmm, x, kernel, bias, upstream)
    for name, a, b in zip(("output", "x.grad", "kernel.grad", "bias.grad"), got, want, strict=True):
        assert a.dtype == np.float32 and a.shape == b.shape and a.flags.c_contiguous, name
        scale = float(np.abs(b).max())
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=2e-6 * scale, err_msg=name)


@needs_onednn
def test_onednn_product_gives_the_same_bits_every_time() -> None:
    x, kernel, bias, upstream = leaves(512, 221, 256, seed=3)
    first = run(dense_product.dense_product, x, kernel, bias, upstream)
    for _ in range(3):
        for a, b in zip(first, run(dense_product.dense_product, x, kernel, bias, upstream), strict=True):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", ["switched-off", "small", "float64", "batched-3d"])
def test_where_onednn_does_not_run_the_result_is_addmms_bit_for_bit(case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    shape = (4, 8, 2) if case == "small" else (512, 221, 256)
    x, kernel, bias, upstream = leaves(*shape, seed=5)
    if case == "switched-off":
        monkeypatch.setattr(dense_product, "_LINEAR", None)
    if case == "float64":
        x, kernel, bias, upstream = (t.double() for t in (x, kernel, bias, upstream))
    if case == "batched-3d":  # x [2, n, k]: torch.matmul's broadcasting, not a 2-d product
        x, upstream = x.reshape(2, -1, x.shape[1]), upstream.reshape(2, -1, upstream.shape[1])
        assert not dense_product.runs_onednn(x, kernel)
        x_, k_, b_ = (t.detach().clone().requires_grad_() for t in (x, kernel, bias))
        out = dense_product.dense_product(x_, k_, b_)
        out.backward(upstream)
        y_, kk_, bb_ = (t.detach().clone().requires_grad_() for t in (x, kernel, bias))
        want = torch.matmul(y_, kk_) + bb_
        want.backward(upstream)
        np.testing.assert_array_equal(out.detach().numpy(), want.detach().numpy())
        np.testing.assert_array_equal(x_.grad.numpy(), y_.grad.numpy())  # type: ignore[union-attr]
        return
    assert not dense_product.runs_onednn(x, kernel)
    for a, b in zip(run(dense_product.dense_product, x, kernel, bias, upstream), run(addmm, x, kernel, bias, upstream),
                    strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_kernel_without_gradient_gets_none_and_no_grad_mode_builds_no_graph() -> None:
    x, kernel, bias, upstream = leaves(512, 221, 256, seed=9)
    x_ = x.detach().clone()  # no gradient wanted for x (the first layer of a model without embeddings)
    kernel_ = kernel.detach().clone().requires_grad_()
    out = dense_product.dense_product(x_, kernel_, bias.detach())
    out.backward(upstream)
    assert x_.grad is None and kernel_.grad is not None
    with torch.no_grad():
        assert not dense_product.dense_product(x, kernel, bias).requires_grad


def test_dense_forward_is_the_dense_product() -> None:
    torch.manual_seed(0)
    layer = Dense(221, 256)
    with torch.no_grad():
        layer.kernel.normal_()
        layer.bias.normal_()
    x = torch.randn(512, 221)
    np.testing.assert_array_equal(layer(x).detach().numpy(),
                                  dense_product.dense_product(x, layer.kernel, layer.bias).detach().numpy())


@needs_onednn
@pytest.mark.parametrize("model_name", ["wide_deep", "deepfm", "dnn"])
def test_a_ctr_models_step_with_onednn_equals_the_addmm_step_to_float32_rounding(
        model_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    model = create_model(model_name, ModelConfig(BatchSpec(VOCAB, {"d0": 1, "d1": 1}), embedding_dim=8,
                                                 params={"hidden": [256, 128]}))
    batch = model.prepare(random_batch(rng, 512, dense=2, one_id=True))
    values = numpy_values(model, batch, rng)
    calls = []
    linear = dense_product._LINEAR
    monkeypatch.setattr(dense_product, "_LINEAR", lambda *args: calls.append(1) or linear(*args))  # type: ignore[misc]
    fast = model.compute(batch, values)
    assert len(calls) == 6  # forward and two backward products of the two hidden layers (the 128 -> 1 one is small)
    with monkeypatch.context() as m:
        m.setattr(dense_product, "_LINEAR", None)
        slow = model.compute(batch, values)
    assert fast.loss == pytest.approx(slow.loss, rel=1e-6)
    logits = slow.outputs["logits"]  # a logit near 0 is a difference of larger terms: tolerance from the largest
    np.testing.assert_allclose(fast.outputs["logits"], logits, rtol=1e-5, atol=1e-5 * float(np.abs(logits).max()))
    assert set(fast.gradients) == set(slow.gradients)
    for name, g in fast.gradients.items():
        want = slow.gradients[name].values
        np.testing.assert_allclose(g.values, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()), err_msg=name)
