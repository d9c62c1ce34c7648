"""The TCP carrier refuses malformed traffic cleanly and keeps serving."""

from __future__ import annotations

import socket
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import TOKEN, ClusterHandle

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.rpc.api import ConnectConfig, DeadlineExceededError, TaskUnavailableError, UnauthenticatedError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def ps(tmp_path_factory):  # type: ignore[no-untyped-def]
    """One ps task with a registered model, and a tcp client of it."""


    handle = ClusterHandle(ClusterSpec({"ps": [f"127.0.0.1:{free_ports(1)[0]}"]}), tmp_path_factory.mktemp("tcp"), TOKEN)
    handle.start("ps", 0)
    try:
        vs = VariableSet(replica_device_setter(cluster=handle.cluster))
        vs.get_variable("w", (50, 2), initializer={"name": "random_normal", "seed": 1})
        client = ParameterClient(handle.cluster, vs.placements(), client_name="test",
                                 config=ConnectConfig(token=TOKEN, transport="tcp", connect_timeout=30, rpc_timeout=10))
        client.connect()
        client.register(OptimizerSpec("sgd", {"learning_rate": 0.1}), chief=True)
        yield handle, client
        client.close()
    finally:
        handle.stop_all()


def test_pulled_rows_are_the_callers_own(ps) -> None:  # type: ignore[no-untyped-def]
    """A pull's rows come back writable (the reply's buffer, uncopied since it is the call's alone): a later reply
    of the same size on the same connection leaves them as they were, and changing them changes nothing on the
    ps task."""
    _, client = ps
    ids = np.array([3, 1, 4], np.int64)
    first = client.pull({"w": ids})["w"]
    kept = first.copy()
    other = client.pull({"w": np.array([0, 2, 5], np.int64)})["w"]
    assert first.flags.writeable and first.tolist() == kept.tolist() and other.tolist() != kept.tolist()
    first[:] = 0.0
    assert client.pull({"w": ids})["w"].tolist() == kept.tolist()


def _connect(address: str, token: bytes) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(b"PSFT" + struct.pack("<H", len(token)) + token)
    return sock


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.binary(max_size=64), st.binary(max_size=200), st.integers(0, 2**32 - 1))
def test_garbage_is_refused_and_state_is_unchanged(ps, method: bytes, body: bytes, declared: int) -> None:  # type: ignore[no-untyped-def]
    handle, client = ps
    before = client.pull({"w": None})["w"]
    address = client.channels[0].address
    with _connect(address, handle.token.encode()) as sock:
        assert sock.recv(1) == b"\x00"
        # A well-framed request with arbitrary method and body...
        payload = bytes([len(method[:255])]) + method[:255] + body
        sock.sendall(struct.pack("<I", len(payload)) + payload)
        length = struct.unpack("<I", sock.recv(4))[0]
        reply = b""
        while len(reply) < length:
            reply += sock.recv(length - len(reply))
        assert reply[0] in (1, 2, 7), reply[:200]  # INVALID_ARGUMENT / FAILED_PRECONDITION / ABORTED, never INTERNAL
        # ...then a bogus length prefix: the server may close this connection, nothing more.
        sock.sendall(struct.pack("<I", declared)[:4])
    np.testing.assert_array_equal(client.pull({"w": None})["w"], before)


def test_wrong_token_is_refused(ps) -> None:  # type: ignore[no-untyped-def]
    handle, client = ps
    with _connect(client.channels[0].address, b"not-the-token") as sock:
        assert sock.recv(1) == b"\x03"
        assert sock.recv(1) == b""  # closed
    bad = ParameterClient(handle.cluster, client.layout.values(), client_name="intruder",  # type: ignore[arg-type]
                          config=ConnectConfig(token="wrong", transport="tcp", connect_timeout=5))
    with pytest.raises(UnauthenticatedError):
        bad.connect()


def test_a_restarted_ps_is_found_on_its_new_tcp_port(local_cluster) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(1)
    vs = VariableSet(replica_device_setter(cluster=handle.cluster))
    vs.get_variable("w", (10, 1))
    client = ParameterClient(handle.cluster, vs.placements(), client_name="test",
                             config=ConnectConfig(token=handle.token, transport="tcp", connect_timeout=30, rpc_timeout=10))
    client.connect()
    client.register(OptimizerSpec("sgd", {"learning_rate": 0.1}), chief=True)
    old = client.channels[0].address
    handle.kill("ps", 0)
    handle.start("ps", 0)  # same gRPC address, a new (empty) ps with a new carrier port
    deadline = time.monotonic() + 30
    while True:
        try:
            stats = client.stats()
            break
        except (TaskUnavailableError, DeadlineExceededError):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert stats["registered"] is False and client.channels[0].address != old
    client.close()


def test_a_call_behind_an_uncollected_one_fails_at_its_deadline_not_never(ps) -> None:  # type: ignore[no-untyped-def]
    """The carrier holds a connection from a call to its result(): a second call waits for it at
    most its own deadline, then fails (a caller that forgot to collect a call cannot hang others)."""
    _, client = ps
    channel = client.channels[0]
    first = channel.call_async("Stats")  # sent, not collected yet
    second = channel.call_async("Stats", timeout=0.3)  # a hang here is caught by the test's timeout
    with pytest.raises(DeadlineExceededError, match="busy with an earlier call for 0.3 s"):
        second.result()
    assert first.result().meta["task"] == "/job:ps/task:0"  # the first one is still answered
    assert channel.call("Stats").meta["task"] == "/job:ps/task:0"  # and the connection is free again
