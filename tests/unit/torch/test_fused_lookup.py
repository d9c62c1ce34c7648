"""psflow.torch's fused lookup: one autograd node gathers every group's rows and scatter-adds their gradients.

The reference is the per-group path psflow had before (d0a6ed0's ``Inputs.lookup``: per group a
gather, a scale and a pooling, each an autograd op), reproduced here by :class:`PerGroupInputs`. The
fused path keeps those pooling ops and does the gather-and-scale forward and the scale-and-scatter-add
backward in one node whose loops add in the same order as PyTorch's ``index_add``: the loss, the logits
and every pushed gradient are the same float32 values, compared exactly (not within a tolerance).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from test_torch_model import VOCAB, numpy_values, random_batch  # noqa: E402

import psflow.torch.model as torch_model  # noqa: E402
from psflow.data import BatchSpec  # noqa: E402
from psflow.gradients import SparseGradient  # noqa: E402
from psflow.models import ModelConfig, create_model  # noqa: E402
from psflow.models.api import ModelOutput  # noqa: E402
from psflow.native import ENV  # noqa: E402
from psflow.torch import Inputs, lookup_rows  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def skip_without_kernels() -> None:
    """Skips a test of the C loops where they were not built; fails instead under PSFLOW_REQUIRE_NATIVE=1
    (scripts/test.sh sets it wherever a C compiler is present)."""
    if lookup_rows.kernels() is None:
        if os.environ.get("PSFLOW_REQUIRE_NATIVE") == "1" and os.environ.get(ENV, "1") != "0":
            pytest.fail("psflow.torch._lookup was not built")
        pytest.skip("psflow.torch._lookup was not built (no C compiler)")


class PerGroupInputs(Inputs):
    """The lookup as it was: one gather, one scale and one pooling per group, each its own autograd op."""

    def lookup(self, module: torch.nn.Module) -> torch.Tensor:
        plan = self._plans[id(module)]
        weight = self._rows[id(module)]
        contrib = weight.index_select(0, torch.from_numpy(plan.index)) * torch.from_numpy(plan.weights)[:, None]
        m = plan.entries_per_bag
        if m == 1:
            out = contrib
        elif m > 1:
            out = contrib.reshape(plan.num_bags, m, -1).sum(dim=1)
        else:
            out = contrib.new_zeros((plan.num_bags, weight.shape[1])).index_add(0, torch.from_numpy(plan.bags), contrib)
        return out.reshape(plan.num_examples, -1)


def compute_both(model_name: str, one_id: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[ModelOutput, ModelOutput]:
    """One batch's step by the fused path and by the per-group path, on the same values."""
    rng = np.random.default_rng(11)
    params = {"hidden": [6, 5], "combiners": {"a": "sum", "b": "mean", "c": "sqrtn"}, "weighted": ["c"]}
    model = create_model(model_name, ModelConfig(BatchSpec(VOCAB, {"d0": 1, "d1": 1}), embedding_dim=4, params=params))
    batch = model.prepare(random_batch(rng, 48, dense=2, one_id=one_id))
    values = numpy_values(model, batch, rng)
    fused = model.compute(batch, values)
    with monkeypatch.context() as m:
        m.setattr(torch_model, "Inputs", PerGroupInputs)
        per_group = model.compute(batch, values)
    return fused, per_group


