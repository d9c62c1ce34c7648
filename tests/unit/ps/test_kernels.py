"""The C optimizer kernels (psflow.ps._kernels) against their numpy twins: same bits."""

from __future__ import annotations

import importlib
import os

import numpy as np
import pytest

from psflow.optim import OptimizerSpec
from psflow.ps import optimizers
from psflow.ps.optimizers import make_optimizer

try:
    kernels = importlib.import_module("psflow.ps._kernels")
except ImportError:
    # scripts/test.sh sets PSFLOW_REQUIRE_NATIVE where a C compiler is present: the kernels must have been built.
    if os.environ.get("PSFLOW_REQUIRE_NATIVE") == "1":
        raise
    pytest.skip("psflow.ps._kernels was not built", allow_module_level=True)

SPECS = [
    OptimizerSpec("adagrad", {"learning_rate": 0.05}),
    OptimizerSpec("adagrad", {"learning_rate": 0.3, "initial_accumulator_value": 0.01}),
    OptimizerSpec("ftrl", {"learning_rate": 0.1}),
    OptimizerSpec("ftrl", {"learning_rate": 0.2, "l1_regularization_strength": 0.01,
                           "l2_regularization_strength": 0.3}),
    OptimizerSpec("ftrl", {"learning_rate": 0.05, "l1_regularization_strength": 0.001,
                           "l2_shrinkage_regularization_strength": 0.1}),
    OptimizerSpec("rmsprop", {"learning_rate": 0.1, "momentum": 0.9, "epsilon": 1.0}),
    OptimizerSpec("rmsprop", {"learning_rate": 0.01}),
    OptimizerSpec("rmsprop", {"learning_rate": 0.01, "decay": 0.95, "momentum": 0.5, "epsilon": 1e-6,
                              "centered": True}),
]


def _state(opt: optimizers.Optimizer, shape: tuple[int, ...], seed: int):
    rng = np.random.default_rng(seed)
    var = rng.normal(size=shape).astype(np.float32)
    slots = opt.create_slots(var)
    for name in opt.slot_names:
        slots[name] += np.abs(rng.normal(size=shape)).astype(np.float32)
    if "mg" in slots:  # centered RMSProp: rms estimates E[g^2] >= E[g]^2 = mg^2
        slots["rms"] += slots["mg"] * slots["mg"]
    return var, slots


