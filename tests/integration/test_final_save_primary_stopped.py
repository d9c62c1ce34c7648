"""The final checkpoint of a run with ``--ps-replicas 1`` is written when shard 0's primary stops answering (SIGSTOP:
a host gone silent) exactly at the save's pointer switch (psflow/train/hooks.py ``CheckpointSaverHook.end``).

The switch asks every ps task's ``Stats`` under the directory's mutex, each within 5 s
(psflow/checkpoint/publish_checks.py ``check_no_restore_since``), and follows a failed shard to its primary once
without waiting: a primary silent for only those seconds is not provably gone, no backup is promoted yet, and the
save fails as unreachable. Before, the final save then failed the run (``FinalCheckpointError``) although the
shard's state lived on in its backup, promoted moments later, and nothing was restored. Now the final save waits
for the shard's routing to settle and saves once more, on the promoted backup.

Real processes: ps:0 and ps_backup:0 (``ClusterHandle``), the chief's client in this process (grpc, the default
``--ps-failover-timeout``, 10 s of silence); ps:0 is stopped from the check itself, just before it asks, and let go at the end.
"""

from __future__ import annotations

import os
import signal
from contextlib import suppress
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from stopped_process import wait_stopped
from support import TOKEN, ClusterHandle

from psflow.checkpoint import save
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.variables import read_variables
from psflow.cluster import ClusterSpec
from psflow.gradients import SparseGradient
from psflow.launch.ports import free_ports
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig
from psflow.train.hooks import CheckpointSaverHook

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PUSHES = 5


def test_the_final_save_is_written_on_the_backup_promoted_after_its_primary_stopped_at_the_switch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ports = free_ports(2)
    handle = ClusterHandle(ClusterSpec({"ps": [f"127.0.0.1:{ports[0]}"], "ps_backup": [f"127.0.0.1:{ports[1]}"]}),
                           tmp_path, TOKEN)
    handle.start("ps", 0)
    handle.start("ps_backup", 0)
    pid = handle.procs[("ps", 0)].pid
    stopped: list[int] = []
    try:
        vs = VariableSet(replica_device_setter(cluster=handle.cluster))
        vs.get_variable("w", (100, 4), initializer={"name": "zeros"})
        client = ParameterClient(handle.cluster, vs.placements(), client_name="/job:worker/task:0",
                                 config=ConnectConfig(token=TOKEN, connect_timeout=60, rpc_timeout=10))
        client.connect()
        client.register(OptimizerSpec("sgd", {"learning_rate": 1.0}), chief=True)
        expected = np.zeros((100, 4), np.float32)
        for k in range(PUSHES):
            rows = np.array([k, 50 + k], np.int64)
            client.push({"w": SparseGradient(rows, np.full((2, 4), 1.0 + k, np.float32))})
            expected[rows] -= 1.0 + k
        real = save.check_no_restore_since

        def stopped_at_the_check(c: Any, replies: Any, path: str) -> None:
            if not stopped:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
                wait_stopped(pid)  # (kill returns before the stop lands: on a busy machine ps:0 answered first)
            real(c, replies, path)

        monkeypatch.setattr(save, "check_no_restore_since", stopped_at_the_check)
        directory = str(tmp_path / "ckpt")
        hook = CheckpointSaverHook(CheckpointManager(directory, run_id="run-a", transport="rpc"), save_steps=100)
        hook.end(SimpleNamespace(client=client))  # type: ignore[arg-type]  # before: FinalCheckpointError
        latest = latest_checkpoint(directory)
        assert stopped and latest is not None, handle.logs()
        manifest = read_manifest(latest)
        assert manifest.final and manifest.global_step == PUSHES, manifest
        assert hook.manager.saves_failed == 1  # the first save, whose check could not ask ps:0
        np.testing.assert_array_equal(read_variables(latest)["w"], expected)
        client.close()
    finally:
        if stopped:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        handle.stop_all()
