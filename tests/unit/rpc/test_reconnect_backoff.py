"""A channel's reconnects are bounded by ConnectConfig.backoff_max, not gRPC's default (growing to 120 s).

A task that was down, or not yet listening, when its channel first tried is connected within
``backoff_max`` of coming up: the chaos thread and the launcher's last ledger read once waited out
gRPC's backoff instead (a fault fired ~2,000 steps late; a run's FAILED lines went missing).
"""

from __future__ import annotations

import socket
import threading

import pytest

from psflow.rpc.api import ConnectConfig, Reply, ServeConfig, TaskUnavailableError
from psflow.rpc.framing import Frame
from psflow.rpc.grpc_client import TaskChannel
from psflow.rpc.registry import serve


def test_reconnect_attempts_follow_backoff_max() -> None:
    # A TCP listener that accepts and closes at once: every gRPC connection attempt is one accept, and
    # fails (no HTTP/2), so the channel keeps reconnecting with its backoff.
    server = socket.create_server(("127.0.0.1", 0))
    accepts: list[int] = []

    def accept_and_close() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepts.append(1)
            conn.close()

    threading.Thread(target=accept_and_close, daemon=True).start()
    channel = TaskChannel("/job:ps/task:0", f"127.0.0.1:{server.getsockname()[1]}", "psflow.Test",
                          ConnectConfig(backoff_initial=0.05, backoff_max=0.2))
    try:
        with pytest.raises(TaskUnavailableError):
            channel.wait_ready(timeout=4.0)
    finally:
        channel.close()
        server.close()
    # ~20 attempts at 0.1-0.2 s apart; gRPC's default backoff (1 s, x1.6, ...) makes 3 in 4 s.
    assert len(accepts) >= 6, len(accepts)


def test_reconnect_tries_at_once_while_another_channel_to_the_task_backs_off() -> None:
    """reconnect() gets a connection of its own: gRPC shared one (and its backoff) between channels to one
    address with the same options, so the launcher's chaos thread, beside its health and status channels to
    ps task 0, was refused by a serving task for up to backoff_max and fired its fault hundreds of steps late."""
    task = "/job:ps/task:0"
    refusing = socket.socket()  # bound, not listening: every connection attempt is refused
    refusing.bind(("127.0.0.1", 0))
    port = refusing.getsockname()[1]
    config = ConnectConfig(connect_timeout=10.0, rpc_timeout=10.0, backoff_initial=30.0, backoff_max=30.0)
    other = TaskChannel(task, f"127.0.0.1:{port}", "psflow.Test", config)   # e.g. the health monitor's
    poller = TaskChannel(task, f"127.0.0.1:{port}", "psflow.Test", config)  # the chaos thread's
    server = None
    try:
        for channel in (other, poller):
            with pytest.raises(TaskUnavailableError):
                channel.call("Stats")
        refusing.close()
        server = serve("grpc", ServeConfig(task, f"127.0.0.1:{port}", {"psflow.Test": {"Stats": _stats}}, token=None))
        server.start()
        poller.reconnect()
        assert poller.call("Stats").meta == {"global_step": 7}  # not refused from the other channel's backoff
    finally:
        other.close()
        poller.close()
        refusing.close()
        if server is not None:
            server.stop(0)


def _stats(frame: Frame) -> Reply:
    return {"global_step": 7}, {}
