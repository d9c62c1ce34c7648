"""A deposed restorer's late LoadShard, over real gRPC: two real ps processes.

A restorer whose lease lapsed (stopped past ``--lease-ttl``) may still send the LoadShard calls of its restore
after a newer lease's holder began its own (BeginRestore at a newer generation, fenced by the lease's epoch): they
overwrote the newer restore's values, and its SetReady then made the cluster ready holding the older checkpoint's.
LoadShard now carries its restore's generation and is refused, nothing changed, where the task holds another
(:meth:`psflow.ps.restore_gate.RestoreGate.check_load`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import TOKEN

from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import BeginRestoreRequest, LoadShardRequest, SetReadyRequest
from psflow.rpc.api import ConnectConfig, FailedPreconditionError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

OPTIMIZER = OptimizerSpec("sgd", {"learning_rate": 1.0})
OLD_EMB = np.full((6, 2), -1.0, np.float32)   # the deposed restorer's (older) checkpoint
EMB = np.arange(12, dtype=np.float32).reshape(6, 2) + 1   # the newer restore's
BIAS = np.array([7.0, -7.0], np.float32)


def _client(handle: Any, name: str) -> ParameterClient:
    vs = VariableSet(replica_device_setter(cluster=handle.cluster))
    vs.get_variable("emb", (6, 2))   # ps task 0
    vs.get_variable("bias", (2,))    # ps task 1
    client = ParameterClient(handle.cluster, vs.placements(), client_name=name,
                             config=ConnectConfig(connect_timeout=120.0, token=TOKEN))
    client.connect()
    return client


def _loads(emb: np.ndarray, bias: np.ndarray, generation: int) -> dict[int, LoadShardRequest]:
    """The LoadShard calls of a restore at ``generation`` (``emb`` on ps task 0 with global_step 40, ``bias``)."""
    return {0: LoadShardRequest.build({"emb/part_0": emb}, {}, {}, ["emb/part_0"], global_step=40, restored_step=40,
                                      generation=generation),
            1: LoadShardRequest.build({"bias/part_0": bias}, {}, {}, ["bias/part_0"], restored_step=40,
                                      generation=generation)}


def test_a_deposed_restorers_late_load_shard_changes_nothing(local_cluster) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(2)
    a = _client(handle, "/job:worker/task:1")   # restorer A: its lease lapsed while it was stopped
    a.register(OPTIMIZER, chief=True)
    b = _client(handle, "/job:worker/task:2")   # restorer B, the newer lease's holder
    for task in (0, 1):
        a.call(task, BeginRestoreRequest(10))
    for task in (0, 1):
        b.call(task, BeginRestoreRequest(20))
    for task, load in _loads(EMB, BIAS, 20).items():
        b.call(task, load)
    for task, load in _loads(OLD_EMB, -BIAS, 10).items():  # A resumes: its loads arrive after B's
        with pytest.raises(FailedPreconditionError, match=rf"^/job:ps/task:{task}: LoadShard: LoadShard of generation "
                                                          rf"10 refused: /job:ps/task:{task} is at generation 20 "
                                                          r"\(another restore began here since\); nothing loaded"):
            a.call(task, load)
    for task in (1, 0):
        b.call(task, SetReadyRequest("/job:worker/task:2", 20, 40))
    assert [(b.ps_stats(t).ready, b.ps_stats(t).generation) for t in (0, 1)] == [(True, 20), (True, 20)]
    values = b.pull({"emb": None, "bias": None})
    assert np.array_equal(values["emb"], EMB) and np.array_equal(values["bias"], BIAS), values
    assert b.global_step() == 40

