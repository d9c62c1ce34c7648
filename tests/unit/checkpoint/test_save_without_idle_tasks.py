"""A checkpoint save asks no ps task that holds nothing (``psflow.ps.idle.idle_tasks``) for a shard.

Seen in a real run with default flags (psflow train --ps 4 --workers 1 --model logistic --save-checkpoints-steps 5
--restart-policy on-failure --chaos kill:ps:3@step=15): ps tasks 2-3 hold none of the model's two variables; while
ps task 3 was down (killed, restarting, not yet readmitted) the saves at steps 15, 20 and 25 failed on
'shard-00003-of-00004 ... /job:ps/task:3 UNAVAILABLE', the third in a row stopped the run (--max-failed-saves 3),
exit 1: a task holding nothing stopped the run. Its shard holds nothing a restore needs, so the save neither writes
it nor asks the task whether it was restored since (its fence is still asked: a newer chief's epoch there refuses
the save; silence there does not). The checkpoint restores onto any number of ps tasks.

Real in-process ps services: ``weights`` on ps task 0, ``bias`` on ps task 1, nothing on ps tasks 2 and 3.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from two_ps_in_process import SGD

from psflow.checkpoint.restore import restore
from psflow.checkpoint.save import CheckpointFencedError, CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.gradients import DenseGradient
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import FenceRequest
from psflow.ps.service import ParameterService
from psflow.rpc.api import TaskUnavailableError
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import join_cluster

pytestmark = pytest.mark.timeout(60)


def _cluster(num_ps: int) -> tuple[ParameterClient, list[ParameterService]]:
    cluster = ClusterSpec({"ps": [f"127.0.0.1:{i + 1}" for i in range(num_ps)]})
    vs = VariableSet(replica_device_setter(cluster=cluster))
    vs.get_variable("weights", (8, 2), initializer={"name": "random_normal", "seed": 3})  # ps task 0
    vs.get_variable("bias", (2,), initializer={"name": "random_normal", "seed": 4})       # ps task 1 (0 of 1)
    services = [ParameterService(i, holds_global_step=i == 0) for i in range(num_ps)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    client = ParameterClient(cluster, vs.placements(), client_name="/job:worker/task:0", channels=channels)
    return client, services


def _trained(steps: int = 3) -> tuple[ParameterClient, list[ParameterService]]:
    client, services = _cluster(4)
    join_cluster(client, SGD, chief=True, checkpoint_dir=None)
    for n in range(steps):
        client.push({"weights": DenseGradient(np.full((8, 2), n + 1, np.float32)),
                     "bias": DenseGradient(np.full(2, n + 1, np.float32))}, examples=10, position=f'{{"record": {n}}}')
    return client, services


class _Gone:
    """The channel of a ps task whose process is gone: every call fails as a carrier's does."""

    def __init__(self, task: str) -> None:
        self.task = task

    def call_async(self, *args: object, **kwargs: object) -> _Gone:
        return self  # a carrier's pending call: its error comes with the result

    def result(self) -> object:
        raise TaskUnavailableError(f"{self.task}: connection refused")

    def call(self, *args: object, **kwargs: object) -> object:
        return self.result()


def _shard_files(path: str) -> list[str]:
    return sorted(f for f in os.listdir(path) if f.startswith("shard-"))


@pytest.mark.parametrize("down", ["gone", "restarted"])
def test_a_save_needs_no_idle_task(tmp_path: Path, down: str) -> None:
    client, services = _trained()
    if down == "gone":
        client.channels[3] = _Gone("/job:ps/task:3")  # type: ignore[assignment]
    else:  # restarted empty, not ready, at generation 0: not yet readmitted
        services[3] = ParameterService(3, holds_global_step=False)
        client.channels[3] = InProcessChannel("/job:ps/task:3", services[3].handlers())
    saved = CheckpointManager(str(tmp_path), run_id="run-a", max_failed_saves=1).save(client)
    assert saved.global_step == 3
    assert _shard_files(saved.path) == ["shard-00000-of-00004.safetensors", "shard-00001-of-00004.safetensors"]
    manifest = json.loads((Path(saved.path) / "manifest.json").read_text())
    assert [s["task"] for s in manifest["shards"]] == ["/job:ps/task:0", "/job:ps/task:1"]


@pytest.mark.parametrize("num_ps", [1, 2, 3, 4])
def test_a_checkpoint_saved_without_idle_shards_restores_onto_any_ps_count(tmp_path: Path, num_ps: int) -> None:
    client, _ = _trained()
    trained = client.pull({"weights": None, "bias": None})
    saved = CheckpointManager(str(tmp_path), run_id="run-a").save(client)
    other, _ = _cluster(num_ps)
    other.register(SGD, chief=True)
    restore(other, saved.path)
    now = other.pull({"weights": None, "bias": None})
    np.testing.assert_array_equal(now["weights"], trained["weights"])
    np.testing.assert_array_equal(now["bias"], trained["bias"])
    assert other.ps_stats().global_step == 3


def test_increments_find_their_base_shards_without_the_idle_ones(tmp_path: Path) -> None:
    client, _ = _trained()
    manager = CheckpointManager(str(tmp_path), run_id="run-a", full_every=3, max_to_keep=5)
    manager.save(client)
    client.push({"bias": DenseGradient(np.ones(2, np.float32))}, examples=10, position='{"record": 9}')
    client.channels[2] = _Gone("/job:ps/task:2")  # type: ignore[assignment]
    increment = manager.save(client)
    manifest = json.loads((Path(increment.path) / "manifest.json").read_text())
    assert manifest["kind"] == "increment"
    trained = client.pull({"weights": None, "bias": None})
    other, _ = _cluster(2)
    other.register(SGD, chief=True)
    restore(other, increment.path)
    now = other.pull({"weights": None, "bias": None})
    np.testing.assert_array_equal(now["weights"], trained["weights"])
    np.testing.assert_array_equal(now["bias"], trained["bias"])


def test_a_newer_chiefs_epoch_on_an_idle_task_still_fences_the_save_off(tmp_path: Path) -> None:
    client, _ = _trained()
    manager = CheckpointManager(str(tmp_path), run_id="run-a")
    manager.save(client, epoch=3, holder="/job:worker/task:0")
    client.call(3, FenceRequest(4, holder="/job:worker/task:1"))  # a newer chief fenced ps task 3 (only, so far)
    with pytest.raises(CheckpointFencedError):
        manager.save(client, epoch=3, holder="/job:worker/task:0")
