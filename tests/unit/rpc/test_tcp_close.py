"""TcpChannel.close() never blocks, even while a call holds the channel; TcpLimits checks its values.

A real TcpServer on 127.0.0.1 (in this process) and a real TcpChannel; the
handler blocks on an event, so a call is truly in flight when close() runs.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from psflow.rpc.api import ConnectConfig, Reply, RpcError, TaskUnavailableError
from psflow.rpc.framing import Frame
from psflow.rpc.tcp import TcpChannel
from psflow.rpc.tcp_server import TcpLimits, TcpServer

pytestmark = pytest.mark.timeout(60)

TOKEN = "unit-token"


@pytest.fixture
def blocking_server() -> Iterator[tuple[TcpServer, threading.Event, threading.Event]]:
    """A server whose ``Block`` handler waits (at most 30 s) until released; (server, entered, release)."""
    entered, release = threading.Event(), threading.Event()

    def block(frame: Frame) -> Reply:
        entered.set()
        release.wait(30)
        return {"ok": True}, {}

    server = TcpServer("127.0.0.1", {"Block": block, "Echo": lambda f: (dict(f.meta), {})}, task_name="/job:ps/task:0",
                       token=TOKEN)
    try:
        yield server, entered, release
    finally:
        release.set()
        server.close()


def _channel(server: TcpServer) -> TcpChannel:
    return TcpChannel("/job:ps/task:0", "127.0.0.1", server.port, ConnectConfig(token=TOKEN, rpc_timeout=30,
                                                                                 connect_timeout=30))


def test_close_while_this_thread_holds_the_channel_does_not_deadlock(blocking_server) -> None:  # type: ignore[no-untyped-def]
    """The worker's SIGTERM path: a call sent, its result not collected, close() in the same thread."""
    server, entered, _ = blocking_server
    channel = _channel(server)
    pending = channel.call_async("Block")
    assert entered.wait(30)
    channel.close()  # took the busy lock again before: a deadlock
    with pytest.raises(RpcError):
        pending.result()  # the connection was shut down under it
    with pytest.raises(TaskUnavailableError, match="closed"):
        channel.call("Echo", {"x": 1})
    with pytest.raises(TaskUnavailableError, match="closed"):
        channel.wait_ready()
    channel.close()  # idempotent


def test_close_from_another_thread_fails_the_call_in_flight(blocking_server) -> None:  # type: ignore[no-untyped-def]
    server, entered, _ = blocking_server
    channel = _channel(server)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            channel.call("Block")
        except RpcError as e:
            errors.append(e)

    caller = threading.Thread(target=call)
    caller.start()
    assert entered.wait(30)
    channel.close()
    caller.join(30)
    assert not caller.is_alive() and len(errors) == 1


def test_an_idle_channel_closes_without_waiting(blocking_server) -> None:  # type: ignore[no-untyped-def]
    server, _, _ = blocking_server
    channel = _channel(server)
    assert channel.call("Echo", {"x": 1}).meta == {"x": 1}
    channel.close()
    with pytest.raises(TaskUnavailableError, match="closed"):
        channel.call("Echo", {"x": 2})


@pytest.mark.parametrize("field, value", [("handshake_timeout", 0), ("idle_timeout", 0.5), ("idle_timeout", True),
                                          ("max_connections", 0), ("max_handshakes", 1.5)])
def test_limits_refuse_values_that_would_disable_the_server(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"TcpLimits.{field}"):
        TcpLimits(**{field: value})  # type: ignore[arg-type]
