"""Tests for psflow.ps.optimizers: TensorFlow golden values, sparse semantics, specs, errors."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import psflow.ps.optimizers as optimizers_module
from psflow.optim import OPTIMIZER_NAMES, OptimizerError, OptimizerSpec
from psflow.ps.optimizers import AdamOptimizer, FtrlOptimizer, Optimizer, make_optimizer

GOLDEN_PATH = Path(__file__).resolve().parents[2] / "data" / "golden" / "optimizers_tf.json"
GOLDEN: dict[str, Any] = json.loads(GOLDEN_PATH.read_text())
GOLDEN_CASES = sorted(GOLDEN["optimizers"])
# Golden case -> registry name (the ftrl_* cases are FTRL with other hyperparameters).
CASE_OPTIMIZER = {case: case.split("_")[0] for case in GOLDEN_CASES}
# RMSProp's golden values are in trainer_tf.json (tests/unit/ps/test_trainer_golden.py).
TRAINER_GOLDEN_PATH = GOLDEN_PATH.with_name("trainer_tf.json")

RTOL = 1e-6
# atol: psflow matches TF's sparse Adagrad kernel bit for bit, but not its
# dense one. There, TF's vectorized CPU code takes rsqrt differently (most
# likely the approximate rsqrt instruction). The last-bit differences in an
# update step of up to lr = 0.1 are about 1e-8 absolute (ulp(0.1) = 7.5e-9),
# which exceeds 1e-6 relative for var entries near zero.
ATOL = 1e-8
# ftrl_power dense: TF's dense kernel takes accum ** 0.7 with Eigen's
# vectorized pow on the first 16 of the 18 elements, and every element that
# differs is one of those. That pow can differ by 1 ulp (up to 1.2e-7 for
# accum < 2.5) from powf, which psflow and TF's sparse kernel use (the sparse
# case matches bit for bit). FTRL multiplies the difference of two such powers
# by |var| / lr (up to about 7 here), so one ulp can grow to ~1e-6 absolute.
ATOL_OVERRIDES = {("ftrl_power", "dense"): 1e-6}

# One spec per registry name, for the property tests.
SPECS = {
    "sgd": OptimizerSpec("sgd", {"learning_rate": 0.1}),
    "momentum": OptimizerSpec("momentum", {"learning_rate": 0.1, "momentum": 0.9}),
    "nesterov": OptimizerSpec("momentum", {"learning_rate": 0.1, "momentum": 0.9, "use_nesterov": True}),
    "adagrad": OptimizerSpec("adagrad", {"learning_rate": 0.1}),
    "adam": OptimizerSpec("adam", {"learning_rate": 0.01}),
    "ftrl": OptimizerSpec(
        "ftrl", {"learning_rate": 0.1, "l1_regularization_strength": 0.01, "l2_regularization_strength": 0.001}
    ),
    "ftrl_shrinkage": OptimizerSpec(
        "ftrl",
        {"learning_rate": 0.05, "l2_regularization_strength": 0.01, "l2_shrinkage_regularization_strength": 0.02},
    ),
    "ftrl_power": OptimizerSpec(
        "ftrl", {"learning_rate": 0.1, "learning_rate_power": -0.7, "l1_regularization_strength": 0.05}
    ),
    "rmsprop": OptimizerSpec("rmsprop", {"learning_rate": 0.1, "momentum": 0.9, "epsilon": 1.0}),
    "rmsprop_centered": OptimizerSpec("rmsprop", {"learning_rate": 0.01, "decay": 0.95, "epsilon": 1e-6,
                                                  "centered": True}),
}
ROW_LOCAL_SPECS = [key for key in SPECS if key != "adam"]  # Sparse updates touch only the given rows.
# RMSProp's sparse kernel rounds differently from its dense one (TF's do too): equal to 1e-6, not bit for bit.
SPARSE_IS_DENSE_SPECS = [key for key in ROW_LOCAL_SPECS if not key.startswith("rmsprop")]


def _f32(values: Any) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def _state(spec_key: str, shape: tuple[int, ...], seed: int = 0) -> tuple[Optimizer, np.ndarray, dict[str, np.ndarray]]:
    """An optimizer with var and slots after one dense step, so slots are non-trivial."""
    rng = np.random.default_rng(seed)
    opt = make_optimizer(SPECS[spec_key])
    var = rng.normal(size=shape).astype(np.float32)
    slots = opt.create_slots(var)
    opt.apply_dense(var, slots, rng.normal(size=shape).astype(np.float32))
    return opt, var, slots


# --- TensorFlow golden values ---------------------------------------------------------------


def test_golden_file_covers_every_optimizer() -> None:
    trainer = json.loads(TRAINER_GOLDEN_PATH.read_text())["optimizers"]["cases"]
    names = {case["hyperparameters"]["optimizer"] for case in trainer.values()}
    assert set(CASE_OPTIMIZER.values()) | names == set(OPTIMIZER_NAMES)


@pytest.mark.parametrize("mode", ["dense", "sparse"])
@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_matches_tensorflow_after_every_step(case: str, mode: str) -> None:
    data = GOLDEN["optimizers"][case]
    opt = make_optimizer(OptimizerSpec(CASE_OPTIMIZER[case], data["hyperparameters"]))
    var = _f32(GOLDEN["initial"])
    slots = opt.create_slots(var)
    atol = ATOL_OVERRIDES.get((case, mode), ATOL)
    for step, expected in enumerate(data[mode]):
        if mode == "dense":
            opt.apply_dense(var, slots, _f32(GOLDEN["dense_gradients"][step]))
        else:
            sparse = GOLDEN["sparse_gradients"][step]
            opt.apply_sparse(var, slots, np.array(sparse["indices"], dtype=np.int64), _f32(sparse["values"]))
        assert sorted(expected["slots"]) == sorted(opt.slot_names)
        np.testing.assert_allclose(
            var, expected["var"], rtol=RTOL, atol=atol, err_msg=f"{case} {mode} step {step}: var"
        )
        for name, value in expected["slots"].items():
            np.testing.assert_allclose(
                slots[name], value, rtol=RTOL, atol=atol, err_msg=f"{case} {mode} step {step}: slot {name!r}"
            )


@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_adam_beta_powers_advance_once_per_apply(mode: str) -> None:
    opt = make_optimizer(OptimizerSpec("adam", GOLDEN["optimizers"]["adam"]["hyperparameters"]))
    var = _f32(GOLDEN["initial"])
    slots = opt.create_slots(var)
    beta1, beta2 = np.float32(0.9), np.float32(0.999)
    expected1, expected2 = beta1, beta2
    assert slots["beta1_power"].shape == () and slots["beta1_power"] == expected1
    for step in range(3):
        if mode == "dense":
            opt.apply_dense(var, slots, _f32(GOLDEN["dense_gradients"][step]))
        else:
            opt.apply_sparse(var, slots, np.array([0, 2]), np.ones((2, 3), dtype=np.float32))
        expected1, expected2 = expected1 * beta1, expected2 * beta2  # float32, as TF's variables
        assert slots["beta1_power"] == expected1 and slots["beta2_power"] == expected2


# --- Sparse semantics ---------------------------------------------------------------------------


@pytest.mark.parametrize("spec_key", list(SPECS))
def test_sparse_sums_duplicate_rows_first(spec_key: str) -> None:
    opt, var, slots = _state(spec_key, (6, 3))
    var_dedup, slots_dedup = var.copy(), {name: value.copy() for name, value in slots.items()}
    values = np.random.default_rng(1).normal(size=(5, 3)).astype(np.float32)
    opt.apply_sparse(var, slots, np.array([4, 1, 4, 1, 4]), values)
    summed = np.stack([values[1] + values[3], values[0] + values[2] + values[4]])
    opt.apply_sparse(var_dedup, slots_dedup, np.array([1, 4]), summed)
    np.testing.assert_allclose(var, var_dedup, rtol=RTOL)
    for name in slots:
        np.testing.assert_allclose(slots[name], slots_dedup[name], rtol=RTOL, err_msg=name)


@pytest.mark.parametrize("spec_key", list(SPECS))
def test_sparse_distinct_rows_in_any_order_equal_the_checked_path(spec_key: str) -> None:
    """``distinct=True`` (a dynamic table's slots: distinct, unsorted) skips the duplicate search only."""
    opt, var, slots = _state(spec_key, (9, 3))
    var_checked, slots_checked = var.copy(), {name: value.copy() for name, value in slots.items()}
    rows = np.array([7, 2, 8, 0, 5])
    values = np.random.default_rng(2).normal(size=(5, 3)).astype(np.float32)
    opt.apply_sparse(var, slots, rows, values, distinct=True)
    opt.apply_sparse(var_checked, slots_checked, rows, values)
    np.testing.assert_array_equal(var, var_checked)
    for name in slots:
        np.testing.assert_array_equal(slots[name], slots_checked[name], err_msg=name)
    before = var.copy()
    for bad in (np.array([3, 9]), np.array([-1, 2])):
        with pytest.raises(ValueError, match="rows 0-8"):
            opt.apply_sparse(var, slots, bad, values[:2], distinct=True)
    np.testing.assert_array_equal(var, before)


@pytest.mark.parametrize("spec_key", ROW_LOCAL_SPECS)
def test_sparse_touches_only_given_rows(spec_key: str) -> None:
    opt, var, slots = _state(spec_key, (6, 3))
    before_var, before_slots = var.copy(), {name: value.copy() for name, value in slots.items()}
    rows = np.array([3, 1])
    opt.apply_sparse(var, slots, rows, np.full((2, 3), 0.5, dtype=np.float32))
    untouched = [0, 2, 4, 5]
    np.testing.assert_array_equal(var[untouched], before_var[untouched])
    assert not np.array_equal(var[rows], before_var[rows])
    for name in slots:
        np.testing.assert_array_equal(slots[name][untouched], before_slots[name][untouched], err_msg=name)


@pytest.mark.parametrize("spec_key", ROW_LOCAL_SPECS)
def test_sparse_with_no_rows_changes_nothing(spec_key: str) -> None:
    opt, var, slots = _state(spec_key, (4, 2))
    before_var, before_slots = var.copy(), {name: value.copy() for name, value in slots.items()}
    opt.apply_sparse(var, slots, np.array([], dtype=np.int64), np.zeros((0, 2), dtype=np.float32))
    np.testing.assert_array_equal(var, before_var)
    for name in slots:
        np.testing.assert_array_equal(slots[name], before_slots[name])


def test_adam_sparse_is_non_lazy() -> None:
    """TF1's AdamOptimizer decays m and v and moves var on every row, even with no rows given."""
    opt, var, slots = _state("adam", (4, 2))
    before_var, before_m = var.copy(), slots["m"].copy()
    before_power = slots["beta1_power"].copy()
    opt.apply_sparse(var, slots, np.array([], dtype=np.int64), np.zeros((0, 2), dtype=np.float32))
    np.testing.assert_array_equal(slots["m"], before_m * np.float32(0.9))
    assert np.all(var != before_var)
    assert slots["beta1_power"] == before_power * np.float32(0.9)


@settings(max_examples=30, deadline=None)
@given(
    spec_key=st.sampled_from(SPARSE_IS_DENSE_SPECS),
    rows=st.integers(min_value=1, max_value=12),
    seed=st.integers(min_value=0, max_value=2**32 - 1),
)
def test_sparse_over_all_rows_equals_dense(spec_key: str, rows: int, seed: int) -> None:
    """The row kernels are elementwise, so a sparse update of every row (any order) is the dense one."""
    opt, var, slots = _state(spec_key, (rows, 3), seed)
    var_sparse, slots_sparse = var.copy(), {name: value.copy() for name, value in slots.items()}
    rng = np.random.default_rng(seed)
    grad = rng.normal(size=(rows, 3)).astype(np.float32)
    order = rng.permutation(rows)
    opt.apply_dense(var, slots, grad)
    opt.apply_sparse(var_sparse, slots_sparse, order, grad[order])
    np.testing.assert_array_equal(var_sparse, var)
    for name in slots:
        np.testing.assert_array_equal(slots_sparse[name], slots[name], err_msg=name)


def test_sparse_update_of_a_vector() -> None:
    opt = make_optimizer(SPECS["sgd"])
    var = np.zeros(5, dtype=np.float32)
    opt.apply_sparse(var, opt.create_slots(var), np.array([3, 0, 3]), _f32([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(var, [-0.2, 0.0, 0.0, -0.4, 0.0], rtol=RTOL)


@pytest.mark.parametrize("spec_key", list(SPECS))
def test_dense_update_of_a_scalar_matches_a_vector(spec_key: str) -> None:
    opt = make_optimizer(SPECS[spec_key])
    scalar, vector = np.array(0.5, dtype=np.float32), np.array([0.5], dtype=np.float32)
    scalar_slots, vector_slots = opt.create_slots(scalar), opt.create_slots(vector)
    for grad in (0.3, -1.2):
        opt.apply_dense(scalar, scalar_slots, np.array(grad, dtype=np.float32))
        opt.apply_dense(vector, vector_slots, np.array([grad], dtype=np.float32))
    assert scalar.shape == () and scalar == vector[0]
    for name in opt.slot_names:
        assert scalar_slots[name].shape == () and scalar_slots[name] == vector_slots[name][0]


@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_adam_chunked_update_equals_one_pass(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    shape = (40_000, 3)  # 120k elements: more than one chunk, and a partial last chunk.
    results = []
    for chunk in (1 << 16, 1 << 30):
        monkeypatch.setattr(optimizers_module, "_CHUNK_ELEMENTS", chunk)
        opt, var, slots = _state("adam", shape)
        if mode == "dense":
            opt.apply_dense(var, slots, np.ones(shape, dtype=np.float32))
        else:
            opt.apply_sparse(var, slots, np.array([7, 39_999]), np.ones((2, 3), dtype=np.float32))
        results.append((var, slots))
    np.testing.assert_array_equal(results[0][0], results[1][0])
    for name in results[0][1]:
        np.testing.assert_array_equal(results[0][1][name], results[1][1][name])


# --- Slots -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "slot_names", "initial"),
    [
        (SPECS["sgd"], (), {}),
        (SPECS["momentum"], ("momentum",), {"momentum": 0.0}),
        (
            OptimizerSpec("adagrad", {"learning_rate": 0.1, "initial_accumulator_value": 0.3}),
            ("accumulator",),
            {"accumulator": 0.3},
        ),
        (SPECS["adam"], ("m", "v"), {"m": 0.0, "v": 0.0}),
        (
            OptimizerSpec("ftrl", {"learning_rate": 0.1, "initial_accumulator_value": 0.2}),
            ("accum", "linear"),
            {"accum": 0.2, "linear": 0.0},
        ),
    ],
)
def test_create_slots(spec: OptimizerSpec, slot_names: tuple[str, ...], initial: dict[str, float]) -> None:
    opt = make_optimizer(spec)
    var = np.ones((3, 2), dtype=np.float32)
    slots = opt.create_slots(var)
    assert opt.slot_names == slot_names
    assert set(slots) == set(slot_names) | set(opt.state_names)
    for name, value in initial.items():
        assert slots[name].dtype == np.float32 and slots[name].shape == (3, 2)
        np.testing.assert_array_equal(slots[name], np.float32(value))
    np.testing.assert_array_equal(var, 1.0)


def test_adam_state_is_zero_dimensional() -> None:
    slots = make_optimizer(SPECS["adam"]).create_slots(np.zeros((2, 2), dtype=np.float32))
    assert AdamOptimizer.state_names == ("beta1_power", "beta2_power")
    assert slots["beta1_power"].shape == () and slots["beta1_power"].dtype == np.float32
    assert slots["beta2_power"] == np.float32(0.999)


# --- Input errors -----------------------------------------------------------------------------


def test_apply_errors_name_the_problem_and_change_nothing() -> None:
    opt, var, slots = _state("ftrl", (4, 2))
    before_var, before_slots = var.copy(), {name: value.copy() for name, value in slots.items()}
    cases: list[tuple[Any, str]] = [
        (
            lambda: opt.apply_dense(var, slots, np.zeros((2, 4), dtype=np.float32)),
            r"gradient has shape \(2, 4\); var has \(4, 2\)",
        ),
        (
            lambda: opt.apply_sparse(var, slots, np.array([1, 4]), np.zeros((2, 2), dtype=np.float32)),
            "row 4; the variable has rows 0-3",
        ),
        (lambda: opt.apply_sparse(var, slots, np.array([-1]), np.zeros((1, 2), dtype=np.float32)), "row -1"),
        (lambda: opt.apply_sparse(var, slots, np.array([[1]]), np.zeros((1, 2), dtype=np.float32)), "1-d integer"),
        (lambda: opt.apply_sparse(var, slots, np.array([1.0]), np.zeros((1, 2), dtype=np.float32)), "1-d integer"),
        (
            lambda: opt.apply_sparse(var, slots, np.array([1]), np.zeros((1, 3), dtype=np.float32)),
            r"shape \(1, 3\) for 1 rows",
        ),
        (lambda: opt.apply_dense(var.astype(np.float64), slots, np.zeros((4, 2))), "var must be a float32"),
        (lambda: opt.apply_dense(var, {"accum": slots["accum"]}, np.zeros((4, 2))), "slot 'linear' is missing"),
        (
            lambda: opt.apply_dense(var, {**slots, "linear": np.zeros(3, np.float32)}, np.zeros((4, 2))),
            "slot 'linear' has shape",
        ),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    np.testing.assert_array_equal(var, before_var)
    for name in slots:
        np.testing.assert_array_equal(slots[name], before_slots[name])


def test_unknown_optimizer_lists_valid_names() -> None:
    with pytest.raises(
        OptimizerError, match="unknown optimizer 'adamw'; valid names: sgd, momentum, adagrad, adam, ftrl"
    ):
        OptimizerSpec("adamw", {})


def test_unknown_hyperparameter_lists_accepted_ones() -> None:
    with pytest.raises(OptimizerError) as info:
        OptimizerSpec("adam", {"lr": 0.1})
    assert str(info.value) == (
        "optimizer 'adam': unknown hyperparameter 'lr'; accepted: learning_rate, beta1, beta2, epsilon"
    )


def test_missing_required_hyperparameter() -> None:
    with pytest.raises(OptimizerError, match="optimizer 'momentum': hyperparameter 'momentum' is required"):
        OptimizerSpec("momentum", {"learning_rate": 0.1})


@pytest.mark.parametrize(
    ("name", "key", "value", "rule"),
    [
        ("ftrl", "learning_rate", 0.0, "> 0"),
        ("ftrl", "learning_rate_power", 0.5, "<= 0"),
        ("ftrl", "initial_accumulator_value", -0.1, ">= 0"),
        ("ftrl", "l1_regularization_strength", -1.0, ">= 0"),
        ("ftrl", "l2_regularization_strength", -1.0, ">= 0"),
        ("ftrl", "l2_shrinkage_regularization_strength", -1.0, ">= 0"),
        ("adagrad", "initial_accumulator_value", 0.0, "> 0"),
        ("adam", "beta1", 1.0, r"in \[0, 1\)"),
        ("adam", "beta2", -0.1, r"in \[0, 1\)"),
        ("adam", "epsilon", 0.0, "> 0"),
        ("sgd", "learning_rate", float("nan"), "finite"),
        ("sgd", "learning_rate", True, "a number"),
        ("sgd", "learning_rate", "0.1", "a number"),
        ("momentum", "use_nesterov", 1, "a bool"),
    ],
)
def test_invalid_hyperparameter_value(name: str, key: str, value: object, rule: str) -> None:
    hyperparameters: dict[str, Any] = (
        {"learning_rate": 0.1, "momentum": 0.9} if name == "momentum" else {"learning_rate": 0.1}
    )
    hyperparameters[key] = value
    with pytest.raises(
        OptimizerError, match=rf"optimizer '{name}': hyperparameter '{key}' must be {rule}, got {value!r}"
    ):
        OptimizerSpec(name, hyperparameters)


def test_direct_construction_checks_hyperparameters() -> None:
    with pytest.raises(OptimizerError, match="'learning_rate' must be > 0"):
        FtrlOptimizer({"learning_rate": -1.0})


# --- Specs -----------------------------------------------------------------------------------


def test_defaults_are_tensorflows() -> None:
    assert dict(make_optimizer(OptimizerSpec("adam")).hyperparameters) == {
        "learning_rate": 0.001,
        "beta1": 0.9,
        "beta2": 0.999,
        "epsilon": 1e-8,
    }
    assert dict(make_optimizer(OptimizerSpec("ftrl", {"learning_rate": 0.1})).hyperparameters) == {
        "learning_rate": 0.1,
        "learning_rate_power": -0.5,
        "initial_accumulator_value": 0.1,
        "l1_regularization_strength": 0.0,
        "l2_regularization_strength": 0.0,
        "l2_shrinkage_regularization_strength": 0.0,
    }
    assert make_optimizer(SPECS["momentum"]).hyperparameters["use_nesterov"] is False
    assert (
        make_optimizer(OptimizerSpec("adagrad", {"learning_rate": 1.0})).hyperparameters["initial_accumulator_value"]
        == 0.1
    )


@pytest.mark.parametrize("spec_key", list(SPECS))
def test_spec_json_and_pickle_round_trip(spec_key: str) -> None:
    spec = SPECS[spec_key]
    assert OptimizerSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert hash(OptimizerSpec.from_json(spec.to_json())) == hash(spec)
    assert make_optimizer(spec).spec == OptimizerSpec(spec.name, dict(make_optimizer(spec).hyperparameters))


def test_spec_copies_and_normalizes_hyperparameters() -> None:
    given_hyperparameters: dict[str, float | bool] = {"learning_rate": 1}
    spec = OptimizerSpec("sgd", given_hyperparameters)
    given_hyperparameters["learning_rate"] = 2.0
    assert spec.to_json() == {"name": "sgd", "hyperparameters": {"learning_rate": 1.0}}
    assert isinstance(spec.hyperparameters["learning_rate"], float)
    with pytest.raises(TypeError):
        spec.hyperparameters["learning_rate"] = 3.0  # type: ignore[index]
    assert spec != OptimizerSpec("sgd", {"learning_rate": 2.0})


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must be a JSON object"),
        ({}, "has no 'name'"),
        ({"name": "sgd", "hyperparameters": {"learning_rate": 0.1}, "extra": 1}, r"unknown keys \['extra'\]"),
        ({"name": 3}, "unknown optimizer 3"),
        ({"name": "sgd", "hyperparameters": [0.1]}, "'hyperparameters' must be an object"),
        ({"name": "sgd", "hyperparameters": {"learning_rate": None}}, "must be a number, got None"),
    ],
)
def test_from_json_rejects_bad_input(data: Any, message: str) -> None:
    with pytest.raises(OptimizerError, match=message):
        OptimizerSpec.from_json(data)


def test_parse_optimizer_flag_forms() -> None:
    """--wide-optimizer / --deep-optimizer: NAME, NAME:KEY=VALUE,... or JSON; checked against the optimizer later."""
    from psflow.optim import parse_optimizer

    assert parse_optimizer("ftrl") == {"name": "ftrl", "hyperparameters": {}}
    assert parse_optimizer(" adagrad:learning_rate=0.05, initial_accumulator_value=0.1 ") == {
        "name": "adagrad", "hyperparameters": {"learning_rate": 0.05, "initial_accumulator_value": 0.1}}
    assert parse_optimizer('{"name": "sgd", "hyperparameters": {"learning_rate": 0.2}}') == {
        "name": "sgd", "hyperparameters": {"learning_rate": 0.2}}
    for text, message in (("nope", "unknown optimizer 'nope'"), ("ftrl:lr", "'lr' is not KEY=VALUE"),
                          ("ftrl:lr=x", "'lr' must be a number, got 'x'"), ("{bad", "bad JSON")):
        with pytest.raises(OptimizerError, match=message):
            parse_optimizer(text)