def _run(spec: OptimizerSpec, shape, steps, monkeypatch: pytest.MonkeyPatch, native: bool):
    """Applies the same updates with the C kernel or with numpy; returns var and slots."""
    monkeypatch.setattr(optimizers, "_KERNELS", kernels if native else None)
    opt = make_optimizer(spec)
    var, slots = _state(opt, shape, 0)
    rng = np.random.default_rng(1)
    for i in range(steps):
        grad = (rng.normal(size=shape) * 10.0 ** rng.integers(-4, 2)).astype(np.float32)
        if i % 2 == 0:
            opt.apply_dense(var, slots, grad)
        else:
            rows = rng.choice(shape[0], size=max(1, shape[0] // 3), replace=False)
            if i % 4 == 1:
                rows = np.sort(rows)
            opt.apply_sparse(var, slots, rows, grad[rows])
    return var, slots


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.name}-{sorted(s.hyperparameters.items())}")
# (20000, 8) and (70000, 1): dense updates past the size from which the kernels release the GIL.
@pytest.mark.parametrize("shape", [(50, 8), (40, 1), (30,), (7, 3, 2), (20000, 8), (70000, 1)])
def test_kernel_matches_numpy_bit_for_bit(spec, shape, monkeypatch):
    var_c, slots_c = _run(spec, shape, 12, monkeypatch, native=True)
    var_np, slots_np = _run(spec, shape, 12, monkeypatch, native=False)
    assert var_c.tobytes() == var_np.tobytes()
    for name in slots_np:
        assert slots_c[name].tobytes() == slots_np[name].tobytes(), name


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def adagrad(self, *args: object) -> None:
        self.calls.append("adagrad")

    def ftrl(self, *args: object) -> None:
        self.calls.append("ftrl")

    def rmsprop(self, *args: object) -> None:
        self.calls.append("rmsprop")


@pytest.mark.parametrize(("spec", "used"), [
    (OptimizerSpec("adagrad", {"learning_rate": 0.1}), ["adagrad", "adagrad"]),
    (OptimizerSpec("ftrl", {"learning_rate": 0.1}), ["ftrl", "ftrl"]),
    (OptimizerSpec("ftrl", {"learning_rate": 0.1, "learning_rate_power": -0.7}), []),
    (OptimizerSpec("rmsprop", {"learning_rate": 0.1}), ["rmsprop", "rmsprop"]),
    (OptimizerSpec("rmsprop", {"learning_rate": 0.1, "centered": True}), ["rmsprop", "rmsprop"]),
    (OptimizerSpec("sgd", {"learning_rate": 0.1}), []),
])
def test_which_updates_use_the_kernel(spec, used, monkeypatch):
    recorder = _Recorder()
    monkeypatch.setattr(optimizers, "_KERNELS", recorder)
    opt = make_optimizer(spec)
    var, slots = _state(opt, (4, 2), 0)
    opt.apply_sparse(var, slots, np.array([3, 1]), np.ones((2, 2), np.float32))
    opt.apply_dense(var, slots, np.ones((4, 2), np.float32))
    opt.apply_dense(var[:, :1], {k: v[:, :1] for k, v in slots.items()}, np.ones((4, 1), np.float32))  # strided
    assert recorder.calls == used


def test_bad_calls_raise_and_change_nothing():
    var = np.ones((4, 2), np.float32)
    accum = np.full((4, 2), 0.1, np.float32)
    before = var.copy(), accum.copy()
    grad = np.ones((2, 2), np.float32)
    with pytest.raises(ValueError, match="row 4 is outside 0-3"):
        kernels.adagrad(var, accum, grad, np.array([1, 4], np.int64), 4, 0.1)
    with pytest.raises(ValueError, match="row -1"):
        kernels.adagrad(var, accum, grad, np.array([-1, 0], np.int64), 4, 0.1)
    with pytest.raises(ValueError, match="one row of var per index"):
        kernels.adagrad(var, accum, grad, np.array([1], np.int64), 4, 0.1)
    with pytest.raises(ValueError, match="float32"):
        kernels.adagrad(var.astype(np.float64), accum, grad, np.array([1, 2], np.int64), 4, 0.1)
    with pytest.raises(ValueError, match="int64"):
        kernels.adagrad(var, accum, grad, np.array([1, 2], np.int32), 4, 0.1)
    with pytest.raises(ValueError, match="differ in size"):
        kernels.ftrl(var, accum, np.zeros(3, np.float32), grad, np.array([1, 2], np.int64), 4, 0.1, 0, 0, 0)
    with pytest.raises(ValueError, match="dense gradient"):
        kernels.adagrad(var, accum, grad, None, 4, 0.1)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.adagrad(var[:, :1], accum[:, :1], grad[:, :1], None, 4, 0.1)
    mom = np.zeros((4, 2), np.float32)
    with pytest.raises(ValueError, match="row 4 is outside 0-3"):
        kernels.rmsprop(var, accum, mom, None, grad, np.array([1, 4], np.int64), 4, 0.1, 0.9, 0.0, 1e-10)
    with pytest.raises(ValueError, match="differ in size"):
        kernels.rmsprop(var, accum, mom, np.zeros(3, np.float32), grad, np.array([1, 2], np.int64), 4, 0.1, 0.9,
                        0.0, 1e-10)
    with pytest.raises(ValueError, match="mg must be float32"):
        kernels.rmsprop(var, accum, mom, np.zeros((4, 2)), grad, None, 4, 0.1, 0.9, 0.0, 1e-10)
    assert var.tobytes() == before[0].tobytes() and accum.tobytes() == before[1].tobytes()
    assert not mom.any()


def _refuses_bad_rows(call) -> None:
    """``call(rows)`` of a kernel over 4 rows refuses a row past the end, a negative one (first, and after a
    valid row: every row is checked before a byte is written) and rows not int64; the caller then checks that
    nothing was written."""
    with pytest.raises(ValueError, match="row 4 is outside 0-3"):
        call(np.array([1, 4], np.int64))
    with pytest.raises(ValueError, match="row -1"):
        call(np.array([0, -1], np.int64))
    with pytest.raises(ValueError, match="row -1"):
        call(np.array([-1, 0], np.int64))
    with pytest.raises(ValueError, match="int64"):
        call(np.array([1, 2], np.int32))


@pytest.mark.parametrize("shape", [(50, 8), (40, 1), (30,), (7, 3, 2), (40000, 16)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_gather_is_numpy_take(shape, dtype):
    rng = np.random.default_rng(5)
    value = (rng.normal(size=shape) * 100).astype(dtype)
    for k in (0, 1, 7, shape[0]):  # the last: a permutation with repeats, past the GIL-free size for (40000, 16)
        rows = rng.integers(0, shape[0], size=k).astype(np.int64)
        out = np.empty((k, *shape[1:]), dtype=dtype)
        kernels.gather(value, rows, out)
        assert out.tobytes() == value[rows].tobytes()


def test_gather_bad_calls_raise_and_write_nothing():
    value = np.arange(8, dtype=np.float32).reshape(4, 2)
    out = np.full((2, 2), -1, np.float32)
    _refuses_bad_rows(lambda rows: kernels.gather(value, rows, out))
    with pytest.raises(ValueError, match="one row of value per index"):
        kernels.gather(value, np.array([1], np.int64), out)
    with pytest.raises(ValueError, match="item size"):
        kernels.gather(value, np.array([1, 2], np.int64), np.empty((2, 2), np.float64))
    with pytest.raises(ValueError, match="read-only"):
        ro = out.copy()
        ro.flags.writeable = False
        kernels.gather(value, np.array([1, 2], np.int64), ro)
    assert (out == -1).all()


@pytest.mark.parametrize("shape", [(60, 8), (60, 1), (60,)])
def test_store_reads_the_same_rows_with_and_without_the_kernel(shape, monkeypatch):
    from psflow.ps import store as store_module

    store = store_module.ParameterStore()
    part = store.create("w", 0, shape, 0, shape[0], "float32", {"name": "random_normal", "seed": 3}, None)
    rows = np.array([5, 0, 59, 5, 17], np.int64)
    with_kernel = store.read(part, rows)
    monkeypatch.setattr(store_module, "_GATHER", None)
    without = store.read(part, rows)
    assert with_kernel.shape == without.shape == (5, *shape[1:])
    assert with_kernel.tobytes() == without.tobytes() == part.value[rows].tobytes()
    with_kernel[0] = 1e9  # a copy: the partition is unchanged
    assert part.value[5].max() < 1e9


def _first_touch_reference(marks: np.ndarray, rows: np.ndarray) -> list[int]:
    """The rows of ``rows`` unmarked in ``marks``, each once, in order of first appearance (marks them)."""
    found = []
    for r in rows.tolist():
        if not marks[r]:
            marks[r] = True
            found.append(r)
    return found


@pytest.mark.parametrize("num_rows", [1, 9, 5000])
def test_first_touch_finds_each_unmarked_row_once_in_order(num_rows):
    rng = np.random.default_rng(7)
    marks = rng.random(num_rows) < 0.3
    want_marks = marks.copy()
    for k in (0, 1, 17, 3 * num_rows):  # the last: many repeats
        rows = rng.integers(0, num_rows, size=k).astype(np.int64)
        want = _first_touch_reference(want_marks, rows)
        out = np.full(k, -7, np.int64)
        n = kernels.first_touch(marks, rows, out)
        assert out[:n].tolist() == want
        assert (out[n:] == -7).all()
        assert marks.tobytes() == want_marks.tobytes()


def test_first_touch_bad_calls_raise_and_write_nothing():
    marks = np.zeros(4, np.bool_)
    out = np.full(3, -1, np.int64)
    _refuses_bad_rows(lambda rows: kernels.first_touch(marks, rows, out))
    with pytest.raises(ValueError, match="shorter than rows"):
        kernels.first_touch(marks, np.array([0, 1, 2, 3], np.int64), out)
    with pytest.raises(ValueError, match="one byte a row"):
        kernels.first_touch(np.zeros(4, np.int32), np.array([1, 2], np.int64), out)
    with pytest.raises(ValueError, match="read-only"):
        ro = marks.copy()
        ro.flags.writeable = False
        kernels.first_touch(ro, np.array([1, 2], np.int64), out)
    assert not marks.any() and (out == -1).all()


def _touch_rows_reference(marks, changed, epoch, rows):
    """touch_rows' meaning: first_touch's claim where marks is given, and ``changed[r] = epoch`` for each row
    marked before the call where changed is given (a row claimed by the call, or repeated after its claim, is
    not stamped)."""
    before = marks.copy() if marks is not None else None
    found = _first_touch_reference(marks, rows) if marks is not None else []
    if changed is not None:
        stamp = rows if before is None else rows[before[rows]]
        changed[stamp] = epoch
    return found


@pytest.mark.parametrize("num_rows", [1, 9, 5000])
@pytest.mark.parametrize("which", ["both", "marks", "changed"])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint32])
def test_touch_rows_claims_new_rows_and_stamps_the_built_ones(num_rows, which, dtype):
    rng = np.random.default_rng(11)
    marks = rng.random(num_rows) < 0.4 if which != "changed" else None
    changed = rng.integers(0, 5, num_rows).astype(dtype) if which != "marks" else None
    want_marks = marks.copy() if marks is not None else None
    want_changed = changed.copy() if changed is not None else None
    for epoch, k in enumerate((0, 1, 17, 3 * num_rows), start=7):  # the last: many repeats
        rows = rng.integers(0, num_rows, size=k).astype(np.int64)
        want = _touch_rows_reference(want_marks, want_changed, epoch, rows)
        out = np.full(k, -7, np.int64) if marks is not None else None
        n = kernels.touch_rows(marks, changed, epoch, rows, out)
        assert n == len(want)
        if out is not None:
            assert out[:n].tolist() == want and (out[n:] == -7).all()
            assert marks.tobytes() == want_marks.tobytes()
        if changed is not None:
            assert changed.tobytes() == want_changed.tobytes()


def test_touch_rows_bad_calls_raise_and_write_nothing():
    marks = np.zeros(4, np.bool_)
    changed = np.zeros(4, np.uint32)
    out = np.full(3, -1, np.int64)
    _refuses_bad_rows(lambda rows: kernels.touch_rows(marks, changed, 3, rows, out))
    _refuses_bad_rows(lambda rows: kernels.touch_rows(None, changed, 3, rows, None))
    with pytest.raises(ValueError, match="shorter than rows"):
        kernels.touch_rows(marks, changed, 3, np.array([0, 1, 2, 3], np.int64), out)
    with pytest.raises(ValueError, match="differ in rows"):
        kernels.touch_rows(marks, np.zeros(5, np.uint32), 3, np.array([1], np.int64), out)
    with pytest.raises(ValueError, match="uint8 or uint32"):
        kernels.touch_rows(marks, np.zeros(4, np.int32), 3, np.array([1], np.int64), out)
    with pytest.raises(ValueError, match="uint8 or uint32"):
        kernels.touch_rows(marks, np.zeros(4, np.int8), 3, np.array([1], np.int64), out)
    with pytest.raises(ValueError, match="one byte a row"):
        kernels.touch_rows(np.zeros(4, np.int32), changed, 3, np.array([1], np.int64), out)
    with pytest.raises(ValueError, match="does not fit"):
        kernels.touch_rows(marks, changed, 1 << 32, np.array([1], np.int64), out)
    small = np.zeros(4, np.uint8)
    with pytest.raises(ValueError, match="does not fit"):
        kernels.touch_rows(marks, small, 256, np.array([1], np.int64), out)
    assert not small.any()
    with pytest.raises(ValueError, match="read-only"):
        ro = changed.copy()
        ro.flags.writeable = False
        kernels.touch_rows(None, ro, 3, np.array([1], np.int64), None)
    assert not marks.any() and not changed.any() and (out == -1).all()


@pytest.mark.parametrize("k", [1, 255, 256, 257, 1000])
def test_ftrl_on_single_element_rows_matches_numpy_at_block_edges(k, monkeypatch):
    """A [n, 1] table's rows are updated in gathered blocks of 256 (vector registers): same bits as numpy."""
    spec = OptimizerSpec("ftrl", {"learning_rate": 0.1, "l1_regularization_strength": 0.01})
    rng = np.random.default_rng(k)
    rows = rng.choice(3000, size=k, replace=False).astype(np.int64)
    grads = [(rng.normal(size=(k, 1)) * 0.1).astype(np.float32) for _ in range(3)]
    out = []
    for native in (True, False):
        monkeypatch.setattr(optimizers, "_KERNELS", kernels if native else None)
        opt = make_optimizer(spec)
        var, slots = _state(opt, (3000, 1), 4)
        for grad in grads:
            opt.apply_sparse(var, slots, rows, grad, distinct=True)
        out.append((var.tobytes(), slots["accum"].tobytes(), slots["linear"].tobytes()))
    assert out[0] == out[1]


def _scatter_reference(targets: list[np.ndarray], rows: np.ndarray, block: np.ndarray) -> None:
    for j, target in enumerate(targets):
        for i, r in enumerate(rows.tolist()):  # in order: a repeated row keeps its last
            target[r] = block[j, i]


@pytest.mark.parametrize("shape", [(50, 8), (40, 1), (30,), (7, 3, 2), (40000, 16)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scatter_rows_writes_each_row_of_the_block_in_order(shape, dtype):
    rng = np.random.default_rng(9)
    for n in (1, 3):
        targets = [(rng.normal(size=shape) * 10).astype(dtype) for _ in range(n)]
        want = [t.copy() for t in targets]
        for k in (0, 1, 7, shape[0]):  # the last: a permutation with repeats, past the GIL-free size for (40000, 16)
            rows = rng.integers(0, shape[0], size=k).astype(np.int64)
            block = rng.normal(size=(n, k, *shape[1:])).astype(dtype)
            _scatter_reference(want, rows, block)
            kernels.scatter_rows(targets, rows, block)
            assert [t.tobytes() for t in targets] == [w.tobytes() for w in want]


def test_scatter_rows_bad_calls_raise_and_write_nothing():
    targets = [np.zeros((4, 2), np.float32), np.zeros((4, 2), np.float32)]
    block = np.ones((2, 2, 2), np.float32)
    _refuses_bad_rows(lambda rows: kernels.scatter_rows(targets, rows, block))
    with pytest.raises(ValueError, match="not 2 arrays x 1 rows"):
        kernels.scatter_rows(targets, np.array([1], np.int64), block)
    with pytest.raises(ValueError, match="array 1 has 3 rows"):
        kernels.scatter_rows([targets[0], np.zeros((3, 2), np.float32)], np.array([1, 2], np.int64), block)
    with pytest.raises(ValueError, match="want 1 to 16 arrays"):
        kernels.scatter_rows([], np.array([1, 2], np.int64), block)
    ro = targets[1].copy()
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        kernels.scatter_rows([targets[0], ro], np.array([1, 2], np.int64), block)
    assert not any(t.any() for t in targets) and not ro.any()
