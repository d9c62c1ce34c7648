"""Stops the in-graph client (SIGSTOP, by itself) once its ``Leave`` was answered, before its session's end (final
checkpoint, final evaluation), so that a test can fail a ps task there and resume it (SIGCONT) when it chooses (for
tests/integration/test_in_graph_ps_lost_after_leave.py; on a process's path only where a test puts this directory
on PYTHONPATH). Only the first client process stops: it creates the file ``PSFLOW_TEST_LEFT_FILE`` names first, and
a client process that finds the file there (the restarted one) runs unchanged, as does every other process.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from psflow.ps import client

_leave = client.ParameterClient.leave
_FILE = os.environ.get("PSFLOW_TEST_LEFT_FILE")


def _leave_then_stop(self: Any) -> None:
    try:
        _leave(self)
    finally:
        if _FILE and self.client_name == "in-graph client" and not os.path.exists(_FILE):
            with open(_FILE, "w") as f:
                f.write(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGSTOP)


client.ParameterClient.leave = _leave_then_stop  # type: ignore[method-assign]
