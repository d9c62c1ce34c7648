"""Sends the ``psflow train`` launcher a SIGTERM between two starts of its cluster (for
tests/integration/test_signal_between_starts.py; on a process's path only where a test puts this directory on
PYTHONPATH, with ``PSFLOW_TEST_SIGNAL_BETWEEN_STARTS=1``).

The launcher's first choice of ports puts ps task 0 on a port this process holds (bound and listening, as another
process would), so its task fails to bind it before training and the cluster is started again on new ports
(:mod:`psflow.launch.port_retry`); as the launcher says so (``PortTaken.retry_line``: the first start's cluster
left, the next one not started yet) it sends itself SIGTERM, by pid: a real signal, handled as any other. The task
processes (which also read this file) are left as they are.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from typing import Any

if os.environ.get("PSFLOW_TEST_SIGNAL_BETWEEN_STARTS") == "1" and "psflow.launch.task" not in " ".join(sys.argv) \
        and "train" in sys.argv:
    from psflow.launch import port_retry, processes
    from psflow.launch.ports import free_ports

    _HELD = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    _HELD.bind(("127.0.0.1", 0))
    _HELD.listen()
    _PORT = int(_HELD.getsockname()[1])
    _chosen: list[bool] = []

    def _choose(count: int, host: str = "127.0.0.1") -> list[int]:
        ports = [p for p in free_ports(count, host) if p != _PORT]
        while len(ports) < count:
            ports += [p for p in free_ports(1, host) if p != _PORT and p not in ports]
        if not _chosen:  # the first start: ps task 0's port is taken
            _chosen.append(True)
            ports[0] = _PORT
        return ports

    processes.free_ports = _choose  # type: ignore[attr-defined]
    _retry_line = port_retry.PortTaken.retry_line

    def _signalled_retry_line(self: Any) -> str:
        line = _retry_line(self)
        os.kill(os.getpid(), signal.SIGTERM)
        return line

    port_retry.PortTaken.retry_line = _signalled_retry_line  # type: ignore[method-assign]
