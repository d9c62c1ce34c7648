"""Learning-rate schedules: specs, flags, warm-up, and the step a ps task reads them at (async, sync, Stats)."""

from __future__ import annotations

import json
import pickle
import threading
from typing import Any

import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerError, OptimizerSpec, parse_optimizer
from psflow.optim.schedules import SCHEDULE_NAMES, ScheduleError, ScheduleSpec, parse_schedule
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.global_step import GlobalStep
from psflow.ps.optimizers import make_optimizer
from psflow.ps.service import ParameterService
from psflow.ps.store import ParameterStore
from psflow.ps.sync import Contribution, SyncAggregator, SyncConfig
from psflow.rpc.framing import Frame
from psflow.train.config import ConfigError, TrainConfig

STAIRCASE = ScheduleSpec("exponential_decay", {"learning_rate": 0.1, "decay_steps": 2, "decay_rate": 0.5,
                                               "staircase": True})


# ---- specs ------------------------------------------------------------------------------------------------
def test_spec_fills_defaults_and_round_trips_through_json_and_pickle() -> None:
    spec = ScheduleSpec("polynomial_decay", {"learning_rate": 0.1, "decay_steps": 1000})
    assert dict(spec.params) == {"learning_rate": 0.1, "decay_steps": 1000, "end_learning_rate": 0.0001,
                                 "power": 1.0, "cycle": False, "warmup_steps": 0, "warmup_learning_rate": 0.0}
    assert spec.to_json() == {"schedule": "polynomial_decay", "learning_rate": 0.1, "decay_steps": 1000,
                              "end_learning_rate": 0.0001, "power": 1.0, "cycle": False}
    for other in (ScheduleSpec.from_json(json.loads(json.dumps(spec.to_json()))), pickle.loads(pickle.dumps(spec))):
        assert other == spec
    warm = ScheduleSpec("piecewise_constant", {"boundaries": [10, 20], "values": [0.3, 0.2, 0.1], "warmup_steps": 5})
    assert warm.to_json()["boundaries"] == [10, 20] and warm.to_json()["warmup_steps"] == 5
    assert ScheduleSpec.from_json(warm.to_json()) == warm


