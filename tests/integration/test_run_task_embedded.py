"""A Python program that runs a task (``run_task(stop=None)``, or ``psflow.cli.main.main`` for an evaluator) and
goes on gets its own signal handling back.

run_task made a StopRequest, installed its SIGTERM, SIGHUP and SIGINT handlers and its wakeup fd, and never put
back the caller's: after the task returned, a SIGTERM to the program went to psflow's handler (which ended the
process 2 s later, with 143) instead of the program's. A real ps task (gRPC on 127.0.0.1) in a real child process,
run twice in a row and ended each time by ``Shutdown`` (:func:`psflow.cli.shutdown.shutdown_cluster`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import A9A, A9A_T, REPO, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LIMIT = 120.0  # safety net, seconds

PROGRAM = """
import os, signal, sys, threading, time
from psflow.cli.shutdown import shutdown_cluster
from psflow.cluster import ClusterSpec
from psflow.launch.lifeline import STOP_SIGNALS
from psflow.launch.ports import free_ports
from psflow.launch.task import run_task
from psflow.rpc.api import PARAMETER_SERVICE, ConnectConfig, RpcError
from psflow.rpc.grpc_client import TaskChannel

got = []
def mine(signum, frame):
    got.append(signum)
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, mine)
signal.signal(signal.SIGHUP, signal.SIG_DFL)
read, write = os.pipe()
os.set_blocking(write, False)
signal.set_wakeup_fd(write, warn_on_full_buffer=False)
before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
address = f"127.0.0.1:{free_ports(1)[0]}"
cluster = ClusterSpec({"ps": [address], "worker": ["127.0.0.1:1"]})

def shut_down_once_serving():
    channel = TaskChannel("/job:ps/task:0", address, PARAMETER_SERVICE,
                          ConnectConfig(token=None, connect_timeout=60, rpc_timeout=30))
    deadline = time.monotonic() + 60  # safety net
    try:
        while True:
            try:
                channel.call("Stats")
                break  # it serves
            except RpcError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
    finally:
        channel.close()
    print(f"shutdown: {shutdown_cluster(cluster, token=None, timeout=30)}", flush=True)

for round in (1, 2):
    helper = threading.Thread(target=shut_down_once_serving, daemon=True)
    helper.start()
    code = run_task(cluster, "ps", 0, None, token=None)
    helper.join(60)
    assert code == 0, (round, code)
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before, round
    assert signal.set_wakeup_fd(write, warn_on_full_buffer=False) == write, round
    assert not [t.name for t in threading.enumerate() if t.name == "psflow-stop"], round
    print(f"round {round}: ps task ran, exit {code}", flush=True)
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:  # the handler runs on this thread between two bytecodes
    time.sleep(0.01)
print(f"the program's handler got {got}; its wakeup fd read {list(os.read(read, 16))}", flush=True)
"""


def test_a_program_runs_a_task_twice_and_gets_its_own_handlers_and_wakeup_fd_back() -> None:
    proc = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, cwd=str(REPO),
                          timeout=LIMIT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "round 1: ps task ran, exit 0" in out and "round 2: ps task ran, exit 0" in out, out
    assert f"the program's handler got [{int(signal.SIGTERM)}]; its wakeup fd read [{int(signal.SIGTERM)}]" in out, out


EVALUATOR = """
import signal, sys, threading
from psflow.cli.main import main
from psflow.launch.lifeline import STOP_SIGNALS

got = []
signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
code = main(["server", *sys.argv[1:]])
print(f"evaluator exit {code}", flush=True)
assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before, {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
assert not [t.name for t in threading.enumerate() if t.name == "psflow-stop"], threading.enumerate()
signal.raise_signal(signal.SIGTERM)
print(f"the program's handler got {got}", flush=True)
"""


def test_a_program_runs_an_evaluator_and_gets_its_own_handlers_back(tmp_path: Path) -> None:
    """``psflow server``'s evaluator made its StopRequest outside run_task and never closed it: a program that
    called ``main(["server", ...])`` for an evaluator kept psflow's handlers once it returned."""
    ckpt = tmp_path / "ckpt"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "1", "--quiet",
                "--max-steps", "20", "--save-checkpoints-steps", "10", "--checkpoint-dir", str(ckpt),
                "--output", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-2000:]
    cluster = {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}  # (the evaluator opens no channel to them)
    env = dict(os.environ, TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "evaluator", "index": 0}}))
    proc = subprocess.run([sys.executable, "-c", EVALUATOR, "--train", str(A9A), "--eval", str(A9A_T),
                           "--num-features", "124", "--checkpoint-dir", str(ckpt), "--no-status",
                           "--eval-poll-secs", "0.05", "--insecure"], capture_output=True, text=True, cwd=str(REPO), env=env,
                          timeout=LIMIT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "evaluator exit 0" in out, out
    assert f"the program's handler got [{int(signal.SIGTERM)}]" in out, out
