"""Real local object stores for the storage tests: moto's standalone S3 server and gcp-storage-emulator.

The ``object_store`` fixture of tests/conftest.py uses them. Each server is a
process started here, on 127.0.0.1 and a free port, once per test session,
and killed here by its pid. Each test gets a fresh bucket, and the client
settings psflow reads (through s3fs and gcsfs, see psflow/storage/) in its
environment, so the ``psflow`` processes it starts inherit them. Nothing
reaches the internet: every endpoint is 127.0.0.1, credentials are dummies,
and gcsfs is told not to probe the GCE metadata server.

A test is skipped cleanly when the server's package (the ``test`` extra:
moto[server], gcp-storage-emulator) or the client (the ``cloud`` extra:
s3fs, gcsfs) is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from psflow.launch.ports import free_ports

#: Seconds a server may take to answer its first request (a safety net; it answers within ~2 s).
START_LIMIT = 60.0


@dataclass(frozen=True)
class StoreServer:
    """A running emulator: its scheme (``s3``/``gs``), the environment its clients need, its pid."""

    scheme: str
    env: dict[str, str]
    pid: int
    log: Path

    @property
    def port(self) -> int:
        """The port it listens on, on 127.0.0.1."""
        return int(self.env["AWS_ENDPOINT_URL" if self.scheme == "s3" else "STORAGE_EMULATOR_HOST"].rsplit(":", 1)[1])


def refuses_connections(port: int) -> bool:
    """Nothing listens on 127.0.0.1:``port`` (a server killed there is gone), as a client connecting finds."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def _executable(name: str) -> str | None:
    beside = Path(sys.executable).parent / name  # the virtualenv's own script
    return str(beside) if beside.exists() else shutil.which(name)


def _wait_answering(url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + START_LIMIT
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2.0):  # noqa: S310 - 127.0.0.1, started above
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{url}: the emulator did not answer (exit {proc.poll()}):\n"
                        f"{log.read_text(errors='replace')[-2000:]}")
        time.sleep(0.1)


def _start(scheme: str, command: list[str], probe: str, env: dict[str, str],
           workdir: Path) -> Iterator[StoreServer]:
    log_path = workdir / f"{scheme}-emulator.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(workdir))
    log.close()
    try:
        _wait_answering(probe, proc, log_path)
        yield StoreServer(scheme, env, proc.pid, log_path)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def run_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreServer]:
    """moto's standalone S3 server (``moto_server``); skips without moto[server] or s3fs."""
    pytest.importorskip("s3fs")
    exe = _executable("moto_server")
    if exe is None:
        pytest.skip("moto_server is not installed (pip install 'moto[server]', the test extra)")
    workdir = tmp_path_factory.mktemp("s3")
    port = free_ports(1)[0]
    missing = str(workdir / "no-such-aws-file")
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "psflow-test",
           "AWS_SECRET_ACCESS_KEY": "psflow-test", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_CONFIG_FILE": missing, "AWS_SHARED_CREDENTIALS_FILE": missing, "AWS_EC2_METADATA_DISABLED": "true"}
    yield from _start("s3", [exe, "-H", "127.0.0.1", "-p", str(port)], f"http://127.0.0.1:{port}/", env, workdir)


def run_gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StoreServer]:
    """gcp-storage-emulator (in memory); skips without it or gcsfs."""
    exe = _executable("gcp-storage-emulator")
    if exe is None:
        pytest.skip("gcp-storage-emulator is not installed (pip install gcp-storage-emulator, the test extra)")
    env = {"STORAGE_EMULATOR_HOST": "", "NO_GCE_CHECK": "true", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
           "GOOGLE_CLOUD_PROJECT": "psflow-test"}
    workdir = tmp_path_factory.mktemp("gcs")
    port = free_ports(1)[0]
    env["STORAGE_EMULATOR_HOST"] = f"http://127.0.0.1:{port}"
    # gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT when it is imported: set before any test imports it.
    os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
    pytest.importorskip("gcsfs")
    command = [exe, "start", "-H", "127.0.0.1", "--port", str(port), "--in-memory", "-q"]
    yield from _start("gs", command, f"http://127.0.0.1:{port}/storage/v1/b", env, workdir)


def new_bucket(server: StoreServer) -> str:
    """Creates a fresh bucket on ``server`` (with its environment set); returns its URL ``scheme://name``."""
    import fsspec

    name = f"psflow-{uuid.uuid4().hex[:12]}"
    fs = fsspec.filesystem(server.scheme, use_listings_cache=False)
    fs.mkdir(name)
    return f"{server.scheme}://{name}"
