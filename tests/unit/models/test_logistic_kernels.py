"""The logistic model's C loops (psflow/models/_logistic.c) give its numpy twins' numbers, bit for bit, and
refuse a wrong call instead of reading or writing outside its arrays."""

from __future__ import annotations

import os

import numpy as np
import pytest

import psflow.models.logistic as logistic
from psflow.data import Batch, SparseColumn
from psflow.gradients import DenseGradient, SparseGradient
from psflow.models import ModelConfig, ModelOutput, create_model

pytestmark = pytest.mark.timeout(60)


@pytest.fixture()
def kernels() -> object:
    """The extension; skipped where it was not built, failed under ``PSFLOW_REQUIRE_NATIVE=1`` (scripts/test.sh)."""
    if logistic._KERNELS is None:
        if os.environ.get("PSFLOW_REQUIRE_NATIVE") == "1":
            pytest.fail("PSFLOW_REQUIRE_NATIVE=1 but psflow.models._logistic is not importable (not built?)")
        pytest.skip("psflow.models._logistic was not built")
    return logistic._KERNELS


def _batch(rng: np.random.Generator, n: int, empty: bool, features: int) -> Batch:
    """``n`` examples of up to 40 entries over ``features`` ids (repeats within and across examples); with
    ``empty``, some examples have none."""
    counts = rng.integers(0 if empty else 1, 40, n)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ids = rng.zipf(1.3, int(indptr[-1])).astype(np.int64) % features
    values = rng.uniform(-2.0, 3.0, int(indptr[-1])).astype(np.float32)
    return Batch(rng.integers(0, 2, n).astype(np.float32), {"features": SparseColumn(indptr, ids, values)}, {})


def _compute(batch: Batch, seed: int) -> ModelOutput:
    model = create_model("logistic", ModelConfig(num_features=1 << 12))
    batch = model.prepare(batch)
    rng = np.random.default_rng(seed)
    values = {name: (rng.normal(size=(len(ids), 1)) if ids is not None else rng.normal(size=1)).astype(np.float32)
              for name, ids in model.lookups(batch).items()}
    return model.compute(batch, values)


def _same(a: ModelOutput, b: ModelOutput) -> None:
    assert np.float64(a.loss).tobytes() == np.float64(b.loss).tobytes()
    assert sorted(a.gradients) == sorted(b.gradients)
    for name, ga in a.gradients.items():
        gb = b.gradients[name]
        assert type(ga) is type(gb)
        if isinstance(ga, SparseGradient) and isinstance(gb, SparseGradient):
            assert ga.rows.tobytes() == gb.rows.tobytes()
        assert isinstance(ga, DenseGradient | SparseGradient) and isinstance(gb, DenseGradient | SparseGradient)
        assert ga.values.dtype == gb.values.dtype and ga.values.tobytes() == gb.values.tobytes(), name
    for key in a.outputs:
        assert a.outputs[key].tobytes() == b.outputs[key].tobytes(), key


class _Counting:
    """The extension, recording the name of each loop called through it."""

    def __init__(self, module: object, calls: list[str]) -> None:
        self._module, self._calls = module, calls

    def __getattr__(self, name: str) -> object:
        self._calls.append(name)
        return getattr(self._module, name)


