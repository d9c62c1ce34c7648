"""Waiting for a SIGSTOP to land: ``os.kill`` returns once the signal is sent, before the process is stopped, so a
test that asks the stopped task at once may be answered first on a busy machine."""

from __future__ import annotations

import time
from pathlib import Path


def wait_stopped(pid: int, limit: float = 60.0) -> None:
    """Waits until process ``pid`` is stopped (state T in /proc/<pid>/stat); raises AssertionError after ``limit`` s."""
    deadline = time.monotonic() + limit
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "T":
        if time.monotonic() > deadline:
            raise AssertionError(f"process {pid} not stopped within {limit} s of its SIGSTOP")
        time.sleep(0.01)
