"""Towers (psflow.torch.towers): N replicas splitting a batch push what one model on the batch pushes.

CPU towers run here; the GPU tests run where PyTorch sees a GPU and skip elsewhere.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from support import REPO  # noqa: E402

from psflow.data import Batch, BatchSpec, SparseColumn  # noqa: E402
from psflow.gradients import SparseGradient  # noqa: E402
from psflow.models import ModelConfig, ModelError, create_model  # noqa: E402
from psflow.models.api import Model, ModelOutput  # noqa: E402
from psflow.torch import TorchModel  # noqa: E402
from psflow.torch.embedding import Embedding, LookupPlan  # noqa: E402
from psflow.torch.towers import check_devices, split_batch  # noqa: E402

GPU = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not GPU, reason="PyTorch sees no GPU (torch.cuda.is_available() is False)")
VOCAB = {"a": 9, "b": 5, "c": 13}
ATOL = 1e-6


def ragged_batch(rng: np.random.Generator, n: int, dense: int = 2) -> Batch:
    """0 to 3 ids per field and example (some examples without any), weights with zeros (pruned by weighted lookups)."""
    sparse = {}
    for name, vocab in VOCAB.items():
        counts = rng.integers(0, 4, n)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        values = rng.uniform(0.5, 2.0, indptr[-1]).astype(np.float32)
        values[::7] = 0.0
        sparse[name] = SparseColumn(indptr, rng.integers(0, vocab, indptr[-1]).astype(np.int64), values)
    return Batch(rng.integers(0, 2, n).astype(np.float32), sparse,
                 {f"d{i}": rng.normal(size=n).astype(np.float32) for i in range(dense)})


def wide_deep() -> TorchModel:
    config = ModelConfig(BatchSpec(VOCAB, {"d0": 1, "d1": 1}), embedding_dim=4,
                         params={"hidden": [6, 5], "combiners": {"a": "sum", "b": "mean", "c": "sqrtn"}, "weighted": ["c"]})
    model = create_model("wide_deep", config)
    assert isinstance(model, TorchModel)
    return model


def digits_cnn() -> TorchModel:
    model = create_model("examples.cnn_digits:DigitsCNN", ModelConfig(BatchSpec({}, {"image": 64})), search_path=str(REPO))
    assert isinstance(model, TorchModel)
    return model


def images(rng: np.random.Generator, n: int) -> Batch:
    return Batch(rng.integers(0, 10, n).astype(np.float32), {}, {"image": rng.uniform(0, 1, (n, 64)).astype(np.float32)})


def random_values(model: Model, batch: Batch, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = {s.name: s.shape for s in model.variables()}
    out = {}
    for name, ids in model.lookups(batch).items():
        whole = rng.normal(scale=0.3, size=shapes[name]).astype(np.float32)
        out[name] = whole if ids is None else whole[ids]
    return out


def assert_same_step(got: ModelOutput, want: ModelOutput, *, atol: float = ATOL) -> None:
    assert got.loss == pytest.approx(want.loss, abs=atol)
    assert set(got.gradients) == set(want.gradients)
    for name, g in got.gradients.items():
        w = want.gradients[name]
        assert type(g) is type(w), name
        if isinstance(g, SparseGradient):
            assert isinstance(w, SparseGradient)
            np.testing.assert_array_equal(g.rows, w.rows, err_msg=name)
        assert g.values.dtype == np.float32 and g.values.shape == w.values.shape, name
        # float32 sums in another order (N slices, then their sum; torch's threads split a reduction as they
        # run): a few ulps of the value apart, so relative to it as well as absolute near 0.
        np.testing.assert_allclose(g.values, w.values, rtol=1e-5, atol=atol, err_msg=name)
    for key, value in want.outputs.items():
        np.testing.assert_allclose(got.outputs[key], value, rtol=1e-5, atol=atol, err_msg=key)


CASES = {"wide_deep": (wide_deep, ragged_batch), "cnn": (digits_cnn, images)}


@pytest.mark.parametrize("towers", [2, 3, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_n_cpu_towers_push_what_one_model_pushes_on_the_batch(case: str, towers: int) -> None:
    make, data = CASES[case]
    rng = np.random.default_rng(7)
    one, many = make(), make()
    many.place(["cpu"] * towers)
    for _ in range(2):  # twice: the towers are reused, their parameters reloaded
        batch = one.prepare(data(rng, 37))  # 37: slices of unequal size
        values = random_values(one, batch, rng)
        want = one.compute(batch, values)
        assert_same_step(many.compute(batch, values), want)
        np.testing.assert_allclose(many.predict(batch, values)["predictions"], one.predict(batch, values)["predictions"],
                                   rtol=1e-5, atol=ATOL)


def test_more_towers_than_examples_leave_the_rest_idle() -> None:
    rng = np.random.default_rng(3)
    one, many = wide_deep(), wide_deep()
    many.place(["cpu"] * 4)
    batch = one.prepare(ragged_batch(rng, 3))
    values = random_values(one, batch, rng)
    assert_same_step(many.compute(batch, values), one.compute(batch, values))


def test_cpu_is_the_model_itself_with_no_towers() -> None:
    model = wide_deep()
    model.place(["cpu"])
    batch = model.prepare(ragged_batch(np.random.default_rng(1), 8))
    model.compute(batch, random_values(model, batch, np.random.default_rng(2)))
    assert model._devices is None and model._towers == []


def test_split_batch_gives_contiguous_slices_within_one_example() -> None:
    assert split_batch(10, 4) == [(0, 2), (2, 5), (5, 8), (8, 10)]  # numpy rounds 2.5 and 7.5 to even
    assert split_batch(37, 1) == [(0, 37)]
    assert split_batch(2, 4) == [(0, 1), (1, 2)]
    assert split_batch(0, 3) == [(0, 0)]
    for n in range(0, 30):
        for k in range(1, 6):
            slices = split_batch(n, k)
            assert slices[0][0] == 0 and slices[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(slices, slices[1:], strict=False))
            sizes = [b - a for a, b in slices]
            assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("concat", [True, False])
def test_a_plan_cut_to_some_examples_is_the_plan_of_those_examples_over_the_same_rows(concat: bool) -> None:
    batch = ragged_batch(np.random.default_rng(5), 20)
    specs = [(f"t/{f}", Embedding(f, v, 2, combiner="mean")) for f, v in VOCAB.items()]
    whole = LookupPlan.build(batch, specs, concat=concat)
    part = whole.slice_examples(6, 13)
    alone = LookupPlan.build(batch.slice(6, 13), specs, concat=concat)
    assert part.num_examples == 7 and part.ids is whole.ids
    # The same entries, pointing into the whole batch's rows instead of the slice's own.
    offsets = np.cumsum([0] + [ids.size for ids in whole.ids])
    rows_whole = np.concatenate([ids + 100 * t for t, ids in enumerate(whole.ids)])
    rows_alone = np.concatenate([ids + 100 * t for t, ids in enumerate(alone.ids)])
    assert offsets[-1] == rows_whole.size
    np.testing.assert_array_equal(rows_whole[part.index], rows_alone[alone.index])
    np.testing.assert_array_equal(part.weights, alone.weights)
    np.testing.assert_array_equal(part.bags, alone.bags)


def test_a_numpy_model_refuses_towers_and_devices_naming_itself() -> None:
    model = create_model("logistic", ModelConfig(num_features=10))
    model.place(["cpu"])
    with pytest.raises(ModelError, match=r"model 'logistic' computes with numpy on the CPU, in one replica: towers and devices "
                                         r"\(cpu, cpu\) need a PyTorch model"):
        model.place(["cpu", "cpu"])


@pytest.mark.skipif(GPU, reason="checks the error where PyTorch sees no GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:0", "cuda:1"])
def test_a_gpu_where_pytorch_sees_none_is_one_clear_error(device: str) -> None:
    with pytest.raises(ModelError, match=r"^PyTorch sees no GPU \(torch.cuda.is_available\(\) is False\)$"):
        check_devices([device])
    with pytest.raises(ModelError, match=r"^PyTorch sees no GPU"):
        wide_deep().place(["cpu", device])


def test_devices_pytorch_does_not_know_are_refused() -> None:
    with pytest.raises(ModelError, match=r"unknown device 'tpu'"):
        check_devices(["tpu"])
    with pytest.raises(ModelError, match="no devices"):
        check_devices([])


# --- on a GPU (skipped where PyTorch sees none) --------------------------------------------------------------
@needs_gpu
@pytest.mark.parametrize("devices", [["cuda"], ["cuda:0", "cuda:0"], ["cuda", "cpu"]])
@pytest.mark.parametrize("case", sorted(CASES))
def test_gpu_towers_push_what_the_cpu_pushes(case: str, devices: list[str]) -> None:
    make, data = CASES[case]
    rng = np.random.default_rng(11)
    cpu, gpu = make(), make()
    gpu.place(devices)
    batch = cpu.prepare(data(rng, 33))
    values = random_values(cpu, batch, rng)
    want = cpu.compute(batch, values)
    assert_same_step(gpu.compute(batch, values), want, atol=1e-5)  # GPU kernels sum in another order
    assert all(t.device.type == torch.device(d).type for t, d in zip(gpu._towers, devices, strict=True))
    assert next(gpu._towers[0].module.parameters()).is_cuda
    np.testing.assert_allclose(gpu.predict(batch, values)["predictions"], cpu.predict(batch, values)["predictions"],
                               rtol=1e-4, atol=1e-5)


@needs_gpu
def test_a_gpu_index_pytorch_does_not_see_is_named() -> None:
    count = torch.cuda.device_count()
    with pytest.raises(ModelError, match=rf"cuda:{count}: PyTorch sees {count} GPU"):
        check_devices([f"cuda:{count}"])
