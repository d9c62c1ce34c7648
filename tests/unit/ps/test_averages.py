"""Moving averages on the ps tasks (psflow.ps.averages): TF's rule, the step each task moves at (async on the
step task and off it, sync), steps a task got no push for, reading the averages, and the layout that asks."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.models.api import VariableSpec
from psflow.optim import OptimizerSpec
from psflow.placement import PlacementError, VariableSet, fixed_size_partitioner, layout_mismatch, replica_device_setter
from psflow.placement.api import VariableDef
from psflow.ps import averages as averages_module
from psflow.ps.averages import MovingAverages, catch_up_factor, effective_decay, move_toward
from psflow.ps.client import ParameterClient
from psflow.ps.optimizers import make_optimizer
from psflow.ps.service import ParameterService
from psflow.ps.store import ParameterStore
from psflow.ps.sync import SyncConfig
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.config import ConfigError, TrainConfig

SGD = OptimizerSpec("sgd", {"learning_rate": 0.5})
CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})


def _reference(value_after: list[np.ndarray], initial: np.ndarray, decay: float) -> np.ndarray:
    """TF's rule applied step by step in float32 (step t = 1, 2, ...: the value after step t)."""
    shadow = initial.astype(np.float32).copy()
    for t, value in enumerate(value_after, start=1):
        d = min(np.float32(decay), (np.float32(1) + np.float32(t)) / (np.float32(10) + np.float32(t)))
        shadow -= (shadow - value) * (np.float32(1) - d)
    return shadow


# ---- the rule -----------------------------------------------------------------------------------------------
def test_effective_decay_is_tfs_min_in_float32() -> None:
    assert effective_decay(0.9999, 0) == np.float32(0.1)
    assert effective_decay(0.9999, 1) == np.float32(2) / np.float32(11)
    assert effective_decay(0.9, 1000) == np.float32(0.9)
    assert effective_decay(0.9, 1000).dtype == np.float32


