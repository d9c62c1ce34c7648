"""A chief's save given up past --save-timeout (psflow.checkpoint.bounded_save) may still be in a call on a ps task
while the chief trains on: its calls must not hold up, mis-route or disturb the training thread's pushes.

Over the tcp carrier a connection serves one call at a time, so a save sharing the training thread's client held
the connection for as long as the ps task's shard write was stuck, and the chief's next push failed after
--rpc-timeout ("the connection stayed busy with an earlier call"). The save's calls now go on a client of its own
(:func:`psflow.checkpoint.bounded_save.save_client`). The stuck write is real: the ps task writes its shard into a
FIFO at its temp file's name, which the test reads only once the pushes are done.
"""

from __future__ import annotations

import os
import select
import threading
from pathlib import Path

import numpy as np
import pytest
from support import TOKEN, ClusterHandle

from psflow.checkpoint.bounded_save import BoundedSaves, SaveAbandonedError
from psflow.checkpoint.save import CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.gradients import SparseGradient
from psflow.launch.ports import free_ports
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SaveShardRequest
from psflow.rpc.api import ConnectConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

PUSHES = 30


@pytest.mark.parametrize("replicated", [False, True], ids=["tcp", "tcp-ps-replicas-1"])
def test_pushes_go_on_while_a_given_up_save_is_stuck_in_a_call(tmp_path: Path, replicated: bool) -> None:
    ports = free_ports(2)
    jobs = {"ps": [f"127.0.0.1:{ports[0]}"], **({"ps_backup": [f"127.0.0.1:{ports[1]}"]} if replicated else {})}
    handle = ClusterHandle(ClusterSpec(jobs), tmp_path, TOKEN)
    handle.start("ps", 0)
    if replicated:
        handle.start("ps_backup", 0)
    reader: int | None = None
    try:
        vs = VariableSet(replica_device_setter(cluster=handle.cluster))
        vs.get_variable("w", (100, 4), initializer={"name": "zeros"})
        vs.get_variable("big", (50_000, 4), initializer={"name": "random_normal", "seed": 1})
        client = ParameterClient(handle.cluster, vs.placements(), client_name="/job:worker/task:0",
                                 config=ConnectConfig(token=TOKEN, transport="tcp", connect_timeout=60, rpc_timeout=10,
                                                      save_timeout=1.0))
        client.connect()
        client.register(OptimizerSpec("sgd", {"learning_rate": 1.0}), chief=True)
        # Every row of "big" built: the shard outgrows the FIFO's buffer, so the ps task's write blocks mid-way.
        client.pull({"big": np.arange(50_000, dtype=np.int64)}, create=True)
        directory = tmp_path / "ckpt"
        directory.mkdir()
        target = directory / "shard-00000-of-00001.safetensors"
        fifo = f"{target}.tmp-{handle.procs[('ps', 0)].pid}"  # psflow.storage.write_atomically's temp file
        os.mkfifo(fifo)
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # (the ps task's open then does not block: its write does)
        ended = threading.Event()
        used: list[ParameterClient] = []

        def save(own: ParameterClient) -> object:
            used.append(own)
            try:
                return own.call(0, SaveShardRequest(str(target), 0, 1), timeout=120)
            finally:
                ended.set()

        with pytest.raises(SaveAbandonedError, match="given up: no end within --save-timeout"):
            BoundedSaves(CheckpointManager(str(directory))).run(client, "the checkpoint save", save)
        # The ps task is in the shard's write (its first bytes arrived) and blocks there: the save's call is in flight.
        assert select.select([reader], [], [], 120)[0], handle.logs()
        assert not ended.is_set() and used and used[0] is not client
        steps, expected = [], np.zeros((100, 4), np.float32)
        for k in range(PUSHES):
            rows = np.array([k % 100, (7 * k + 3) % 100], np.int64)  # (never the same row twice in one push)
            steps.append(client.push({"w": SparseGradient(rows, np.full((2, 4), 1.0 + k, np.float32))}))
            expected[rows] -= 1.0 + k
        # Each push applied once, with its own reply: global_step 1..PUSHES in order, the rows exactly their pushes'.
        assert steps == list(range(1, PUSHES + 1))
        assert client.global_step() == PUSHES
        assert np.array_equal(client.pull({"w": np.arange(100, dtype=np.int64)})["w"], expected)
        if replicated:
            assert client.acked == {0: PUSHES} and client.router is not None and client.router.failovers == 0
        # Let the write go: the save's call ends (the FIFO cannot be fsynced: refused), its client closed.
        while True:
            select.select([reader], [], [], 60)
            try:
                if not os.read(reader, 1 << 20):
                    break
            except BlockingIOError:
                continue
        assert ended.wait(120)
        client.close()
    finally:
        if reader is not None:
            os.close(reader)
        handle.stop_all()
