"""The TF1-shaped example and `psflow server` (TF_CONFIG) run real clusters."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import A9A, A9A_T, REPO

from psflow.launch.ports import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "wb") as out:
        return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=str(REPO))


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_example_program_trains_with_two_ps_and_two_workers(tmp_path: Path) -> None:
    ports = free_ports(4)
    hosts = [f"--ps_hosts=127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}",
             f"--worker_hosts=127.0.0.1:{ports[2]},127.0.0.1:{ports[3]}"]
    env = dict(os.environ, PSFLOW_TOKEN="example-token")
    script = [sys.executable, str(REPO / "examples" / "between_graph.py"), *hosts]
    procs = []
    try:
        # Workers first: start order must not matter.
        procs.append(_start([*script, "--job_name=worker", "--task_index=1", f"--train={A9A}"], tmp_path / "w1.log", env))
        procs.append(_start([*script, "--job_name=worker", "--task_index=0", f"--train={A9A}", f"--eval={A9A_T}"],
                            tmp_path / "w0.log", env))
        procs.append(_start([*script, "--job_name=ps", "--task_index=0"], tmp_path / "ps0.log", env))
        procs.append(_start([*script, "--job_name=ps", "--task_index=1"], tmp_path / "ps1.log", env))
        assert procs[0].wait(timeout=150) == 0, (tmp_path / "w1.log").read_text()[-2000:]
        assert procs[1].wait(timeout=150) == 0, (tmp_path / "w0.log").read_text()[-2000:]
        # The ps tasks' join() returns once both workers reported Done: no --shutdown_ps, no kill.
        assert procs[2].wait(timeout=60) == 0, (tmp_path / "ps0.log").read_text()[-2000:]
        assert procs[3].wait(timeout=60) == 0, (tmp_path / "ps1.log").read_text()[-2000:]
    finally:
        _stop(procs)
    logs = (tmp_path / "w0.log").read_text() + (tmp_path / "w1.log").read_text()
    steps = [int(s) for s in re.findall(r"\bstep=(\d+)", logs)]
    assert len(steps) == len(set(steps)) > 0
    auc = float(re.search(r"'auc': ([0-9.]+)", logs).group(1))  # type: ignore[union-attr]
    assert auc > 0.89


def test_psflow_server_reads_tf_config(tmp_path: Path) -> None:
    ports = free_ports(3)
    cluster = {"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[2]}"]}
    base = dict(os.environ, PSFLOW_TOKEN="tf-config-token")
    train = ["--train", str(A9A), "--num-features", "124", "--log-every", "10"]
    procs = []
    try:
        for job, index, extra in [("ps", 0, []), ("worker", 0, train), ("worker", 1, train)]:
            env = dict(base, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}))
            procs.append(_start([sys.executable, "-m", "psflow", "server", *extra], tmp_path / f"{job}{index}.log", env))
        for p, name in [(procs[1], "worker0"), (procs[2], "worker1"), (procs[0], "ps0")]:
            assert p.wait(timeout=120) == 0, (tmp_path / f"{name}.log").read_text()[-2000:]
        # The ps exits 0 by itself once both workers are done (no checkpoint directory in this run).
        assert "/job:ps/task:0: run over (workers 0-1 finished, no checkpoint directory): exiting" in \
            (tmp_path / "ps0.log").read_text()
    finally:
        _stop(procs)
    logs = (tmp_path / "worker0.log").read_text() + (tmp_path / "worker1.log").read_text()
    steps = sorted(int(s) for s in re.findall(r"\bstep=(\d+)", logs))
    assert steps == list(range(10, 10 * len(steps) + 1, 10)) and len(steps) >= 5
