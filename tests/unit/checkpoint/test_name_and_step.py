"""A checkpoint's directory is named after the global_step its manifest holds.

The chief reads the step, names the directory, then every ps task snapshots its shard; workers push all the
while, so the step the shards hold was later than the name's (a 3-worker a9a run: ckpt-000000102 held step 121,
and an initial ckpt-000000000 held step 3 or 4): a user restoring or listing checkpoints by name was told the
wrong step. Real in-process ps services; the pushes that land during the save are made by the ps task's
channel as the save's SaveShard reaches it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from psflow.checkpoint.manifest import read_json, read_manifest
from psflow.checkpoint.save import CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel

pytestmark = pytest.mark.timeout(60)

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
SGD = OptimizerSpec("sgd", {"learning_rate": 0.1})


class _Busy(InProcessChannel):
    """A channel to an in-process ps task on which ``pushes`` steps land just before each SaveShard."""

    pushes = 0
    counter: Any = None

    def call_async(self, method: str, meta: Any = None, arrays: Any = None, *, timeout: float | None = None) -> Any:
        if method == "SaveShard":
            for _ in range(self.pushes):
                self.counter.increment()
        return super().call_async(method, meta, arrays, timeout=timeout)


def _client(pushes: int) -> tuple[ParameterClient, Any]:
    variables = VariableSet(replica_device_setter(cluster=CLUSTER))
    variables.get_variable("w", (4, 2))
    services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]
    channels = {i: _Busy(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    channels[0].counter, channels[0].pushes = services[0].global_step, pushes
    placements = variables.placements()
    ParameterClient(CLUSTER, placements, client_name="init", channels=dict(channels)).register(SGD, chief=True)
    return ParameterClient(CLUSTER, placements, client_name="/job:worker/task:0", channels=dict(channels)), services


@pytest.mark.parametrize("full_every", [1, 2])
def test_a_checkpoint_is_named_after_the_step_it_holds(tmp_path: Path, full_every: int) -> None:
    client, _ = _client(pushes=4)
    manager = CheckpointManager(str(tmp_path / "ckpt"), run_id="run-a", full_every=full_every, max_to_keep=2)
    for expected in (4, 8, 12):  # the initial save, then an increment (full_every 2), then a full one
        saved = manager.save(client)
        assert saved.global_step == read_manifest(saved.path).global_step == expected
        assert os.path.basename(saved.path) == f"ckpt-{expected:09d}"
        assert (read_json(str(tmp_path / "ckpt" / "checkpoint")) or {}).get("latest") == f"ckpt-{expected:09d}"
    names = sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-"))
    assert names == (["ckpt-000000008", "ckpt-000000012"] if full_every == 1 else
                     ["ckpt-000000004", "ckpt-000000008", "ckpt-000000012"])  # the increment keeps its base


def test_a_name_taken_by_another_save_gets_a_suffix(tmp_path: Path) -> None:
    """Another run's checkpoint of the same step in a shared directory is left alone."""
    client, _ = _client(pushes=3)
    (tmp_path / "ckpt" / "ckpt-000000003").mkdir(parents=True)
    (tmp_path / "ckpt" / "ckpt-000000003" / "keep").write_text("another run's\n")
    saved = CheckpointManager(str(tmp_path / "ckpt"), run_id="run-a").save(client)
    assert read_manifest(saved.path).global_step == 3
    assert os.path.basename(saved.path).startswith("ckpt-000000003-")
    assert (tmp_path / "ckpt" / "ckpt-000000003" / "keep").read_text() == "another run's\n"
