"""``psflow status URL`` reads at most 16 MiB of a reply (issue 30, item 3: a 300 MB reply took 645 MB of memory).

A server in this test process answers ``api/status`` with an endless body; the ``psflow status`` process it runs
must refuse it in one line, having read only what the limit allows.
"""

from __future__ import annotations

import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from support import REPO, run_bounded

from psflow.cli.status import MAX_REPLY_BYTES

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

CHUNK = b"[" + b"0," * (1 << 19)  # 1 MiB of a JSON array that never ends


class _Endless(BaseHTTPRequestHandler):
    sent = 0

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        try:
            for _ in range(256):  # 256 MiB at most, if nobody stops reading
                self.wfile.write(CHUNK)
                type(self).sent += len(CHUNK)
        except OSError:  # the client stopped reading and closed the connection
            pass

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_reply_larger_than_16_mib_is_refused_after_reading_16_mib(tmp_path: Path) -> None:
    server = HTTPServer(("127.0.0.1", 0), _Endless)
    serving = threading.Thread(target=server.handle_request, daemon=True)
    serving.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        env = {k: v for k, v in os.environ.items() if k != "PSFLOW_TOKEN"}
        r = run_bounded([sys.executable, "-m", "psflow", "status", url], timeout=100, cwd=REPO, env=env)
        serving.join(timeout=60)
    finally:
        server.server_close()
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stderr == (f"psflow status: error: {url}api/status: the reply is larger than 16,777,216 bytes: not a psflow "
                        "status reply (a status snapshot is a few hundred KiB)\n")
    assert not serving.is_alive()
    # It stopped reading at the limit: what the server got out is the limit plus what the sockets' buffers held.
    assert MAX_REPLY_BYTES < _Endless.sent < 4 * MAX_REPLY_BYTES, _Endless.sent
