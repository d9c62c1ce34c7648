"""TensorFlow's trainer pieces (tests/data/golden/trainer_tf.json): learning-rate schedules at every recorded
global step; RMSProp (Inception's and centered) and Momentum with a decayed learning rate, dense and sparse,
variable and slots after every step, with the numpy code and with the C kernels; and the moving averages of
the variable (``ExponentialMovingAverage(decay, num_updates=global_step)`` at decays 0.9 and 0.9999) after every
step, moved by the ps tasks' code (:mod:`psflow.ps.averages`) after each update."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from psflow.optim import OptimizerSpec
from psflow.optim.schedules import ScheduleSpec
from psflow.ps import optimizers
from psflow.ps.averages import MovingAverages
from psflow.ps.optimizers import make_optimizer
from psflow.ps.store import ParameterStore

GOLDEN: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[2] / "data" / "golden" / "trainer_tf.json").read_text())
SCHEDULES = GOLDEN["schedules"]
OPTIMIZERS = GOLDEN["optimizers"]
RTOL = 1e-6

# Golden case -> schedule name (cases that vary a schedule's options carry a suffix).
SCHEDULE_OF = {case: case.removesuffix("_staircase").removesuffix("_power2_cycle") for case in SCHEDULES["cases"]}


def schedule_of(case: str) -> ScheduleSpec:
    return ScheduleSpec(SCHEDULE_OF[case], SCHEDULES["cases"][case]["hyperparameters"])


def optimizer_spec(case: str) -> OptimizerSpec:
    """The case's optimizer as a spec: the file's hyperparameters are psflow's JSON, plus the optimizer's name."""
    hyperparameters = dict(OPTIMIZERS["cases"][case]["hyperparameters"])
    return OptimizerSpec.from_json({"name": hyperparameters.pop("optimizer"), "hyperparameters": hyperparameters})


def test_every_tensorflow_schedule_is_covered() -> None:
    assert set(SCHEDULE_OF.values()) == {"exponential_decay", "piecewise_constant", "polynomial_decay",
                                         "inverse_time_decay", "natural_exp_decay", "cosine_decay",
                                         "cosine_decay_restarts"}


@pytest.mark.parametrize("case", sorted(SCHEDULES["cases"]))
def test_schedule_matches_tensorflow_at_every_recorded_step(case: str) -> None:
    spec = schedule_of(case)
    got = np.array([spec.value(step) for step in SCHEDULES["global_steps"]], dtype=np.float32)
    want = np.array(SCHEDULES["cases"][case]["values"], dtype=np.float32)
    np.testing.assert_allclose(got, want, rtol=RTOL, err_msg=case)
    # Float32 as TF computes it: at most one ulp from TF's own float32 values (cosine_decay at step 250 is one
    # off, TF's float32 cosine being 1 ulp off there); in float64 three cases would miss 1e-6.
    np.testing.assert_array_max_ulp(got, want, maxulp=1)


def test_schedule_json_in_the_golden_file_is_psflows() -> None:
    """The file writes the decayed Momentum's learning rate in psflow's JSON form; it round-trips."""
    spec = optimizer_spec("momentum_exp_decay")
    assert spec.schedule == ScheduleSpec("exponential_decay", {"learning_rate": 0.1, "decay_steps": 2,
                                                               "decay_rate": 0.5, "staircase": True})
    assert OptimizerSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec


def _run_case(case: str, mode: str) -> list[tuple[np.ndarray, dict[str, np.ndarray]]]:
    """Applies the golden gradients step by step at the recorded global steps; var and slots after each."""
    opt = make_optimizer(optimizer_spec(case))
    var = np.array(OPTIMIZERS["initial"], dtype=np.float32)
    slots = opt.create_slots(var)
    out = []
    for t, record in enumerate(OPTIMIZERS["cases"][case][mode]):
        step = record["global_step"] - 1  # the step read before this update's increment
        if mode == "dense":
            opt.apply_dense(var, slots, np.array(OPTIMIZERS["dense_gradients"][t], np.float32), step=step)
        else:
            sparse = OPTIMIZERS["sparse_gradients"][t]
            opt.apply_sparse(var, slots, np.array(sparse["indices"], np.int64),
                             np.array(sparse["values"], np.float32), step=step)
        out.append((var.copy(), {name: value.copy() for name, value in slots.items()}))
    return out


def _kernels_or_skip() -> Any:
    try:
        return importlib.import_module("psflow.ps._kernels")
    except ImportError:
        pytest.skip("psflow.ps._kernels was not built")


@pytest.mark.parametrize("native", [False, True], ids=["numpy", "C"])
@pytest.mark.parametrize("mode", ["dense", "sparse"])
@pytest.mark.parametrize("case", sorted(OPTIMIZERS["cases"]))
def test_optimizer_matches_tensorflow_after_every_step(case: str, mode: str, native: bool,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(optimizers, "_KERNELS", _kernels_or_skip() if native else None)
    records = OPTIMIZERS["cases"][case][mode]
    assert [r["global_step"] for r in records] == list(range(1, len(records) + 1))
    for t, ((var, slots), record) in enumerate(zip(_run_case(case, mode), records, strict=True)):
        assert sorted(slots) == sorted(record["slots"])
        np.testing.assert_allclose(var, record["var"], rtol=RTOL, err_msg=f"{case} {mode} step {t}: var")
        for name, value in record["slots"].items():
            np.testing.assert_allclose(slots[name], value, rtol=RTOL, err_msg=f"{case} {mode} step {t}: {name}")


@pytest.mark.parametrize("mode", ["dense", "sparse"])
@pytest.mark.parametrize("case", sorted(OPTIMIZERS["cases"]))
def test_numpy_and_c_agree_bit_for_bit(case: str, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = _kernels_or_skip()
    monkeypatch.setattr(optimizers, "_KERNELS", None)
    with_numpy = _run_case(case, mode)
    monkeypatch.setattr(optimizers, "_KERNELS", kernels)
    with_c = _run_case(case, mode)
    for (var_np, slots_np), (var_c, slots_c) in zip(with_numpy, with_c, strict=True):
        assert var_np.tobytes() == var_c.tobytes()
        assert all(slots_np[name].tobytes() == slots_c[name].tobytes() for name in slots_np)


def test_sparse_rmsprop_touches_only_the_looked_up_rows() -> None:
    """An untouched row keeps its value and its slots (rms stays at TF1's initial 1.0) in TF's record too."""
    for t, (var, slots) in enumerate(_run_case("rmsprop_centered", "sparse")):
        touched = {i for g in OPTIMIZERS["sparse_gradients"][: t + 1] for i in g["indices"]}
        for row in set(range(var.shape[0])) - touched:
            np.testing.assert_array_equal(var[row], np.array(OPTIMIZERS["initial"][row], np.float32))
            assert (slots["rms"][row] == 1.0).all() and not slots["mg"][row].any() and not slots["momentum"][row].any()


@pytest.mark.parametrize("mode", ["dense", "sparse"])
@pytest.mark.parametrize("case", sorted(OPTIMIZERS["cases"]))
def test_moving_averages_match_tensorflow_after_every_step(case: str, mode: str) -> None:
    """A partition created with a decay starts its average at the initial value; after each update the average
    moves at the global step after the increment -- every row, the untouched rows of a sparse step too."""
    initial = np.array(OPTIMIZERS["initial"], np.float32)
    records = OPTIMIZERS["cases"][case][mode]
    for decay in OPTIMIZERS["ema_decays"]:
        part = ParameterStore().create("w", 0, initial.shape, 0, initial.shape[0], "float32",
                                       {"name": "constant", "value": 0.0}, make_optimizer(optimizer_spec(case)),
                                       average_decay=decay)
        part.value[...] = initial
        assert part.average is not None
        part.average[...] = initial
        averages = MovingAverages("/job:ps/task:0", catch_up=False)
        for t, record in enumerate(records):
            step = record["global_step"]
            if mode == "dense":
                ParameterStore.apply_dense(part, np.array(OPTIMIZERS["dense_gradients"][t], np.float32), step=step - 1)
            else:
                sparse = OPTIMIZERS["sparse_gradients"][t]
                ParameterStore.apply_sparse(part, np.array(sparse["indices"], np.int64),
                                            np.array(sparse["values"], np.float32), step=step - 1)
            assert averages.move([part], step) == 1
            np.testing.assert_allclose(part.value, record["var"], rtol=RTOL, err_msg=f"{case} {mode} step {step}: var")
            np.testing.assert_allclose(part.average, record["ema"][str(decay)], rtol=RTOL,
                                       err_msg=f"{case} {mode} step {step}: average at decay {decay}")