@pytest.mark.parametrize("one_id", [True, False], ids=["one-id-each", "ragged-pruned"])
@pytest.mark.parametrize("model_name", ["wide_deep", "deepfm"])
def test_fused_lookup_gives_the_per_group_paths_loss_and_pushed_gradients(model_name: str, one_id: bool,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fused, per_group = compute_both(model_name, one_id, monkeypatch)
    assert fused.loss == per_group.loss
    np.testing.assert_array_equal(fused.outputs["logits"], per_group.outputs["logits"])
    assert set(fused.gradients) == set(per_group.gradients)
    tables = [n for n, g in fused.gradients.items() if isinstance(g, SparseGradient)]
    assert len(tables) == 2 * len(VOCAB)  # the wide (linear) and the deep table of every field: pushed as before
    for name, g in fused.gradients.items():
        want = per_group.gradients[name]
        assert type(g) is type(want), name
        if isinstance(g, SparseGradient):
            assert isinstance(want, SparseGradient)
            np.testing.assert_array_equal(g.rows, want.rows, err_msg=name)
        assert g.values.dtype == want.values.dtype and g.values.shape == want.values.shape, name
        np.testing.assert_array_equal(g.values, want.values, err_msg=name)


@pytest.mark.parametrize("native", [True, False], ids=["C", "torch-twin"])
def test_the_kernels_and_their_torch_twins_gather_and_scatter_alike(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if native:
        skip_without_kernels()
    if not native:
        monkeypatch.setattr(lookup_rows, "_kernels", None)
    rng = np.random.default_rng(2)
    rows = torch.from_numpy(rng.normal(size=(37, 5)).astype(np.float32)).requires_grad_(True)
    index = rng.integers(0, 37, 300).astype(np.int64)
    index[:37] = np.arange(37)
    weights = rng.uniform(-2, 2, 300).astype(np.float32)
    (out,) = lookup_rows.gather_rows([(index, weights)], rows)
    np.testing.assert_array_equal(out.detach().numpy(), rows.detach().numpy()[index] * weights[:, None])
    d_out = torch.from_numpy(rng.normal(size=(300, 5)).astype(np.float32))
    out.backward(d_out)
    want = torch.zeros(37, 5).index_add_(0, torch.from_numpy(index), d_out * torch.from_numpy(weights)[:, None])
    assert rows.grad is not None
    np.testing.assert_array_equal(rows.grad.numpy(), want.numpy())  # same additions, in the same order


def test_a_group_whose_output_is_unused_gets_no_gradient() -> None:
    rng = np.random.default_rng(4)
    a = torch.from_numpy(rng.normal(size=(3, 2)).astype(np.float32)).requires_grad_(True)
    b = torch.from_numpy(rng.normal(size=(4, 1)).astype(np.float32)).requires_grad_(True)
    plans = [(np.array([0, 2, 2], np.int64), np.ones(3, np.float32)), (np.array([3, 1], np.int64), np.ones(2, np.float32))]
    out_a, _ = lookup_rows.gather_rows(plans, a, b)
    out_a.sum().backward()
    assert a.grad is not None and b.grad is None  # as a table no module looked up: nothing pushed for it
    np.testing.assert_array_equal(a.grad.numpy(), [[1, 1], [0, 0], [2, 2]])


def test_the_kernels_refuse_what_would_read_or_write_out_of_bounds() -> None:
    skip_without_kernels()
    kernels = lookup_rows.kernels()
    assert kernels is not None
    rows = np.zeros((3, 2), np.float32)
    out = np.zeros((2, 2), np.float32)
    ones = np.ones(2, np.float32)
    with pytest.raises(ValueError, match="row 3 is outside 0-2"):
        kernels.gather_scaled(rows, np.array([0, 3], np.int64), ones, out)
    with pytest.raises(ValueError, match="row -1 is outside 0-2"):
        kernels.scatter_scaled(out, np.array([-1, 0], np.int64), ones, rows)
    with pytest.raises(ValueError, match="one weight per index"):
        kernels.gather_scaled(rows, np.array([0, 1], np.int64), np.ones(3, np.float32), out)
    with pytest.raises(ValueError, match="out does not hold one row of rows per index"):
        kernels.gather_scaled(rows, np.array([0, 1], np.int64), ones, np.zeros((2, 3), np.float32))
    with pytest.raises(ValueError, match="index must be int64"):
        kernels.gather_scaled(rows, np.array([0, 1], np.int32), ones, out)
    with pytest.raises(ValueError, match="out must be float32"):
        kernels.scatter_scaled(out, np.array([0, 1], np.int64), ones, rows.astype(np.float64))
