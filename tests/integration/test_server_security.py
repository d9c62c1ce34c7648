"""Authentication on by default, and checkpoint shards confined to the checkpoint root (issue 17, item 4).

Real ``psflow server`` processes on 127.0.0.1; each is killed by pid at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import REPO, TOKEN

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.rpc.api import (
    PARAMETER_SERVICE,
    WORKER_SERVICE,
    ConnectConfig,
    InvalidArgumentError,
    UnauthenticatedError,
)
from psflow.rpc.grpc_client import TaskChannel
from psflow.rpc.tcp import TcpChannel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

_SAFETY = 60.0


def _env(token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PSFLOW_TOKEN", "TF_CONFIG")}
    env["PYTHONUNBUFFERED"] = "1"
    if token is not None:
        env["PSFLOW_TOKEN"] = token
    return env


def _server_cmd(cluster: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "psflow", "server", "--cluster", str(cluster), "--job", "ps", "--task", "0", *flags]


@pytest.fixture
def start_ps(tmp_path: Path) -> Iterator[Callable[..., tuple[str, Path]]]:
    """Factory ``start_ps(*flags, token=TOKEN)`` -> (address, log path) of a ready ps task."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*flags: str, token: str | None = TOKEN) -> tuple[str, Path]:
        address = f"127.0.0.1:{free_ports(1)[0]}"
        cluster = tmp_path / f"cluster-{len(procs)}.json"
        cluster.write_text(ClusterSpec({"ps": [address]}).to_json())
        log = tmp_path / f"ps-{len(procs)}.log"
        with open(log, "wb") as out:
            procs.append(subprocess.Popen(_server_cmd(cluster, *flags), stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=str(REPO), env=_env(token)))
        ch = _channel(address, token)
        try:
            ch.wait_ready()
        finally:
            ch.close()
        return address, log

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _channel(address: str, token: str | None, service: str = PARAMETER_SERVICE) -> TaskChannel:
    return TaskChannel("/job:ps/task:0", address, service,
                       ConnectConfig(token=token, connect_timeout=_SAFETY, rpc_timeout=_SAFETY))


def test_server_without_a_token_refuses_to_start(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(ClusterSpec({"ps": [f"127.0.0.1:{free_ports(1)[0]}"]}).to_json())
    r = subprocess.run(_server_cmd(cluster), capture_output=True, text=True, env=_env(None), cwd=str(REPO),
                       stdin=subprocess.DEVNULL, timeout=_SAFETY)
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "PSFLOW_TOKEN" in lines[0] and "--insecure" in lines[0], lines[0]


def test_insecure_server_starts_and_says_so(start_ps: Callable[..., tuple[str, Path]]) -> None:
    address, log = start_ps("--insecure", token=None)
    warning = [line for line in log.read_text().splitlines() if "WARNING" in line and "authentication is OFF" in line]
    assert len(warning) == 1, log.read_text()
    worker_service, ps_service = _channel(address, None, WORKER_SERVICE), _channel(address, None)
    try:
        assert worker_service.call("Ping").meta["authentication"] == "off"
        assert ps_service.call("Stats").meta["authentication"] == "off"
        # With no checkpoint root, no shard file is written at all.
        with pytest.raises(InvalidArgumentError, match="no checkpoint root.*--checkpoint-root"):
            ps_service.call("SaveShard", {"path": str(log.parent / "shard.safetensors")})
        assert not (log.parent / "shard.safetensors").exists()
    finally:
        worker_service.close()
        ps_service.close()


def test_an_anonymous_shutdown_of_a_token_protected_server_is_refused(
        start_ps: Callable[..., tuple[str, Path]]) -> None:
    address, _ = start_ps()
    anonymous = [_channel(address, None, WORKER_SERVICE), _channel(address, None), _channel(address, "wrong")]
    owner = _channel(address, TOKEN, WORKER_SERVICE)
    try:
        for ch in anonymous:
            with pytest.raises(UnauthenticatedError):
                ch.call("Shutdown")
        port = _channel(address, TOKEN).call("Transport").meta["tcp_port"]
        tcp = TcpChannel("/job:ps/task:0", "127.0.0.1", port, ConnectConfig(connect_timeout=_SAFETY))
        with pytest.raises(UnauthenticatedError):
            tcp.call("Shutdown")
        tcp.close()
        reply = owner.call("Ping")  # still serving
        assert reply.meta["authentication"] == "token"
    finally:
        for ch in [*anonymous, owner]:
            ch.close()


def test_save_shard_writes_only_under_the_checkpoint_root(start_ps: Callable[..., tuple[str, Path]],
                                                          tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "ckpt-1").mkdir(parents=True)
    outside.mkdir()
    (root / "escape").symlink_to(outside, target_is_directory=True)
    address, _ = start_ps("--checkpoint-root", str(root))
    ch = _channel(address, TOKEN)
    try:
        for path in (outside / "shard.safetensors", root / ".." / "outside" / "shard.safetensors",
                     root / "escape" / "shard.safetensors", Path("/tmp") / "psflow-escape.safetensors"):
            with pytest.raises(InvalidArgumentError) as refused:
                ch.call("SaveShard", {"path": str(path)})
            message = str(refused.value)
            assert "/job:ps/task:0" in message and str(path) in message and "outside" in message, message
        assert list(outside.iterdir()) == []
        assert not Path("/tmp/psflow-escape.safetensors").exists()
        inside = root / "ckpt-1" / "shard.safetensors"
        assert ch.call("SaveShard", {"path": str(inside)}).meta["task"] == "/job:ps/task:0"
        assert inside.exists()
    finally:
        ch.close()
