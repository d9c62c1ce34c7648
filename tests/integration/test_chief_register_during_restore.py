"""A chief's Register arriving while a restore is in progress, over real gRPC: two real ps processes.

Between a restore's ``BeginRestore`` and its ``SetReady`` every ps task is registered and not ready, as a task is
after a chief died mid-initialization, which a chief's Register initializes again. A Register arriving then (a
restarted chief joining while a surviving worker restores; a second restorer) re-created the variables, wiping what
``LoadShard`` had already loaded, and the restore's ``SetReady`` then made the cluster ready holding initial
values: the trained model gone, no error. Now a Register during a restore creates nothing
(:attr:`psflow.ps.restore_gate.RestoreGate.restoring`).
"""

from __future__ import annotations

import numpy as np
import pytest
from two_ps_client import emb_bias_client

from psflow.optim import OptimizerSpec
from psflow.ps.protocol import BeginRestoreRequest, LoadShardRequest, RegisterRequest, SetReadyRequest
from psflow.ps.registration import register_tasks
from psflow.rpc.api import FailedPreconditionError, FencedOffError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

OPTIMIZER = OptimizerSpec("sgd", {"learning_rate": 1.0})
EMB = np.arange(12, dtype=np.float32).reshape(6, 2) + 1   # the checkpoint's values (the initial ones are zeros)
BIAS = np.array([7.0, -7.0], np.float32)


@pytest.mark.parametrize("loaded_before_register", [(0, 1), (0,)])
def test_a_chiefs_register_during_a_restore_keeps_what_the_restore_loaded(
        local_cluster, loaded_before_register: tuple[int, ...]) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(2)
    restorer = emb_bias_client(handle, "/job:worker/task:1")  # a surviving worker holding the lease, restoring
    restorer.register(OPTIMIZER, chief=True)
    loads = {0: LoadShardRequest.build({"emb/part_0": EMB}, {}, {}, ["emb/part_0"], global_step=40, restored_step=40),
             1: LoadShardRequest.build({"bias/part_0": BIAS}, {}, {}, ["bias/part_0"], restored_step=40)}
    for task in (0, 1):
        restorer.call(task, BeginRestoreRequest(1))
    for task in loaded_before_register:
        restorer.call(task, loads[task])

    chief = emb_bias_client(handle, "/job:worker/task:0")  # the restarted chief joins meanwhile
    request = RegisterRequest(tuple(chief.layout.values()), OPTIMIZER, chief.sync, chief.client_name, True, True,
                              chief.incarnation)  # the chief's join (psflow.train.chief)
    joined = register_tasks(chief.channels, chief.step_task, request, chief.config, 60.0, call=chief.call_async)

    for task in (0, 1):
        if task not in loaded_before_register:
            restorer.call(task, loads[task])
    for task in (1, 0):
        restorer.call(task, SetReadyRequest("/job:worker/task:1", 1, 40))
    assert all(chief.ps_stats(t).ready for t in (0, 1))
    values = chief.pull({"emb": None, "bias": None})
    assert np.array_equal(values["emb"], EMB) and np.array_equal(values["bias"], BIAS), values
    assert joined.created == frozenset() and joined.kept == frozenset()  # neither created there nor found ready
    assert [chief.ps_stats(t).init_count for t in (0, 1)] == [1, 1]


def test_a_deposed_restorers_late_set_ready_leaves_the_newer_restore_in_progress(
        local_cluster) -> None:  # type: ignore[no-untyped-def]
    """Restorer A (stopped until its lease lapsed) sends SetReady after restorer B began: it opened every task at
    A's older generation while B was loading, so workers resumed there and B's load then rewound them under them."""
    handle = local_cluster(2)
    a = emb_bias_client(handle, "/job:worker/task:1")
    a.register(OPTIMIZER, chief=True)
    b = emb_bias_client(handle, "/job:worker/task:2")
    for task in (0, 1):
        a.call(task, BeginRestoreRequest(10))
    for task in (0, 1):
        b.call(task, BeginRestoreRequest(20))
    for task in (1, 0):
        # the restore fence (ABORTED), as a late LoadShard's: the restorer tells it from any other refusal
        with pytest.raises(FencedOffError, match=rf"^/job:ps/task:{task}: SetReady: SetReady of generation 10 "
                                                 rf"from /job:worker/task:1 refused: /job:ps/task:{task} is "
                                                 r"at generation 20 \(another restore began here since"):
            a.call(task, SetReadyRequest("/job:worker/task:1", 10, 40))
    assert [(b.ps_stats(t).ready, b.ps_stats(t).generation) for t in (0, 1)] == [(False, 20), (False, 20)]
    b.call(0, LoadShardRequest.build({"emb/part_0": EMB}, {}, {}, ["emb/part_0"], global_step=40, restored_step=40))
    b.call(1, LoadShardRequest.build({"bias/part_0": BIAS}, {}, {}, ["bias/part_0"], restored_step=40))
    for task in (1, 0):
        b.call(task, SetReadyRequest("/job:worker/task:2", 20, 40))
    assert [(b.ps_stats(t).ready, b.ps_stats(t).generation) for t in (0, 1)] == [(True, 20), (True, 20)]
    values = b.pull({"emb": None, "bias": None})
    assert np.array_equal(values["emb"], EMB) and np.array_equal(values["bias"], BIAS), values


def test_a_restarted_chiefs_set_ready_with_no_generation_leaves_a_restore_in_progress(
        local_cluster) -> None:  # type: ignore[no-untyped-def]
    """A restarted chief that took its cluster for a fresh one (a resumed run: restore at generation 0) sends SetReady
    with no generation. Sent while a surviving worker holding the lease restores (BeginRestore, LoadShard), it opened
    every task in the middle of that restore: workers resumed over half-loaded shards, at the restorer's generation."""
    handle = local_cluster(2)
    restorer = emb_bias_client(handle, "/job:worker/task:1")
    restorer.register(OPTIMIZER, chief=True)
    for task in (0, 1):
        restorer.call(task, BeginRestoreRequest(3))
    restorer.call(0, LoadShardRequest.build({"emb/part_0": EMB}, {}, {}, ["emb/part_0"], global_step=40,
                                            restored_step=40))
    chief = emb_bias_client(handle, "/job:worker/task:0")
    for task in (1, 0):
        with pytest.raises(FailedPreconditionError, match=rf"^/job:ps/task:{task}: SetReady: SetReady from "
                                                          rf"/job:worker/task:0 refused: /job:ps/task:{task} is "
                                                          r"being restored at generation 3") as refused:
            chief.call(task, SetReadyRequest(chief.client_name))
        assert not isinstance(refused.value, FencedOffError)  # no fencing token: a conflict with the task's state
    assert [(chief.ps_stats(t).ready, chief.ps_stats(t).generation) for t in (0, 1)] == [(False, 3), (False, 3)]
    restorer.call(1, LoadShardRequest.build({"bias/part_0": BIAS}, {}, {}, ["bias/part_0"], restored_step=40))
    for task in (1, 0):
        restorer.call(task, SetReadyRequest("/job:worker/task:1", 3, 40))
    assert [(chief.ps_stats(t).ready, chief.ps_stats(t).generation) for t in (0, 1)] == [(True, 3), (True, 3)]
    values = chief.pull({"emb": None, "bias": None})
    assert np.array_equal(values["emb"], EMB) and np.array_equal(values["bias"], BIAS), values