@pytest.mark.parametrize("n, empty", [(512, False), (97, True), (1, False), (3, True)])
def test_compute_gives_the_numpy_twins_numbers(kernels: object, n: int, empty: bool,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(n)
    for trial in range(5):
        batch = _batch(rng, n, empty, 1 << 12)
        calls: list[str] = []
        with monkeypatch.context() as m:  # counts the C loops' calls: the twin compared with itself would pass too
            m.setattr(logistic, "_KERNELS", _Counting(kernels, calls))
            native = _compute(batch, trial)
        assert calls == ["entry_products", "row_gradients"]
        with monkeypatch.context() as m:
            m.setattr(logistic, "_KERNELS", None)
            twin = _compute(batch, trial)
        _same(native, twin)


def test_an_empty_batch_gives_zero_gradients(kernels: object) -> None:
    batch = Batch(np.zeros(0, np.float32), {"features": SparseColumn(np.zeros(1, np.int64), np.zeros(0, np.int64),
                                                                      np.zeros(0, np.float32))}, {})
    out = _compute(batch, 0)
    assert out.loss == 0.0 and out.gradients["weights"].values.shape == (0, 1)


def _entry_args() -> list[np.ndarray]:
    return [np.ones(4, np.float32), np.ones(3, np.float64), np.array([0, 2, 1, 2], np.int64), np.empty(4, np.float64)]


def _gradient_args() -> list[np.ndarray]:
    return [np.ones(4, np.float32), np.array([0, 2, 1, 2], np.int64), np.array([0, 1, 4], np.int64),
            np.ones(2, np.float64), np.zeros(3, np.float64)]


def test_loops_compute_what_their_docstring_says(kernels: object) -> None:
    values, weights, inverse, out = (np.array([1.5, -2.0, 0.25, 4.0], np.float32), np.array([0.5, 3.0, -1.0]),
                                     np.array([0, 2, 1, 2], np.int64), np.empty(4))
    kernels.entry_products(values, weights, inverse, out)  # type: ignore[attr-defined]
    assert out.tolist() == [0.75, 2.0, 0.75, -4.0]
    grads = np.zeros(3)
    kernels.row_gradients(values, inverse, np.array([0, 1, 4], np.int64), np.array([2.0, -1.0]), grads)  # type: ignore[attr-defined]
    assert grads.tolist() == [3.0, -0.25, 2.0 - 4.0]


@pytest.mark.parametrize("position, bad", [
    (2, np.array([0, 2, 3, 2], np.int64)),     # an inverse index past the weights
    (2, np.array([0, -1, 1, 2], np.int64)),    # a negative one
    (0, np.ones(4, np.float64)),               # values not float32
    (1, np.ones(3, np.float32)),               # weights not float64
    (2, np.array([0, 2, 1, 2], np.int32)),     # inverse not int64
    (3, np.empty(5, np.float64)),              # out of another length
    (3, np.empty(8, np.float64)[::2]),         # not contiguous
])
def test_entry_products_refuses_a_wrong_call(kernels: object, position: int, bad: np.ndarray) -> None:
    args = _entry_args()
    args[position] = bad
    with pytest.raises(ValueError):
        kernels.entry_products(*args)  # type: ignore[attr-defined]


@pytest.mark.parametrize("position, bad", [
    (1, np.array([0, 3, 1, 2], np.int64)),     # an inverse index past out
    (1, np.array([0, 2, -4, 2], np.int64)),    # a negative one
    (2, np.array([1, 1, 4], np.int64)),        # indptr not starting at 0
    (2, np.array([0, 1, 3], np.int64)),        # ... not ending at the entries
    (2, np.array([0, 3, 1, 4], np.int64)),     # ... decreasing (and one run too many for d)
    (3, np.ones(3, np.float64)),               # d of another length than indptr's runs
    (4, np.zeros(3, np.float32)),              # out not float64
])
def test_row_gradients_refuses_a_wrong_call(kernels: object, position: int, bad: np.ndarray) -> None:
    args = _gradient_args()
    args[position] = bad
    out_before = args[4].copy()
    with pytest.raises(ValueError):
        kernels.row_gradients(*args)  # type: ignore[attr-defined]
    assert args[4].tobytes() == out_before.tobytes()  # nothing written


def test_decreasing_indptr_with_the_right_length_is_refused(kernels: object) -> None:
    args = _gradient_args()
    args[2], args[3] = np.array([0, 3, 1, 4], np.int64), np.ones(3, np.float64)
    with pytest.raises(ValueError, match="decreases"):
        kernels.row_gradients(*args)  # type: ignore[attr-defined]