@pytest.mark.parametrize(("name", "params", "message"), [
    ("exp", {}, "unknown learning-rate schedule 'exp'; valid names: exponential_decay, "),
    ("exponential_decay", {"learning_rate": 0.1, "decay_steps": 10}, "'decay_rate' is required"),
    ("exponential_decay", {"learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5, "stair": True},
     "unknown parameter 'stair'; accepted: learning_rate, decay_steps, decay_rate, staircase, warmup_steps"),
    ("exponential_decay", {"learning_rate": 0.1, "decay_steps": 0, "decay_rate": 0.5}, "'decay_steps' must be an integer >= 1, got 0"),
    ("cosine_decay", {"learning_rate": 0.1, "decay_steps": 2.5}, "'decay_steps' must be an integer >= 1, got 2.5"),
    ("cosine_decay", {"learning_rate": "0.1", "decay_steps": 5}, "'learning_rate' must be a number, got '0.1'"),
    ("cosine_decay", {"learning_rate": float("nan"), "decay_steps": 5}, "'learning_rate' must be finite"),
    ("inverse_time_decay", {"learning_rate": 0.1, "decay_steps": 5, "decay_rate": 1, "staircase": 1},
     "'staircase' must be true or false, got 1"),
    ("cosine_decay_restarts", {"learning_rate": 0.1, "first_decay_steps": 5, "t_mul": 0.0}, "'t_mul' must be > 0"),
    ("piecewise_constant", {"boundaries": [10, 10], "values": [1.0, 2.0, 3.0]}, "'boundaries' must be increasing"),
    ("piecewise_constant", {"boundaries": [10], "values": [1.0]}, "one more entry than 'boundaries' \\(1\\), got 1"),
    ("piecewise_constant", {"boundaries": 10, "values": [1.0, 2.0]}, "'boundaries' must be a list, got 10"),
    ("piecewise_constant", {"boundaries": [1.5], "values": [1.0, 2.0]}, "'boundaries'\\[0\\] must be an integer"),
    ("constant", {"learning_rate": 0.1, "warmup_steps": -1}, "'warmup_steps' must be an integer >= 0, got -1"),
])
def test_bad_specs_name_the_parameter(name: str, params: dict[str, Any], message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        ScheduleSpec(name, params)


def test_from_json_needs_the_name() -> None:
    with pytest.raises(ScheduleError, match="has no 'schedule'"):
        ScheduleSpec.from_json({"learning_rate": 0.1})
    with pytest.raises(ScheduleError, match="must be a JSON object"):
        ScheduleSpec.from_json([1])  # type: ignore[arg-type]


def test_rules_at_their_edges() -> None:
    """Values at boundaries and past the decay's end, computed by hand (TF's conventions)."""
    piecewise = ScheduleSpec("piecewise_constant", {"boundaries": [10, 20], "values": [0.3, 0.2, 0.1]})
    assert [float(piecewise.value(t)) for t in (0, 10, 11, 20, 21)] == pytest.approx([0.3, 0.3, 0.2, 0.2, 0.1])
    cosine = ScheduleSpec("cosine_decay", {"learning_rate": 1.0, "decay_steps": 10, "alpha": 0.1})
    assert float(cosine.value(5)) == pytest.approx(0.55) and float(cosine.value(10)) == float(cosine.value(99))
    restarts = ScheduleSpec("cosine_decay_restarts", {"learning_rate": 1.0, "first_decay_steps": 10, "t_mul": 1.0,
                                                      "m_mul": 0.5})
    assert float(restarts.value(10)) == pytest.approx(0.5) and float(restarts.value(20)) == pytest.approx(0.25)
    assert float(STAIRCASE.value(3)) == pytest.approx(0.05) and float(STAIRCASE.value(4)) == pytest.approx(0.025)
    assert float(ScheduleSpec("constant", {"learning_rate": 0.3}).value(10**9)) == pytest.approx(0.3)
    assert all(isinstance(ScheduleSpec(n, _minimal(n)).value(7), np.float32) for n in SCHEDULE_NAMES)


def _minimal(name: str) -> dict[str, Any]:
    if name == "piecewise_constant":
        return {"boundaries": [5], "values": [0.2, 0.1]}
    if name == "constant":
        return {"learning_rate": 0.1}
    steps = "first_decay_steps" if name == "cosine_decay_restarts" else "decay_steps"
    return {"learning_rate": 0.1, steps: 10, **({"decay_rate": 0.5} if "decay_rate" in _params(name) else {})}


def _params(name: str) -> tuple[str, ...]:
    from psflow.optim.schedules import schedule_parameters

    return schedule_parameters(name)


def test_linear_warmup_rises_to_the_schedule_then_follows_it_unshifted() -> None:
    base = ScheduleSpec("exponential_decay", {"learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5})
    warm = ScheduleSpec("exponential_decay", {**base.params, "warmup_steps": 4, "warmup_learning_rate": 0.01})
    target = float(base.value(4))
    assert [float(warm.value(t)) for t in range(4)] == pytest.approx(
        [0.01 + (t / 4) * (target - 0.01) for t in range(4)], rel=1e-6)
    assert all(warm.value(t) == base.value(t) for t in (4, 5, 17, 100))
    ramp = [float(warm.value(t)) for t in range(6)]
    assert ramp == sorted(ramp[:5]) + ramp[5:]  # rises to step 4, then decays


# ---- flags ------------------------------------------------------------------------------------------------
def test_parse_schedule_flag_forms() -> None:
    assert parse_schedule("exponential_decay:decay_steps=100,decay_rate=0.96,staircase=true") == {
        "schedule": "exponential_decay", "decay_steps": 100, "decay_rate": 0.96, "staircase": True}
    assert parse_schedule(" piecewise_constant:boundaries=[100, 1000],values=[0.1,0.01,0.001] ") == {
        "schedule": "piecewise_constant", "boundaries": [100, 1000], "values": [0.1, 0.01, 0.001]}
    assert parse_schedule('{"schedule": "constant", "learning_rate": 0.2}') == {"schedule": "constant",
                                                                                "learning_rate": 0.2}
    for text, message in (("nope:x=1", "unknown learning-rate schedule 'nope'"),
                          ("cosine_decay:decay_steps", "'decay_steps' is not KEY=VALUE"),
                          ("cosine_decay:decay_steps=ten", "'decay_steps' must be a number, got 'ten'"),
                          ("cosine_decay:decay_steps=[1,2", "'decay_steps' must be a number, got '\\[1,2'"),
                          ("{bad", "bad JSON")):
        with pytest.raises(ScheduleError, match=message):
            parse_schedule(text)


def test_optimizer_flags_take_booleans() -> None:
    assert parse_optimizer("rmsprop:momentum=0.9,centered=true") == {
        "name": "rmsprop", "hyperparameters": {"momentum": 0.9, "centered": True}}


def test_config_fills_the_schedules_learning_rate_and_refuses_it_twice() -> None:
    def config(**kw: Any) -> TrainConfig:
        return TrainConfig.flat(train=("x",), optimizer="rmsprop", **kw)

    schedule = {"schedule": "exponential_decay", "decay_steps": 100, "decay_rate": 0.96, "staircase": True}
    spec = config(learning_rate=0.05, learning_rate_schedule=schedule,
                  optimizer_params={"momentum": 0.9, "epsilon": 1.0}).optimizer_spec()
    want = {key: value for key, value in schedule.items() if key != "schedule"} | {"learning_rate": 0.05}
    assert spec.schedule == ScheduleSpec("exponential_decay", want)
    assert spec.hyperparameters["momentum"] == 0.9 and spec.hyperparameters["epsilon"] == 1.0
    piecewise = {"schedule": "piecewise_constant", "boundaries": [5], "values": [0.2, 0.1]}
    assert config(learning_rate_schedule=piecewise).optimizer_spec().learning_rate_at(6) == pytest.approx(0.1)
    assert TrainConfig.from_json(config(learning_rate_schedule=schedule).to_json()).optimizer_spec().schedule is not None
    with pytest.raises(ConfigError, match="--learning-rate and --learning-rate-schedule ...:learning_rate both"):
        config(learning_rate=0.1, learning_rate_schedule={**schedule, "learning_rate": 0.2})
    with pytest.raises(ConfigError, match="--learning-rate-schedule: schedule 'exponential_decay': 'decay_steps' must"):
        config(learning_rate_schedule={**schedule, "decay_steps": -3})
    with pytest.raises(OptimizerError, match="'decay' must be in \\[0, 1\\], got 1.5"):
        config(optimizer_params={"decay": 1.5})


# ---- optimizers -------------------------------------------------------------------------------------------
def test_optimizer_spec_with_a_schedule_round_trips_and_checks_it() -> None:
    spec = OptimizerSpec("momentum", {"learning_rate": STAIRCASE.to_json(), "momentum": 0.9})
    assert spec.schedule == STAIRCASE
    assert spec.to_json()["hyperparameters"]["learning_rate"] == STAIRCASE.to_json()  # type: ignore[index]
    assert OptimizerSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    assert pickle.loads(pickle.dumps(spec)) == spec
    assert [spec.learning_rate_at(t) for t in range(5)] == pytest.approx([0.1, 0.1, 0.05, 0.05, 0.025])
    assert OptimizerSpec("adam").learning_rate_at(7) == pytest.approx(0.001)
    with pytest.raises(OptimizerError, match="optimizer 'sgd': hyperparameter 'learning_rate': schedule 'cosine_decay'"):
        OptimizerSpec("sgd", {"learning_rate": {"schedule": "cosine_decay", "learning_rate": 0.1}})
    with pytest.raises(OptimizerError, match="hyperparameter 'momentum' must be a number"):
        OptimizerSpec("momentum", {"learning_rate": 0.1, "momentum": STAIRCASE.to_json()})


def test_a_scheduled_update_needs_its_step_and_changes_nothing_without_it() -> None:
    opt = make_optimizer(OptimizerSpec("sgd", {"learning_rate": STAIRCASE}))
    var = np.ones((3, 2), np.float32)
    for apply in (lambda: opt.apply_dense(var, {}, np.ones((3, 2), np.float32)),
                  lambda: opt.apply_sparse(var, {}, np.array([1]), np.ones((1, 2), np.float32))):
        with pytest.raises(ValueError, match="the learning rate is a schedule \\(exponential_decay\\); an update needs"):
            apply()
    assert (var == 1.0).all()
    opt.apply_dense(var, {}, np.ones((3, 2), np.float32), step=2)  # lr 0.05
    opt.apply_sparse(var, {}, np.array([1]), np.ones((1, 2), np.float32), step=0)  # lr 0.1
    np.testing.assert_allclose(var[:, 0], [0.95, 0.85, 0.95], rtol=1e-6)


def test_concurrent_partitions_of_different_steps_each_get_their_steps_rate() -> None:
    """One optimizer serves many partitions under their own locks: its cached (step, rate) is one tuple."""
    opt = make_optimizer(OptimizerSpec("sgd", {"learning_rate": STAIRCASE}))
    errors: list[str] = []

    def run(step: int) -> None:
        var = np.zeros(1, np.float32)
        for _ in range(300):
            var[:] = 0.0
            opt.apply_dense(var, {}, np.ones(1, np.float32), step=step)
            if var[0] != -np.float32(STAIRCASE.value(step)):
                errors.append(f"step {step}: {var[0]}")

    threads = [threading.Thread(target=run, args=(s,)) for s in (0, 2, 4, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors


# ---- the step a ps task reads a schedule at ---------------------------------------------------------------
CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})


def _service(task: int, optimizer: OptimizerSpec) -> ParameterService:
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("a", (1,))  # round-robin: a on ps task 0, w on ps task 1
    vs.get_variable("w", (1,))
    svc = ParameterService(task, holds_global_step=task == 0)
    svc.register(Frame({"layout": [p.to_json() for p in vs.placements()], "optimizer": optimizer.to_json(),
                        "client": "/job:worker/task:0", "chief": True}))
    return svc


def test_async_push_reads_the_schedule_before_the_increment_and_stats_show_the_rate() -> None:
    """ps task 0 holds global_step; ps task 1 (holding w) reads the step the client sends (step_hint)."""
    spec = OptimizerSpec("sgd", {"learning_rate": STAIRCASE})
    ps0, ps1 = _service(0, spec), _service(1, spec)
    assert ps0.get_stats(Frame())[0]["learning_rate"] == pytest.approx(0.1)
    heard: int | None = None
    for t in range(5):
        ps1.push(Frame({"grads": [["w/part_0", "dense"]], "step_hint": heard}, {"g/w/part_0": np.ones(1, np.float32)}))
        heard = ps0.push(Frame({"grads": [], "step": True}))[0]["step"]
        assert heard == t + 1
    # rates at steps 0..4: 0.1, 0.1, 0.05, 0.05, 0.025
    np.testing.assert_allclose(ps1.store.get("w/part_0").value, [-0.325], rtol=1e-6)
    assert ps0.get_stats(Frame())[0]["learning_rate"] == pytest.approx(0.025)  # at step 5, the next update's
    assert ps1.get_stats(Frame())[0]["learning_rate"] == pytest.approx(0.025)  # the newest step it heard of


def test_sync_mode_advances_the_schedule_once_per_aggregated_step() -> None:
    store = ParameterStore()
    part = store.create("w", 0, (1,), 0, 1, "float32", {"name": "zeros"},
                        make_optimizer(OptimizerSpec("sgd", {"learning_rate": STAIRCASE})))
    step = GlobalStep()
    agg = SyncAggregator(SyncConfig(mode="sync", replicas_to_aggregate=2, total_num_replicas=2), store,
                         task_name="/job:ps/task:0", advance=step.increment, current=lambda: step.value)
    for s in range(4):
        waiting = threading.Thread(target=agg.contribute, args=(
            s, Contribution("/job:worker/task:0", [(part, None, np.array([1.0], np.float32))])))
        waiting.start()
        agg.contribute(s, Contribution("/job:worker/task:1", [(part, None, np.array([3.0], np.float32))]))
        waiting.join(10)
        assert step.value == s + 1
    # averaged gradient 2.0 at steps 0..3, rates 0.1, 0.1, 0.05, 0.05
    np.testing.assert_allclose(part.value, [-0.6], rtol=1e-6)


# ---- rates that would be NaN, infinite or 0 ---------------------------------------------------------------------
@pytest.mark.parametrize(("name", "params", "message"), [
    ("exponential_decay", {"learning_rate": 0.1, "decay_steps": 10, "decay_rate": -0.5},
     "'decay_rate' must be > 0 \\(a negative base to a fractional power is NaN, 0 a rate of 0\\), got -0.5"),
    ("inverse_time_decay", {"learning_rate": 0.1, "decay_steps": 1, "decay_rate": -0.1},
     "'decay_rate' must be >= 0 \\(1 \\+ decay_rate x step would reach 0: an infinite rate\\), got -0.1"),
    ("polynomial_decay", {"learning_rate": 0.1, "decay_steps": 5, "power": -1},
     "'power' must be >= 0 \\(0 to a negative power is infinite, at step decay_steps\\), got -1"),
])
def test_parameters_whose_rates_turn_nan_or_infinite_are_refused(name: str, params: dict[str, Any], message: str) -> None:
    """TF computes these rates (NaN at step 1, infinite at step 10 or 5) and the run diverges; the loss's NaN then
    named the data, not the flag."""
    with pytest.raises(ScheduleError, match=f"schedule '{name}': {message}"):
        ScheduleSpec(name, params)


@pytest.mark.parametrize(("schedule", "message"), [
    ({"schedule": "cosine_decay", "learning_rate": 0.1, "decay_steps": 1000, "warmup_steps": 10},
     "its warm-up starts at 'warmup_learning_rate' 0.0 at step 0"),
    ({"schedule": "cosine_decay", "learning_rate": 0.1, "decay_steps": 1000},
     "it reaches learning_rate x 'alpha' = 0.0 at step decay_steps"),
    ({"schedule": "polynomial_decay", "learning_rate": 0.1, "decay_steps": 1000, "end_learning_rate": 0.0},
     "it reaches 'end_learning_rate' 0.0 at step decay_steps"),
    ({"schedule": "piecewise_constant", "boundaries": [10], "values": [0.1, 0.0]}, "'values'\\[1\\] is 0.0"),
    ({"schedule": "constant", "learning_rate": -0.1}, "'learning_rate' is -0.1"),
    ({"schedule": "exponential_decay", "learning_rate": 0.0, "decay_steps": 10, "decay_rate": 0.5},
     "'learning_rate' is 0.0"),
    ({"schedule": "cosine_decay_restarts", "learning_rate": 0.1, "first_decay_steps": 10, "m_mul": 0.0},
     "'m_mul' is 0.0: every period after the first has rate 0"),
    ({"schedule": "cosine_decay_restarts", "learning_rate": 0.1, "first_decay_steps": 100},  # 0.0 at step 51099
     "its periods end at learning_rate x 'alpha' = 0.0"),
])
def test_ftrl_refuses_a_schedule_whose_rate_reaches_zero(schedule: dict[str, Any], message: str) -> None:
    """FTRL divides by its learning rate: a rate of 0 at any step is NaN there (the default optimizer with any
    warm-up trained one step, then stopped on a NaN loss that named the data)."""
    with pytest.raises(OptimizerError, match=f"optimizer 'ftrl': hyperparameter 'learning_rate' must be > 0 at every "
                                             f"step: schedule '{schedule['schedule']}': {message}"):
        OptimizerSpec("ftrl", {"learning_rate": schedule})
    OptimizerSpec("sgd", {"learning_rate": schedule})  # others take a rate of 0 (no update)
    if schedule["schedule"] == "cosine_decay_restarts" and "m_mul" not in schedule:
        assert ScheduleSpec.from_json(schedule).value(51099) == 0.0  # what FTRL would divide by


def test_ftrl_takes_the_schedules_that_stay_above_zero() -> None:
    for schedule in ({"schedule": "cosine_decay", "learning_rate": 0.1, "decay_steps": 1000, "alpha": 0.01,
                      "warmup_steps": 10, "warmup_learning_rate": 0.001},
                     {"schedule": "cosine_decay_restarts", "learning_rate": 0.1, "first_decay_steps": 100,
                      "alpha": 0.001},
                     {"schedule": "exponential_decay", "learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5},
                     {"schedule": "inverse_time_decay", "learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.0},
                     {"schedule": "natural_exp_decay", "learning_rate": 0.1, "decay_steps": 10, "decay_rate": -0.5},
                     {"schedule": "polynomial_decay", "learning_rate": 0.1, "decay_steps": 10}):
        OptimizerSpec("ftrl", {"learning_rate": schedule})


def test_a_run_s_schedule_that_ftrl_refuses_names_the_flag() -> None:
    """psflow train's default optimizer with a warm-up: the user typed --learning-rate-schedule, and the line must
    name it (it named the optimizer's hyperparameter alone); a hyperparameter of the optimizer's own still names
    the optimizer."""
    schedule = {"schedule": "cosine_decay", "decay_steps": 1000, "alpha": 0.01, "warmup_steps": 10}
    with pytest.raises(ConfigError, match="^--learning-rate-schedule: optimizer 'ftrl': hyperparameter 'learning_rate' "
                                          "must be > 0 at every step: schedule 'cosine_decay': its warm-up starts at "
                                          "'warmup_learning_rate' 0.0 at step 0"):
        TrainConfig.flat(train=("x",), optimizer="ftrl", learning_rate_schedule=schedule)
    TrainConfig.flat(train=("x",), optimizer="ftrl", learning_rate_schedule={**schedule, "warmup_learning_rate": 0.001})
    with pytest.raises(OptimizerError, match="^optimizer 'ftrl': hyperparameter 'learning_rate_power'"):
        TrainConfig.flat(train=("x",), optimizer="ftrl", optimizer_params={"learning_rate_power": 0.5},
                         learning_rate_schedule=schedule)


def test_ftrl_refuses_a_decayed_rate_that_underflows_at_the_step_it_does() -> None:
    """exponential_decay with decay_rate 0.5 per step from 0.1 falls below float32's smallest normal number at step
    123 (0 itself at 147), where FTRL's 1/rate overflows: a real run stopped at step 133 on a NaN loss naming the
    data and --learning-rate. The update at that step is refused naming the schedule's flag and the step, and
    changes nothing; the steps before it train."""
    schedule = ScheduleSpec("exponential_decay", {"learning_rate": 0.1, "decay_steps": 1, "decay_rate": 0.5})
    first = next(s for s in range(1000) if schedule.value(s) < np.finfo(np.float32).tiny)
    assert first == 123
    ftrl = make_optimizer(OptimizerSpec("ftrl", {"learning_rate": schedule}))
    var = np.ones((4, 2), np.float32)
    slots = ftrl.create_slots(var)
    ftrl.apply_dense(var, slots, np.full((4, 2), 0.5, np.float32), step=first - 1)
    before = var.copy(), {k: v.copy() for k, v in slots.items()}
    with pytest.raises(OptimizerError, match=r"^optimizer 'ftrl': the learning rate of schedule 'exponential_decay' "
                                             r"\(--learning-rate-schedule\) is \S+ at global_step 123, below"):
        ftrl.apply_dense(var, slots, np.full((4, 2), 0.5, np.float32), step=first)
    assert np.array_equal(var, before[0]) and all(np.array_equal(slots[k], v) for k, v in before[1].items())
    sgd = make_optimizer(OptimizerSpec("sgd", {"learning_rate": schedule}))
    assert sgd.learning_rate(200) == 0.0  # a rate of 0 is no update for the others


@pytest.mark.parametrize(("optimizer", "name", "params"), [
    ("sgd", "exponential_decay", {"learning_rate": 0.1, "decay_steps": 1, "decay_rate": 10.0}),
    ("rmsprop", "natural_exp_decay", {"learning_rate": 0.1, "decay_steps": 1, "decay_rate": -1.0}),
    ("ftrl", "exponential_decay", {"learning_rate": 0.1, "decay_steps": 1, "decay_rate": 10.0}),
])
def test_a_scheduled_rate_that_grows_past_float32_is_refused_at_that_step(optimizer: str, name: str,
                                                                          params: dict[str, Any]) -> None:
    """A growing schedule (TF takes decay_rate > 1, or natural_exp_decay's < 0, e.g. for a rate range test) overflows
    float32 at some step: a real sgd run with decay_rate 10 per step stopped at step 41 on a NaN loss that named the
    data and --learning-rate. The update at that step is refused naming the schedule's flag and the step, and
    changes nothing; the steps before it train."""
    schedule = ScheduleSpec(name, params)
    first = next(s for s in range(1000) if not np.isfinite(schedule.value(s)))
    opt = make_optimizer(OptimizerSpec(optimizer, {"learning_rate": schedule}))
    var = np.ones((4, 2), np.float32)
    slots = opt.create_slots(var)
    opt.apply_dense(var, slots, np.full((4, 2), 0.5, np.float32), step=first - 1)
    before = var.copy(), {k: v.copy() for k, v in slots.items()}
    with pytest.raises(OptimizerError, match=rf"^optimizer '{optimizer}': the learning rate of schedule '{name}' "
                                             rf"\(--learning-rate-schedule\) is inf at global_step {first}: not finite"):
        opt.apply_dense(var, slots, np.full((4, 2), 0.5, np.float32), step=first)
    assert np.array_equal(var, before[0]) and all(np.array_equal(slots[k], v) for k, v in before[1].items())