def test_a_chunked_update_of_a_large_table_equals_the_plain_rule_bit_for_bit() -> None:
    rng = np.random.default_rng(0)
    shape = (3 * averages_module._CHUNK // 8 + 5, 8)  # several chunks and a short tail
    shadow, value = rng.normal(size=shape).astype(np.float32), rng.normal(size=shape).astype(np.float32)
    want = shadow - (shadow - value) * (np.float32(1) - np.float32(0.9))
    move_toward(shadow, value, np.float32(0.9))
    assert shadow.tobytes() == want.astype(np.float32).tobytes()
    scalar = np.array(2.0, np.float32)
    move_toward(scalar, np.array(1.0, np.float32), np.float32(0.75))
    assert scalar == np.float32(1.75)


@pytest.mark.parametrize(("decay", "first", "last"), [(0.9, 1, 6), (0.9, 70, 95), (0.9, 81, 200), (0.9999, 3, 50000),
                                                      (1.0, 5, 40), (0.5, 1, 1), (0.9, 7, 6)])
def test_catch_up_factor_is_the_product_of_the_skipped_steps_decays(decay: float, first: int, last: int) -> None:
    n = np.arange(first, last + 1, dtype=np.float64)
    want = float(np.prod(np.minimum(decay, (1 + n) / (10 + n)))) if last >= first else 1.0
    assert catch_up_factor(decay, first, last) == pytest.approx(want, rel=1e-9)


def test_a_task_without_pushes_for_some_steps_catches_up_as_if_it_had_moved_every_step() -> None:
    """Off the step task, steps with no push here left the variable unchanged: caught up before the next
    update (the order of a push: catch up to the step read, apply, move at the step after), the shadow is
    what moving every step would have given."""
    part = ParameterStore().create("w", 0, (4, 2), 0, 4, "float32", {"name": "constant", "value": 1.0},
                                   make_optimizer(SGD), average_decay=0.9)
    assert part.average is not None
    averages = MovingAverages("/job:ps/task:1", catch_up=True)
    values = []
    for step in range(1, 41):
        if step % 7 in (1, 2):  # pushes reach this task in these steps only
            assert averages.catch_up([part], step - 1) == (step % 7 == 1 and step > 1)  # after a gap only
            ParameterStore.apply_dense(part, np.full((4, 2), step % 3 - 1.0, np.float32))
            assert averages.move([part], step) == 1
        values.append(part.value.copy())
    assert averages.last_step == 37
    np.testing.assert_allclose(part.average, _reference(values[:37], np.ones((4, 2), np.float32), 0.9), rtol=1e-6)
    assert averages.catch_up([part], 40) == 1 and averages.catch_up([part], 39) == 0  # a read at step 40
    np.testing.assert_allclose(part.average, _reference(values, np.ones((4, 2), np.float32), 0.9), rtol=1e-6)
    assert MovingAverages("/job:ps/task:0", catch_up=False).catch_up([part], 99) == 0


# ---- the layout that asks for averages ----------------------------------------------------------------------
def test_a_variable_spec_takes_its_own_decay_or_the_runs() -> None:
    assert VariableSpec("w", (2,)).average_decay(None) is None
    assert VariableSpec("w", (2,)).average_decay(0.99) == 0.99
    assert VariableSpec("w", (2,)).average_decay(0.0) is None
    assert VariableSpec("w", (2,), moving_average_decay=0.9).average_decay(0.99) == 0.9
    assert VariableSpec("w", (2,), moving_average_decay=0.0).average_decay(0.99) is None  # left out of the run's
    assert VariableSpec("w", (2,), trainable=False).average_decay(0.99) is None
    assert VariableSpec("emb", (0, 4), dynamic={"capacity_rows": 10}).average_decay(0.99) is None


def test_the_layout_carries_the_decay_and_refuses_what_cannot_be_averaged() -> None:
    var = VariableDef("w", (3,), moving_average_decay=0.99)
    assert var.to_dict()["moving_average_decay"] == 0.99 and VariableDef.from_dict(var.to_dict()) == var
    assert "moving_average_decay" not in VariableDef("w", (3,)).to_dict()  # layouts without averages are unchanged
    with pytest.raises(PlacementError, match="moving_average_decay must be a number in \\(0, 1\\], got 1.5"):
        VariableDef("w", (3,), moving_average_decay=1.5)
    with pytest.raises(PlacementError, match="only a trainable static variable has a moving average \\(not trainable\\)"):
        VariableDef("w", (3,), trainable=False, moving_average_decay=0.9)
    a, b = VariableSet(replica_device_setter(1)), VariableSet(replica_device_setter(1))
    a.get_variable("w", (3,), moving_average_decay=0.9)
    b.get_variable("w", (3,))
    assert layout_mismatch(a.placements(), b.placements()) == \
        "variable 'w': moving_average_decay None here, 0.9 registered by another client"


def test_the_run_flag_is_checked() -> None:
    assert TrainConfig.flat(moving_average_decay=0.9999).optimizer.moving_average_decay == 0.9999
    with pytest.raises(ConfigError, match="--moving-average-decay must be in \\[0, 1\\] \\(0: none\\), got 1.5"):
        TrainConfig.flat(moving_average_decay=1.5)


# ---- on ps services, through a client ------------------------------------------------------------------------
def _cluster(sync: SyncConfig | None = None, workers: int = 1) -> tuple[list[ParameterService], list[ParameterClient]]:
    """2 ps services: 'w' (averaged, 4 rows in 2 partitions: rows 0-1 on ps 0, 2-3 on ps 1), 'b' (not averaged)."""
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("w", (4, 2), initializer={"name": "constant", "value": 1.0}, partitioner=fixed_size_partitioner(2),
                    moving_average_decay=0.9)
    vs.get_variable("b", (2,))
    services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    clients = [ParameterClient(CLUSTER, vs.placements(), client_name=f"/job:worker/task:{k}", channels=channels,
                               sync=sync) for k in range(workers)]
    clients[0].register(SGD, chief=True)
    assert [p.task for p in clients[0].layout["w"].partitions] == [0, 1]
    return services, clients


def test_async_pushes_move_every_averaged_row_on_both_tasks_and_evaluation_reads_them() -> None:
    services, (client,) = _cluster()
    from psflow.gradients import DenseGradient, SparseGradient

    values = []
    for t in range(6):
        client.pull({"w": None})  # a worker pulls first: ps task 1 hears the step
        if t % 2:
            grads = {"w": SparseGradient(np.array([0], np.int64), np.ones((1, 2), np.float32))}  # ps task 0 only
        else:
            grads = {"w": DenseGradient(np.full((4, 2), t - 2.0, np.float32)), "b": DenseGradient(np.ones(2, np.float32))}
        assert client.push(grads) == t + 1
        values.append(client.pull({"w": None})["w"])
    want = _reference(values, np.ones((4, 2), np.float32), 0.9)
    # rows 2-3 (ps task 1) had no push in steps 2, 4 and 6: caught up at the pushes of steps 3 and 5; step 6
    # is caught up when the averages are read
    lagging = services[1].store.get("w/part_1").average
    assert lagging is not None and services[1].averages.last_step == 5
    np.testing.assert_allclose(lagging, _reference(values[:5], np.ones((4, 2), np.float32), 0.9)[2:], rtol=1e-6)
    np.testing.assert_allclose(client.pull({"w": None}, averages=True)["w"], want, rtol=1e-6)
    assert services[1].averages.last_step == 6
    rows = client.pull({"w": np.array([3, 0], np.int64), "b": None}, averages=True)
    np.testing.assert_allclose(rows["w"], want[[3, 0]], rtol=1e-6)
    np.testing.assert_array_equal(rows["b"], client.pull({"b": None})["b"])  # not averaged: its value
    assert services[0].store.get("b/part_0").average is None


def test_sync_mode_moves_the_averages_once_per_aggregated_step_on_every_task() -> None:
    from psflow.gradients import DenseGradient

    services, clients = _cluster(SyncConfig(mode="sync", replicas_to_aggregate=2, total_num_replicas=2), workers=2)
    values = []
    for t in range(4):
        read = [c.pull({"w": None}) for c in clients]
        assert all(c.last_pull_step == t for c in clients)
        pushers = [threading.Thread(target=c.push, args=({"w": DenseGradient(np.full((4, 2), float(k + t), np.float32))},))
                   for k, c in enumerate(clients)]
        for p in pushers:
            p.start()
        for p in pushers:
            p.join(10)
        assert read and services[0].global_step is not None and services[0].global_step.value == t + 1
        values.append(clients[0].pull({"w": None})["w"])
    np.testing.assert_allclose(clients[0].pull({"w": None}, averages=True)["w"],
                               _reference(values, np.ones((4, 2), np.float32), 0.9), rtol=1e-6)
    assert [s.averages.last_step for s in services] == [4, 4]


def test_a_checkpoint_shard_holds_the_average_as_a_slot_and_a_load_restores_it() -> None:
    services, (client,) = _cluster()
    from psflow.gradients import DenseGradient

    client.push({"w": DenseGradient(np.full((4, 2), 2.0, np.float32))})
    meta, _ = services[1].handlers()["SaveShard"](Frame({"path": None}))
    assert [p["slots"] for p in meta["partitions"] if p["var"] == "w"] == [["ExponentialMovingAverage"]]
    average = np.full((2, 2), 7.0, np.float32)
    services[1].handlers()["LoadShard"](Frame({"parts": ["w/part_1"], "restored_step": 9},
                                              {"v/w/part_1": np.zeros((2, 2), np.float32),
                                               "s/w/part_1/ExponentialMovingAverage": average}))
    np.testing.assert_array_equal(services[1].store.get("w/part_1").average, average)
    assert services[1].averages.last_step == 9
