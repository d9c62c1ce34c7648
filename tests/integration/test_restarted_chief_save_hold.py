"""A chief restarted mid-save while its killed process's save notices still arrive (psflow.ps.save_hold): a real
ps task process, the chief's two processes and the other worker as clients over real gRPC."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
from support import TOKEN, ClusterHandle

from psflow.checkpoint.save_notice import notify_save
from psflow.gradients import DenseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SaveNoticeReply, SaveNoticeRequest
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import ConnectConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

CHIEF, OTHER = "/job:worker/task:0", "/job:worker/task:1"
SGD = OptimizerSpec("sgd", {"learning_rate": 0.1})
SYNC = SyncConfig(mode="sync", replicas_to_aggregate=2, total_num_replicas=2, timeout=2.0)


def _client(handle: ClusterHandle, name: str, save_timeout: float = 600.0) -> ParameterClient:
    vs = VariableSet(replica_device_setter(cluster=handle.cluster))
    vs.get_variable("w", (4, 2), initializer={"name": "zeros"})
    client = ParameterClient(handle.cluster, vs.placements(), client_name=name, sync=SYNC,
                             config=ConnectConfig(connect_timeout=30, token=TOKEN, save_timeout=save_timeout))
    client.connect()
    return client


def test_a_killed_chiefs_late_notices_neither_end_nor_prolong_the_restarted_chiefs_save(local_cluster: Any) -> None:
    """The chief's first process registered and was killed; its notice thread goes on sending (every 0.3 s) while
    the restarted process saves (--save-timeout 3 s, a save stuck in storage) and the other worker's push waits
    for the step. Before, each late notice ended the new process's save and held the step for the dead one's
    (restarted at each): the step never timed out, the run hung. Now they are ignored and answered 'send no more',
    and the step times out --sync-timeout after the new process's bound, the error naming the flag."""
    handle = local_cluster(1)
    killed = _client(handle, CHIEF)
    killed.register(SGD, chief=True)
    restarted = _client(handle, CHIEF, save_timeout=3.0)
    assert restarted.incarnation > killed.incarnation
    restarted.register(SGD, chief=True)
    other = _client(handle, OTHER)
    other.register(SGD)
    late = SaveNoticeRequest(CHIEF, "/ckpt/of/the/killed/process", 0, True, 600.0, killed.incarnation)
    replies: list[SaveNoticeReply] = []
    stop = threading.Event()

    def outlived() -> None:
        while not stop.wait(0.3):
            replies.append(SaveNoticeReply.from_frame(killed.channels[0].call(late.METHOD, late.to_frame().meta)))

    out: dict[str, str] = {}

    def push() -> None:
        try:
            other.push_detailed({"w": DenseGradient(np.ones((4, 2), np.float32))}, examples=8, read_step=0)
            out["applied"] = "the step applied without the chief's gradient"
        except Exception as e:  # the step's refusal, as the client raises it
            out["error"] = str(e)

    notices = threading.Thread(target=outlived, daemon=True)
    pushing = threading.Thread(target=push, daemon=True)
    try:
        with notify_save(restarted, "/ckpt/of/the/restarted/process"):
            notices.start()
            pushing.start()
            pushing.join(120)  # the bound and the timeout are 5 s; far more, however loaded the machine
    finally:
        stop.set()
        notices.join(30)
    assert not pushing.is_alive(), "the step was still held 120 s into a save with a 3 s --save-timeout"
    error = out.get("error", "")
    assert "sync step 0 timed out" in error and "into /ckpt/of/the/restarted/process" in error, out
    assert "longer than its --save-timeout (3 s)" in error and "killed" not in error, out
    assert replies and all(r.renew_every is None for r in replies), replies
    killed.close()
    restarted.close()
    other.close()
