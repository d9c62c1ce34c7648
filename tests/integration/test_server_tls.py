"""``psflow server --tls-*``: a cluster of real processes on 127.0.0.1 trains over mutual TLS.

1 ps + 1 chief + 1 worker, each with its own certificate (only SAN 127.0.0.1) signed by one test
CA, ``--tls-require-client-auth``: every channel of every task (ParameterClient, the embedded
coordination backend, checkpoint streaming, the chief's status collector) must use TLS for the
run to finish. A plain-text client, a TLS client without a certificate and one whose certificate
another CA signed are all refused by the ps task. Every process is killed by pid at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from certs import HostFiles, write_host_files
from support import A9A, REPO, TOKEN

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.rpc.api import PARAMETER_SERVICE, WORKER_SERVICE, ConnectConfig, RpcError
from psflow.rpc.grpc_client import TaskChannel
from psflow.rpc.tls import TlsConfig
from psflow.status.collector import StatusCollector

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

_SAFETY = 150.0  # s: a safety net no passing run comes near; nothing here depends on the machine's speed
A9A_RECORDS = 32_561


def _tls(files: HostFiles, *, client_cert: bool = True, ca: Path | None = None) -> TlsConfig:
    return TlsConfig(root_certificates=(ca or files.ca).read_bytes(),
                     cert_chain=files.cert.read_bytes() if client_cert else None,
                     private_key=files.key.read_bytes() if client_cert else None)


def _channel(address: str, service: str, tls: TlsConfig | None, *, timeout: float = 10.0) -> TaskChannel:
    return TaskChannel("/job:ps/task:0", address, service,
                       ConnectConfig(token=TOKEN, tls=tls, connect_timeout=timeout, rpc_timeout=timeout))


def _refused(address: str, tls: TlsConfig | None) -> str:
    """The error of a Stats call that must fail (never waits for the channel: a call fails fast)."""
    ch = _channel(address, PARAMETER_SERVICE, tls)
    try:
        with pytest.raises(RpcError) as e:
            ch.call("Stats")
        return str(e.value)
    finally:
        ch.close()


def _start(procs: dict[str, subprocess.Popen[bytes]], tmp_path: Path, cluster: dict[str, list[str]], job: str,
           flags: list[str]) -> None:
    """Starts ``psflow server`` as ``/job:<job>/task:0`` (TF_CONFIG, the test token), its log in ``<job>0.log``."""
    env = {k: v for k, v in os.environ.items() if k not in ("PSFLOW_TOKEN", "TF_CONFIG")}
    env.update(PSFLOW_TOKEN=TOKEN, PYTHONUNBUFFERED="1",
               TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": 0}}))
    with open(tmp_path / f"{job}0.log", "wb") as log:
        procs[job] = subprocess.Popen([sys.executable, "-m", "psflow", "server", *flags], stdout=log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(REPO))


def _kill(procs: dict[str, subprocess.Popen[bytes]]) -> None:
    for proc in procs.values():
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def test_psflow_server_trains_over_mutual_tls(tmp_path: Path) -> None:
    names = {"ps0": "127.0.0.1", "chief0": "127.0.0.1", "worker0": "127.0.0.1"}
    files = write_host_files(tmp_path / "pki", names)
    rogue = write_host_files(tmp_path / "other-ca", {"rogue": "127.0.0.1"}, ca_name="another-ca")["rogue"]
    ports = free_ports(3)
    cluster = {"ps": [f"127.0.0.1:{ports[0]}"], "chief": [f"127.0.0.1:{ports[1]}"], "worker": [f"127.0.0.1:{ports[2]}"]}
    ps_address = cluster["ps"][0]
    ckpt = tmp_path / "ckpt"
    train = ["--train", str(A9A), "--num-features", "124", "--epochs", "1", "--log-every", "20",
             "--checkpoint-dir", str(ckpt), "--checkpoint-transport", "rpc"]
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        _start(procs, tmp_path, cluster, "ps", files["ps0"].flags())
        good = _channel(ps_address, WORKER_SERVICE, _tls(files["worker0"]), timeout=_SAFETY)
        try:
            good.wait_ready()
            assert good.call("Ping").meta["task"] == "/job:ps/task:0"
        finally:
            good.close()
        # Refused: clear text, TLS without a client certificate, a client certificate of another CA.
        _refused(ps_address, None)
        _refused(ps_address, _tls(files["worker0"], client_cert=False))
        _refused(ps_address, _tls(rogue, ca=files["worker0"].ca))
        assert procs["ps"].poll() is None, (tmp_path / "ps0.log").read_text()
        # The status collector (the chief's page) reaches a TLS task with the task's TlsConfig.
        collector = StatusCollector(ClusterSpec({"ps": [ps_address]}), token=TOKEN, timeout=10.0,
                                    tls=_tls(files["chief0"]))
        try:
            assert [t["state"] for t in collector.sample()["tasks"]] == ["up"]
        finally:
            collector.stop()
        stats = _channel(ps_address, PARAMETER_SERVICE, _tls(files["chief0"]))
        try:
            reply = stats.call("Stats").meta
        finally:
            stats.close()
        assert reply["authentication"] == "token" and reply["tcp"] is None  # no TCP carrier under TLS

        _start(procs, tmp_path, cluster, "worker", [*files["worker0"].flags(), *train])
        _start(procs, tmp_path, cluster, "chief", [*files["chief0"].flags(), *train])
        for job in ("chief", "worker", "ps"):  # the ps task exits once both trainers said Done (over TLS)
            assert procs[job].wait(timeout=_SAFETY) == 0, (tmp_path / f"{job}0.log").read_text()[-3000:]
        logs = (tmp_path / "chief0.log").read_text() + (tmp_path / "worker0.log").read_text()
        examples = [int(n) for n in re.findall(r"done after \d+ local steps \((\d+) examples\)", logs)]
        assert sum(examples) == A9A_RECORDS, logs[-3000:]
        # Both trainers exited: the final checkpoint is written (its shards streamed over TLS, written by the chief).
        assert (ckpt / "checkpoint").exists(), logs[-3000:]
        pointer = json.loads((ckpt / "checkpoint").read_text())
        assert list(ckpt.glob("ckpt-*/shard-*.safetensors")), pointer
        assert "FAILED" not in logs, logs[-3000:]
    finally:
        _kill(procs)


def test_psflow_shutdown_reaches_a_tls_cluster_with_the_tls_flags(tmp_path: Path) -> None:
    """``psflow shutdown`` takes ``TF_CONFIG`` and the TLS flags as ``psflow server`` does: in clear text
    it cannot reach the task, which keeps serving; with a certificate of the cluster's CA it stops it."""
    from support import run_bounded

    files = write_host_files(tmp_path / "pki", {"ps0": "127.0.0.1", "admin": "127.0.0.1"})
    ports = free_ports(2)
    cluster = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}  # the worker never starts
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        _start(procs, tmp_path, cluster, "ps", files["ps0"].flags())
        ready = _channel(cluster["ps"][0], WORKER_SERVICE, _tls(files["admin"]), timeout=_SAFETY)
        try:
            ready.wait_ready()
        finally:
            ready.close()
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        env.update(PSFLOW_TOKEN=TOKEN, TF_CONFIG=json.dumps({"cluster": cluster}))
        shutdown = [sys.executable, "-m", "psflow", "shutdown", "--timeout", "2"]
        plain = run_bounded(shutdown, timeout=_SAFETY, env=env)
        assert plain.returncode == 1 and plain.stdout.startswith("/job:ps/task:0 ("), plain
        assert "unreachable (" in plain.stdout and procs["ps"].poll() is None, plain.stdout
        over_tls = run_bounded([*shutdown, *files["admin"].flags()], timeout=_SAFETY, env=env)
        assert over_tls.returncode == 0 and over_tls.stdout.endswith(": stopped\n"), over_tls
        assert procs["ps"].wait(timeout=_SAFETY) == 0
    finally:
        _kill(procs)


