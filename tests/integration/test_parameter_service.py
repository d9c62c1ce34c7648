"""Real ps processes over real gRPC: step accounting, routing, refusals, start order."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.gradients import DenseGradient, SparseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.rpc.api import (
    ConnectConfig,
    FailedPreconditionError,
    InvalidArgumentError,
    TaskUnavailableError,
    UnauthenticatedError,
)
from psflow.rpc.grpc_client import TaskChannel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HERE = Path(__file__).resolve().parent
SGD = OptimizerSpec("sgd", {"learning_rate": 1.0})


def _model(cluster: ClusterSpec, rows: int = 100) -> VariableSet:
    variables = VariableSet(replica_device_setter(cluster=cluster))
    variables.get_variable("emb", (rows, 4), partitioner=fixed_size_partitioner(3))
    variables.get_variable("bias", (1,))
    return variables


@pytest.fixture(params=["grpc", "tcp"])
def transport_cluster(local_cluster, request):  # type: ignore[no-untyped-def]
    """``local_cluster`` whose test clients use the given transport (every test runs over both)."""

    def make(*args, **kwargs):  # type: ignore[no-untyped-def]
        handle = local_cluster(*args, **kwargs)
        handle.transport = request.param
        return handle

    return make


def _client(handle, name: str = "/job:worker/task:0", rows: int = 100, token: str | None = "default") -> ParameterClient:  # type: ignore[no-untyped-def]
    tok = handle.token if token == "default" else token
    client = ParameterClient(handle.cluster, _model(handle.cluster, rows).placements(), client_name=name,
                             config=ConnectConfig(connect_timeout=30, rpc_timeout=10, token=tok,
                                                  transport=getattr(handle, "transport", "grpc")))
    client.connect()
    return client


def test_each_step_value_goes_to_exactly_one_push(transport_cluster) -> None:  # type: ignore[no-untyped-def]
    handle = transport_cluster(2)
    (handle.workdir / "cluster.json").write_text(handle.cluster.to_json())
    workers, pushes = 4, 150
    env = {"PSFLOW_TOKEN": handle.token, "PATH": "/usr/bin:/bin"}
    procs = [
        subprocess.Popen([sys.executable, str(HERE / "pusher.py"), str(handle.workdir / "cluster.json"), str(i), str(pushes)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        for i in range(workers)
    ]
    try:
        outs = [p.communicate(timeout=90) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_out, err) in zip(procs, outs, strict=False):
        assert p.returncode == 0, err.decode()
    steps = [s for out, _ in outs for s in json.loads(out)]
    assert sorted(steps) == list(range(1, workers * pushes + 1))
    client = _client(handle)
    assert client.global_step() == workers * pushes
    # Every bias update was applied: bias = -lr * pushes * 1.0.
    assert client.pull({"bias": None})["bias"][0] == pytest.approx(-0.01 * workers * pushes, rel=1e-4)  # lr 0.01 in pusher.py
    # The layout was initialized once per ps task, by the chief (worker 0); the others waited for it.
    assert [client.stats(i)["init_count"] for i in (0, 1)] == [1, 1]


def test_pull_and_push_route_rows_to_their_partitions(transport_cluster) -> None:  # type: ignore[no-untyped-def]
    handle = transport_cluster(2)
    client = _client(handle)
    client.register(SGD, chief=True)
    # emb has 3 partitions of 34, 33, 33 rows, round-robin over ps 0, 1, 0; bias on ps 1.
    parts = {p.index: (p.task, p.row_start, p.row_stop) for p in client.layout["emb"].partitions}
    assert parts == {0: (0, 0, 34), 1: (1, 34, 67), 2: (0, 67, 100)}
    before = [client.stats(i)["pulls"] for i in (0, 1)]
    ids = np.array([40, 35, 66], dtype=np.int64)  # all in partition 1 on ps 1
    client.pull({"emb": ids})
    after = [client.stats(i)["pulls"] for i in (0, 1)]
    assert after[0] == before[0] and after[1] == before[1] + 1
    rows = np.array([99, 0, 50], dtype=np.int64)
    grad = np.arange(12, dtype=np.float32).reshape(3, 4)
    client.push({"emb": SparseGradient(rows, grad)})
    pulled = client.pull({"emb": np.array([0, 50, 99, 1], dtype=np.int64)})["emb"]
    np.testing.assert_array_equal(pulled, -np.stack([grad[1], grad[2], grad[0], np.zeros(4, np.float32)]))
    whole = client.pull({"emb": None})["emb"]
    assert whole.shape == (100, 4)
    np.testing.assert_array_equal(whole[[0, 50, 99]], -grad[[1, 2, 0]])


def test_bad_requests_refused_and_state_intact(transport_cluster) -> None:  # type: ignore[no-untyped-def]
    handle = transport_cluster(2)
    client = _client(handle)
    client.register(SGD, chief=True)
    client.push({"emb": SparseGradient(np.array([1, 2]), np.ones((2, 4), np.float32))})
    snapshot = client.pull({"emb": None, "bias": None})
    ch = client.channels[0]
    cases = [
        ({"grads": [["emb/part_0", "sparse"]]}, {"g/emb/part_0": np.ones((1, 4), np.float64), "i/emb/part_0": np.array([0])},
         "variable 'emb' partition 0"),
        ({"grads": [["emb/part_0", "sparse"]]}, {"g/emb/part_0": np.ones((2, 4), np.float32), "i/emb/part_0": np.array([0])},
         "must have shape \\(1, 4\\)"),
        ({"grads": [["emb/part_0", "dense"]]}, {"g/emb/part_0": np.ones((4, 34), np.float32)}, "has shape \\(34, 4\\)"),
        ({"grads": [["nope/part_0", "dense"]]}, {"g/nope/part_0": np.ones(1, np.float32)}, "unknown variable partition 'nope/part_0'"),
        ({"grads": [["emb/part_0", "sparse"]]}, {"g/emb/part_0": np.ones((1, 4), np.float32), "i/emb/part_0": np.array([34])},
         "gradient row 34 out of range"),
        # a good gradient followed by a bad one: neither is applied
        ({"grads": [["emb/part_0", "sparse"], ["emb/part_2", "dense"]]},
         {"g/emb/part_0": np.ones((1, 4), np.float32), "i/emb/part_0": np.array([0]), "g/emb/part_2": np.ones(3, np.float32)},
         "variable 'emb' partition 2"),
    ]
    for meta, arrays, message in cases:
        with pytest.raises(InvalidArgumentError, match=message) as info:
            ch.call("Push", meta, arrays)
        assert "/job:ps/task:0" in str(info.value)
    with pytest.raises(InvalidArgumentError, match="row -1 out of range"):
        ch.call("Pull", {"vars": [["emb/part_0", "r"]]}, {"r": np.array([-1])})
    with pytest.raises(InvalidArgumentError, match="int64"):
        ch.call("Pull", {"vars": [["emb/part_0", "r"]]}, {"r": np.array([0.5])})
    raw = TaskChannel("/job:ps/task:0", handle.cluster.task_address("ps", 0), "psflow.ParameterService", client.config)
    with pytest.raises(grpc.RpcError) as raw_error:
        raw._method("Push")(b"garbage!", timeout=5, metadata=(("psflow-token", handle.token),))
    assert raw_error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "bad magic" in raw_error.value.details()
    if handle.transport == "tcp":  # the same garbage over the TCP carrier: refused, connection and server intact
        host, port = ch.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            token = handle.token.encode()
            sock.sendall(b"PSFT" + struct.pack("<H", len(token)) + token)
            assert sock.recv(1) == b"\x00"
            sock.sendall(struct.pack("<I", 13) + b"\x04Push" + b"garbage!")
            length = struct.unpack("<I", sock.recv(4))[0]
            reply = sock.recv(length)
            assert reply[0] == 1 and b"bad magic" in reply
    from psflow.placement import PlacementError
    with pytest.raises(PlacementError, match="emb"):
        client.pull({"emb": np.array([100])})
    after = client.pull({"emb": None, "bias": None})
    for name in snapshot:
        np.testing.assert_array_equal(after[name], snapshot[name])
    assert client.stats()["global_step"] == 1  # refused pushes took no step


def test_differing_layout_fails_fast_naming_the_variable(transport_cluster) -> None:  # type: ignore[no-untyped-def]
    handle = transport_cluster(2)
    _client(handle).register(SGD, chief=True)
    other = _client(handle, "/job:worker/task:1", rows=200)
    with pytest.raises(FailedPreconditionError, match="/job:worker/task:1 has a different model layout.*'emb'"):
        other.register(SGD)
    with pytest.raises(FailedPreconditionError, match="optimizer"):
        _client(handle, "/job:worker/task:2").register(OptimizerSpec("sgd", {"learning_rate": 0.5}))


def test_start_order_does_not_matter_and_waits_are_bounded(transport_cluster) -> None:  # type: ignore[no-untyped-def]
    handle = transport_cluster(2, start_ps=False)
    result: dict[str, object] = {}

    def connect() -> None:
        try:
            client = _client(handle)
            client.register(SGD, chief=True)
            result["step"] = client.push({"bias": DenseGradient(np.ones(1, np.float32))})
        except Exception as e:  # noqa: BLE001
            result["error"] = e

    t = threading.Thread(target=connect)
    t.start()
    time.sleep(1.0)  # the client is waiting for ps tasks that are not up yet
    handle.start("ps", 1)
    handle.start("ps", 0)
    t.join(60)
    assert result.get("step") == 1, result
    lonely = ClusterSpec({"ps": [handle.cluster.task_address("ps", 0).rsplit(":", 1)[0] + ":1"]})
    c = ParameterClient(lonely, _model(lonely).placements(), client_name="w", config=ConnectConfig(connect_timeout=1.0))
    started = time.monotonic()
    with pytest.raises(TaskUnavailableError, match=r"waiting for /job:ps/task:0 at 127.0.0.1:1"):
        c.connect()
    assert time.monotonic() - started < 10


def test_calls_without_the_cluster_token_are_refused(transport_cluster) -> None:  # type: ignore[no-untyped-def]
    handle = transport_cluster(1)
    for token in (None, "wrong"):
        with pytest.raises(UnauthenticatedError, match="cluster token"):
            _client(handle, token=token).register(SGD, chief=True)
    assert _client(handle).stats()["registered"] is False
