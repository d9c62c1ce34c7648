"""TensorFlow's trainer values (tests/data/golden/trainer_tf.json) reproduced on real ps processes.

RMSProp (Inception's and centered) and Momentum with a staircase-decayed learning rate, dense and sparse, each
with a moving average at decay 0.9 and at 0.9999 (``ExponentialMovingAverage(decay, num_updates=global_step)``):
each case and decay is a variable of its own whose optimizer and decay are given per variable (the model seam's
way), partitioned over 1 and 3 ps tasks. A client sets TF's initial values, then pushes the golden gradients step
by step; after every step a checkpoint (streamed to the client) gives var, slots and moving average, compared
with TF's to 1e-6. With 3 ps tasks the partitions off ps task 0 read the schedule at the step the client reports
(the global_step before the push's increment) and move their averages at the step after it, ps task 0 at its
own counter. The last checkpoint is then restored onto the other number of ps tasks (3 or 1): the moving
averages read back as TF's, and one more step moves them as on the cluster that wrote it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import REPO

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.restore import restore
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.variables import read_variables
from psflow.checkpoint.warm_start import load_values
from psflow.gradients import DenseGradient, SparseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.averages import AVERAGE_SLOT
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GOLDEN: dict[str, Any] = json.loads((REPO / "tests" / "data" / "golden" / "trainer_tf.json").read_text())["optimizers"]
CASES = sorted(GOLDEN["cases"])
MODES = ("dense", "sparse")
DECAYS = tuple(GOLDEN["ema_decays"])  # 0.9, 0.9999
RTOL = 1e-6


def _name(case: str, mode: str, decay: float) -> str:
    return f"{case}/{mode}/decay_{decay}"


def _spec(case: str) -> OptimizerSpec:
    hyperparameters = dict(GOLDEN["cases"][case]["hyperparameters"])
    return OptimizerSpec.from_json({"name": hyperparameters.pop("optimizer"), "hyperparameters": hyperparameters})


RUN_OPTIMIZER = _spec("momentum_exp_decay")  # the run's (recorded in manifests): each variable has its own


def _client(handle: Any, partitions: int) -> ParameterClient:
    variables = VariableSet(replica_device_setter(cluster=handle.cluster))
    shape = tuple(GOLDEN["shape"])
    for case in CASES:
        for mode in MODES:
            for decay in DECAYS:
                variables.get_variable(_name(case, mode, decay), shape, optimizer=_spec(case).to_json(),
                                       partitioner=fixed_size_partitioner(partitions) if partitions > 1 else None,
                                       moving_average_decay=decay)
    client = ParameterClient(handle.cluster, variables.placements(), client_name="/job:worker/task:0",
                             config=ConnectConfig(connect_timeout=30, rpc_timeout=20, token=handle.token))
    client.connect()
    return client


def _gradients(t: int) -> dict[str, DenseGradient | SparseGradient]:
    dense = np.array(GOLDEN["dense_gradients"][t], np.float32)
    sparse = GOLDEN["sparse_gradients"][t]
    rows, values = np.array(sparse["indices"], np.int64), np.array(sparse["values"], np.float32)
    out: dict[str, DenseGradient | SparseGradient] = {}
    for case in CASES:
        for decay in DECAYS:
            out[_name(case, "dense", decay)] = DenseGradient(dense)
            out[_name(case, "sparse", decay)] = SparseGradient(rows, values)
    return out


@pytest.mark.parametrize(("num_ps", "partitions"), [(1, 1), (3, 3)], ids=["1ps", "3ps-3partitions"])
def test_rmsprop_and_decayed_momentum_with_moving_averages_match_tensorflow_on_ps_tasks(  # type: ignore[no-untyped-def]
        local_cluster, tmp_path: Path, num_ps: int, partitions: int) -> None:
    handle = local_cluster(num_ps)
    client = _client(handle, partitions)
    client.register(RUN_OPTIMIZER, chief=True)
    initial = np.array(GOLDEN["initial"], np.float32)
    load_values(client, {name: initial for name in client.layout}, "TF's initial values")
    if partitions > 1:  # every case's variable spans the 3 ps tasks
        assert all({p.task for p in placement.partitions} == {0, 1, 2} for placement in client.layout.values())
    manager = CheckpointManager(str(tmp_path / "ckpt"), transport="rpc", max_to_keep=1)
    steps = len(GOLDEN["dense_gradients"])
    for t in range(steps):
        step = client.push(_gradients(t))
        saved = manager.save(client, optimizer=RUN_OPTIMIZER.to_json())
        got = read_variables(saved.path, slots=True)
        for case in CASES:
            for mode in MODES:
                record = GOLDEN["cases"][case][mode][t]
                assert step == record["global_step"] == t + 1
                for decay in DECAYS:
                    name, where = _name(case, mode, decay), f"{case} {mode} after step {t + 1} on {num_ps} ps"
                    np.testing.assert_allclose(got[name], record["var"], rtol=RTOL, err_msg=f"{where}: var")
                    assert {k.split(":", 1)[1] for k in got if k.startswith(f"{name}:")} == {*record["slots"], AVERAGE_SLOT}
                    for slot, value in record["slots"].items():
                        np.testing.assert_allclose(got[f"{name}:{slot}"], value, rtol=RTOL, err_msg=f"{where}: {slot}")
                    np.testing.assert_allclose(got[f"{name}:{AVERAGE_SLOT}"], record["ema"][str(decay)], rtol=RTOL,
                                               err_msg=f"{where}: moving average at decay {decay}")
    # The manifest records the run's optimizer, its schedule as plain JSON that reads back as the same spec.
    recorded = json.loads((Path(saved.path) / "manifest.json").read_text())["optimizer"]
    assert recorded["hyperparameters"]["learning_rate"] == {"schedule": "exponential_decay", "learning_rate": 0.1,
                                                            "decay_steps": 2, "decay_rate": 0.5, "staircase": True}
    assert OptimizerSpec.from_json(read_manifest(saved.path).optimizer or {}) == RUN_OPTIMIZER
    # ps task 0 reports the run's rate in force: the next update's, at step 6 (0.1 * 0.5 ** 3); the others at
    # the newest step they heard of (the last push's: 5, 0.1 * 0.5 ** 2).
    assert client.stats(0)["learning_rate"] == pytest.approx(0.0125)
    assert [client.stats(i)["learning_rate"] for i in range(1, num_ps)] == [pytest.approx(0.025)] * (num_ps - 1)
    _restore_onto_the_other_number_of_ps_tasks(local_cluster, client, saved.path, 3 if num_ps == 1 else 1)


def _restore_onto_the_other_number_of_ps_tasks(local_cluster, client: ParameterClient, path: str,  # type: ignore[no-untyped-def]
                                               num_ps: int) -> None:
    """The checkpoint of step 6 restored onto ``num_ps`` ps tasks (its partitions re-sliced): the averages read
    back as TF's after step 6; one more step (the step-1 gradients, pushed after a pull as a worker does) moves
    the restored averages at step 7, exactly as the averages of the cluster that wrote the checkpoint move."""
    other = _client(local_cluster(num_ps), num_ps)
    other.register(RUN_OPTIMIZER, chief=True)
    restore(other, path)
    names = list(other.layout)
    averages = other.pull(dict.fromkeys(names), averages=True)
    for case in CASES:
        for mode in MODES:
            record = GOLDEN["cases"][case][mode][-1]
            for decay in DECAYS:
                np.testing.assert_allclose(averages[_name(case, mode, decay)], record["ema"][str(decay)], rtol=RTOL,
                                           err_msg=f"{case} {mode} restored onto {num_ps} ps: average at decay {decay}")
    after = []
    for cluster in (client, other):
        cluster.pull(dict.fromkeys(names))
        assert cluster.push(_gradients(0)) == 7
        after.append((cluster.pull(dict.fromkeys(names)), cluster.pull(dict.fromkeys(names), averages=True)))
    for name in names:
        np.testing.assert_allclose(after[1][0][name], after[0][0][name], rtol=RTOL, err_msg=f"{name} at step 7: var")
        np.testing.assert_allclose(after[1][1][name], after[0][1][name], rtol=RTOL, err_msg=f"{name} at step 7: average")
        assert not np.allclose(after[1][1][name], averages[name], rtol=1e-4), f"{name}: its average did not move"