def test_an_in_graph_run_drives_its_workers_over_mutual_tls(tmp_path: Path) -> None:
    """The in-graph client (here, in the test process) reaches the worker's StepService over TLS, and
    the StepService's own client reaches the ps task over TLS."""
    from psflow.train.config import TrainConfig
    from psflow.train.in_graph_client import run_in_graph_client

    files = write_host_files(tmp_path / "pki", {"ps0": "127.0.0.1", "worker0": "127.0.0.1", "client": "127.0.0.1"})
    ports = free_ports(2)
    cluster = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    procs: dict[str, subprocess.Popen[bytes]] = {}
    try:
        _start(procs, tmp_path, cluster, "ps", files["ps0"].flags())
        _start(procs, tmp_path, cluster, "worker", [*files["worker0"].flags(), "--train", str(A9A), "--num-features",
                                                    "124", "--replication", "in-graph", "--no-status"])
        config = TrainConfig.flat(train=(str(A9A),), num_features=124, num_ps=1, num_workers=1, replication="in-graph",
                                  max_steps=5, connect_timeout=_SAFETY)
        result = run_in_graph_client(config, ClusterSpec(cluster), token=TOKEN, tls=_tls(files["client"]))
        assert result["steps"] >= 5, result
        for job in procs:
            assert procs[job].poll() is None, (tmp_path / f"{job}0.log").read_text()[-3000:]
    finally:
        _kill(procs)
