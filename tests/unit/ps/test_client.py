"""The ps client (psflow/ps/client.py, issue 27 item 2): a push's reader position and restore generation are
arguments of the push, not state set on the client from outside; in-process services, no sockets."""

from __future__ import annotations

import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.gradients import DenseGradient, SparseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import BeginRestoreRequest, SetReadyRequest
from psflow.ps.service import ParameterService
from psflow.rpc.api import FailedPreconditionError
from psflow.rpc.inprocess import InProcessChannel

pytestmark = pytest.mark.timeout(60)

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
W0 = "/job:worker/task:0"


def _cluster() -> tuple[ParameterClient, list[ParameterService]]:
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("emb", (6, 2))   # ps task 0
    vs.get_variable("bias", (2,))    # ps task 1
    services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    client = ParameterClient(CLUSTER, vs.placements(), client_name=W0, channels=channels)
    client.register(OptimizerSpec("sgd", {"learning_rate": 1.0}), chief=True)
    return client, services


def _grads() -> dict[str, DenseGradient | SparseGradient]:
    return {"emb": SparseGradient(np.array([1], np.int64), np.ones((1, 2), np.float32)),
            "bias": DenseGradient(np.ones(2, np.float32))}


def test_the_reader_position_travels_with_the_push_that_trained_up_to_it() -> None:
    client, services = _cluster()
    assert not hasattr(client, "reader_position") and not hasattr(client, "generation")
    client.push(_grads(), examples=4, position='{"offset": 4}')
    assert services[0].data_progress() == ({W0: '{"offset": 4}'}, 4)
    client.push(_grads(), examples=4)  # no position given: the recorded one stays, the examples count
    assert services[0].data_progress() == ({W0: '{"offset": 4}'}, 8)
    _, _ = client.push_pull(_grads(), {"emb": np.array([0], np.int64)}, examples=2, position='{"offset": 6}')
    assert services[0].data_progress() == ({W0: '{"offset": 6}'}, 10)
    assert services[1].data_progress() == ({}, 0)  # only the task holding global_step records it


def test_a_push_of_a_generation_the_cluster_was_restored_from_is_refused_before_anything_changes() -> None:
    client, services = _cluster()
    client.push(_grads(), generation=0)
    for task in (1, 0):  # a restore to generation 7 (the chief's calls, in their order)
        client.call(task, BeginRestoreRequest(7))
    for task in (1, 0):
        client.call(task, SetReadyRequest(W0, 7, 1))
    before = client.pull({"emb": None, "bias": None})
    with pytest.raises(FailedPreconditionError, match="generation 0 refused: the cluster was restored .generation 7"):
        client.push(_grads(), generation=0)
    after = client.pull({"emb": None, "bias": None})
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert client.push(_grads(), generation=7) == 2  # the worker that re-read its position goes on
