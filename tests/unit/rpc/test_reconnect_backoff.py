"""A channel's reconnects are bounded by ConnectConfig.backoff_max, not gRPC's default (growing to 120 s).

A task that was down, or not yet listening, when its channel first tried is connected within
``backoff_max`` of coming up: the chaos thread and the launcher's last ledger read once waited out
gRPC's backoff instead (a fault fired ~2,000 steps late; a run's FAILED lines went missing).
"""

from __future__ import annotations

import socket
import threading

import pytest

from psflow.rpc.api import ConnectConfig, TaskUnavailableError
from psflow.rpc.grpc_client import TaskChannel


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
