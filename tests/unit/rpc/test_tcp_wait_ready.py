"""The TCP channel's ``wait_ready`` tries again until its timeout, as the gRPC channel's does.

It connected once: a worker that connected to a ps task killed in the middle of the handshake (a chaos kill
while the run was starting) got "Connection reset by peer" and exited 1 with a traceback, where the task came
back within ``--connect-timeout``.
"""

from __future__ import annotations

import socket
import threading

import pytest

from psflow.rpc.api import ConnectConfig, TaskUnavailableError
from psflow.rpc.tcp import HANDSHAKE_MAGIC, STATUS_OK, TcpChannel

pytestmark = pytest.mark.timeout(60)


def _listener(drop_first: int) -> tuple[socket.socket, list[int]]:
    """A listener that closes its first ``drop_first`` connections unanswered, then answers handshakes OK."""
    server = socket.create_server(("127.0.0.1", 0))
    accepts: list[int] = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepts.append(1)
            if len(accepts) <= drop_first:
                conn.close()  # the task died mid-handshake
                continue
            data = b""
            while len(data) < len(HANDSHAKE_MAGIC) + 2:
                chunk = conn.recv(64)
                if not chunk:
                    break
                data += chunk
            conn.sendall(bytes([STATUS_OK]))  # kept open: the channel owns the connection now

    threading.Thread(target=serve, daemon=True).start()
    return server, accepts


def test_wait_ready_tries_again_after_a_connection_closed_in_the_handshake() -> None:
    server, accepts = _listener(drop_first=2)
    channel = TcpChannel("/job:ps/task:0", "127.0.0.1", server.getsockname()[1],
                         ConnectConfig(connect_timeout=30, backoff_initial=0.01, backoff_max=0.05))
    try:
        channel.wait_ready()  # raised TaskUnavailableError at the first closed connection before
        assert len(accepts) == 3
    finally:
        channel.close()
        server.close()


def test_wait_ready_gives_up_at_its_timeout_naming_the_task() -> None:
    refusing = socket.socket()  # bound, not listening: every attempt is refused
    refusing.bind(("127.0.0.1", 0))
    channel = TcpChannel("/job:ps/task:3", "127.0.0.1", refusing.getsockname()[1],
                         ConnectConfig(connect_timeout=30, backoff_initial=0.01, backoff_max=0.05))
    try:
        with pytest.raises(TaskUnavailableError, match="/job:ps/task:3"):
            channel.wait_ready(timeout=0.5)
    finally:
        channel.close()
        refusing.close()
