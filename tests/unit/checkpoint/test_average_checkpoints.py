"""Moving averages in checkpoints (in-process ps services): saved as the slot ExponentialMovingAverage, re-sliced
onto another number of ps tasks, started at the restored value when a checkpoint has none, left out for a run
that keeps none; the resume check and the memory check count them apart from the optimizer's slots."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.restore import restore
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.variables import averaged_variables, read_variables
from psflow.cluster import ClusterSpec
from psflow.gradients import DenseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.build import build_model
from psflow.train.config import TrainConfig
from psflow.train.preflight import check_resume, ps_memory

SGD = OptimizerSpec("sgd", {"learning_rate": 0.5})


def _client(num_ps: int, decay: float | None, sync: SyncConfig | None = None) -> ParameterClient:
    """``num_ps`` in-process ps services holding 'w' (6 rows, one partition per task; averaged at ``decay``)."""
    cluster = ClusterSpec({"ps": [f"127.0.0.1:{i + 1}" for i in range(num_ps)]})
    vs = VariableSet(replica_device_setter(cluster=cluster))
    vs.get_variable("w", (6, 2), initializer={"name": "constant", "value": 1.0},
                    partitioner=fixed_size_partitioner(num_ps) if num_ps > 1 else None, moving_average_decay=decay)
    services = [ParameterService(i, holds_global_step=i == 0) for i in range(num_ps)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    client = ParameterClient(cluster, vs.placements(), client_name="/job:worker/task:0", channels=channels, sync=sync)
    client.register(SGD, chief=True)
    return client


def _train(client: ParameterClient, steps: int) -> None:
    for t in range(steps):
        client.pull({"w": None})
        client.push({"w": DenseGradient(np.arange(12, dtype=np.float32).reshape(6, 2) * (t % 2 - 0.5))})


def test_averages_restore_re_sliced_onto_another_number_of_ps_tasks(tmp_path: Path) -> None:
    source = _client(2, 0.9)
    _train(source, 5)
    saved = CheckpointManager(str(tmp_path / "ckpt"), transport="rpc").save(source, optimizer=SGD.to_json())
    assert averaged_variables(read_manifest(saved.path)) == ["w"]
    want = source.pull({"w": None}, averages=True)["w"]
    np.testing.assert_array_equal(read_variables(saved.path, moving_averages=True)["w"], want)
    others = [_client(num_ps, 0.9) for num_ps in (1, 3)]
    for other in others:
        restore(other, saved.path)
        np.testing.assert_array_equal(other.pull({"w": None}, averages=True)["w"], want)
    for client in (source, *others):
        _train(client, 1)  # moves at step 6 on every task
    for other in others:
        np.testing.assert_allclose(other.pull({"w": None}, averages=True)["w"],
                                   source.pull({"w": None}, averages=True)["w"], rtol=1e-6)


def test_a_checkpoint_without_averages_starts_them_at_the_restored_value_and_a_run_without_drops_them(
        tmp_path: Path) -> None:
    plain = _client(2, None)
    _train(plain, 3)
    saved = CheckpointManager(str(tmp_path / "plain"), transport="rpc").save(plain, optimizer=SGD.to_json())
    assert averaged_variables(read_manifest(saved.path)) == []
    averaged = _client(2, 0.9)
    restore(averaged, saved.path)
    value = plain.pull({"w": None})["w"]
    np.testing.assert_array_equal(averaged.pull({"w": None}, averages=True)["w"], value)

    _train(averaged, 2)
    again = CheckpointManager(str(tmp_path / "averaged"), transport="rpc").save(averaged, optimizer=SGD.to_json())
    fresh = _client(2, None)
    restore(fresh, again.path)  # its average is left out
    np.testing.assert_array_equal(fresh.pull({"w": None})["w"], averaged.pull({"w": None})["w"])


def test_the_resume_check_does_not_count_an_average_as_an_optimizer_slot(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    config = TrainConfig.flat(train=("unused",), num_features=124, num_ps=1, optimizer="sgd", checkpoint_dir=str(ckpt),
                              moving_average_decay=0.99)
    _, variables = build_model(config, ClusterSpec({"ps": ["127.0.0.1:1"]}))
    assert [p.var.moving_average_decay for p in variables.placements()] == [0.99, 0.99]  # weights, bias
    services = [ParameterService(0, holds_global_step=True)]
    client = ParameterClient(ClusterSpec({"ps": ["127.0.0.1:1"]}), variables.placements(), client_name="chief",
                             channels={0: InProcessChannel("/job:ps/task:0", services[0].handlers())})
    client.register(config.optimizer_spec(), chief=True)
    CheckpointManager(str(ckpt), transport="rpc").save(client, optimizer=config.optimizer_spec().to_json())
    for resumed in (config, config.with_(moving_average_decay=None)):
        _, layout = build_model(resumed, ClusterSpec({"ps": ["127.0.0.1:1"]}))
        check_resume(resumed, layout.placements())  # sgd has no slots: the average is not one
    adam = config.with_(optimizer="adam")
    with pytest.raises(Exception, match="has slots none\\); this run asks for adam"):
        check_resume(adam, build_model(adam, ClusterSpec({"ps": ["127.0.0.1:1"]}))[1].placements())
    (weights, *_) = ps_memory(variables.placements(), config.optimizer_spec())
    assert (weights.bytes, weights.slots) == (124 * 4 * 2, 1)  # values and their average


def test_a_resumed_sync_run_continues_at_the_checkpoints_step_on_every_ps_task(tmp_path: Path) -> None:
    """In sync mode each ps task counts its aggregated steps; a restore starts every task's count at the
    checkpoint's step (ps task 1 refused the resumed workers' gradients as 'ahead of step 0' before), and the
    averages move at the steps after it."""
    sync = SyncConfig(mode="sync", replicas_to_aggregate=1, total_num_replicas=1)
    source = _client(2, 0.9, sync)
    _train(source, 3)
    saved = CheckpointManager(str(tmp_path / "ckpt"), transport="rpc").save(source, optimizer=SGD.to_json())
    resumed = _client(2, 0.9, sync)
    restore(resumed, saved.path)
    for client in (source, resumed):
        _train(client, 2)
        assert client.last_pull_step == 4 and client.global_step() == 5
    np.testing.assert_allclose(resumed.pull({"w": None}, averages=True)["w"], source.pull({"w": None}, averages=True)["w"],
                               rtol=1e-6)
