"""`psflow train`'s launcher survives a port taken between its choice and the task's bind.

The launcher's port choice is wrapped in-process (psflow.launch.processes.free_ports): its first choice, or
every choice, includes a port this test holds with a listening socket, as another process would. Real task
processes, a9a.
"""

from __future__ import annotations

import io
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import A9A, A9A_T

from psflow.launch import processes
from psflow.launch.local import run_local
from psflow.launch.ports import free_ports
from psflow.launch.processes import LaunchError
from psflow.status.server import StatusConfig
from psflow.train.config import TrainConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port another process might have taken: bound and listening (no SO_REUSEPORT) until the test ends."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", free_ports(1)[0]))
        s.listen()
        yield int(s.getsockname()[1])
    finally:
        s.close()


def _config() -> TrainConfig:
    return TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124, num_ps=1, num_workers=2,
                            max_steps=20, batch_size=64, connect_timeout=120.0)


def _take(monkeypatch: pytest.MonkeyPatch, port: int, *, position: int, times: int) -> list[list[int]]:
    """The launcher's first ``times`` choices put ``port`` at ``position``; returns every choice made."""
    chosen: list[list[int]] = []

    def choose(count: int, host: str = "127.0.0.1") -> list[int]:
        ports = [p for p in free_ports(count, host) if p != port]
        while len(ports) < count:
            ports += [p for p in free_ports(1, host) if p != port and p not in ports]
        if len(chosen) < times:
            ports[position] = port
        chosen.append(ports)
        return ports

    monkeypatch.setattr(processes, "free_ports", choose)
    return chosen


# Only ports whose tasks every push waits for: ps task 0 and the chief (worker 0) bind before the first push can
# happen. A taken port of worker 1 may be found after the chief's first push (a loaded machine starts worker 1
# late): then training started, and the run fails as it should (see psflow.launch.port_retry).
@pytest.mark.parametrize("position, name", [(0, "/job:ps/task:0"), (1, "/job:worker/task:0")])
def test_a_taken_port_starts_the_cluster_again_on_new_ports(tmp_path: Path, held_port: int,
                                                            monkeypatch: pytest.MonkeyPatch, position: int,
                                                            name: str) -> None:
    chosen = _take(monkeypatch, held_port, position=position, times=1)
    console = io.StringIO()
    metrics = run_local(_config(), str(tmp_path / "run"), progress=console, status=StatusConfig(enabled=False))
    assert metrics["global_step"] >= 20, metrics
    lines = [line for line in console.getvalue().splitlines() if "was taken by another process" in line]
    assert lines == [f"port {held_port} of {name} was taken by another process; "
                     "starting the cluster again on new ports"], console.getvalue()
    assert len(chosen) == 2, chosen
    cluster = json.loads((tmp_path / "run" / "cluster.json").read_text())
    assert f"127.0.0.1:{held_port}" not in [a for addrs in cluster.values() for a in addrs], cluster


def test_a_port_taken_at_every_start_fails_the_run_after_three_starts(tmp_path: Path, held_port: int,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = _take(monkeypatch, held_port, position=0, times=10)
    console = io.StringIO()
    with pytest.raises(LaunchError, match=f"port {held_port} is already in use"):
        run_local(_config(), str(tmp_path / "run"), progress=console, status=StatusConfig(enabled=False))
    assert len(chosen) == 3, chosen
    assert console.getvalue().count("was taken by another process") == 2, console.getvalue()
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert status["run"]["phase"] == "failed", status["run"]  # the last start failed as any run does
