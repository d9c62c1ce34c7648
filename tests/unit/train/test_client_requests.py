"""The client's short path for whole tables gives the same requests, values and errors as routing."""

from __future__ import annotations

import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.gradients import SparseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import PlacementError, VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import PullRequest
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})


def _client() -> ParameterClient:
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    init = {"name": "random_normal", "seed": 7}
    vs.get_variable("whole", (40, 3), initializer=init)                                     # the short path
    vs.get_variable("split", (40, 3), partitioner=fixed_size_partitioner(2), initializer=init)  # routed
    services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    client = ParameterClient(CLUSTER, vs.placements(), client_name="/job:worker/task:0", channels=channels)
    client.register(OptimizerSpec("adagrad", {"learning_rate": 0.5}), chief=True)
    return client


def test_whole_and_split_tables_read_and_update_the_same_rows() -> None:
    client = _client()
    ids = np.array([0, 3, 17, 39], np.int64)
    before = client.pull({"whole": ids, "split": ids})
    assert before["whole"].tobytes() == before["split"].tobytes()
    # int32 ids and a list take the general path: the same rows
    again = client.pull({"whole": ids.astype(np.int32)})
    assert again["whole"].tobytes() == before["whole"].tobytes()
    grad = np.arange(12, dtype=np.float32).reshape(4, 3)
    client.push({"whole": SparseGradient(ids, grad), "split": SparseGradient(ids, grad)})
    after = client.pull({"whole": ids, "split": ids})
    assert after["whole"].tobytes() == after["split"].tobytes()
    assert not np.array_equal(after["whole"], before["whole"])
    for empty in (np.zeros(0, np.int64), np.zeros(0, np.int32)):  # either path: an empty answer, nothing asked
        got = client.pull({"whole": empty, "split": empty})
        assert got["whole"].shape == got["split"].shape == (0, 3) and got["whole"].dtype == np.float32


@pytest.mark.parametrize("bad", [40, -1])
def test_an_id_out_of_range_is_named_on_either_path(bad: int) -> None:
    client = _client()
    ids = np.array([1, bad], np.int64)
    with pytest.raises(PlacementError, match=f"variable 'whole': id {bad} at position 1 is out of range"):
        client.pull({"whole": ids})
    with pytest.raises(PlacementError, match=f"variable 'whole': id {bad} at position 1 is out of range"):
        client.push({"whole": SparseGradient(ids, np.ones((2, 3), np.float32))})


def test_the_ids_sent_are_read_only_views() -> None:
    client = _client()
    ids = np.array([2, 5], np.int64)
    plan = client._pull_plan({"whole": ids})
    (parts,) = plan.per_task.values()
    (sent,) = PullRequest(parts).to_frame().arrays.values()  # what travels: the caller's ids, not a copy
    assert np.shares_memory(sent, ids) and not sent.flags.writeable and ids.flags.writeable
