"""An in-graph run whose ps task dies after the client left (``Leave``), before its final save: the client's restart
restores the cluster, trains the records since that checkpoint again and leaves again; the run ends 0 with every
record counted once.

Reviewing 78843f1, which moved the client's ``Leave`` from after its session's end (final checkpoint, evaluation) to
before it: ps task 0 then counts the client finished while its final save runs, and the launcher takes training as
ended. A ps task lost there must still be recovered as one lost in training: the final save fails, the client exits 1
and is restarted (``--restart-policy on-failure``), its restore forgets the finished client (``BeginRestore``) and
rewinds its reader, and its second ``Leave`` counts once. Real processes: the client stops itself (SIGSTOP) once its
``Leave`` was answered (tests/integration/client_left on the processes' PYTHONPATH); the test reads ps task 0's
``Stats`` naming it finished, kills ps task 1, waits for the launcher to restart it, and resumes the client. Every
process here is the launcher's (started by this test, in a session of its own) and ended by its pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import A9A, REPO, wait_until

from psflow.checkpoint.naming import checkpoint_name
from psflow.launch.token import TOKEN_ENV
from psflow.rpc.api import PARAMETER_SERVICE, ConnectConfig
from psflow.rpc.grpc_client import TaskChannel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

#: Records in data/a9a/a9a: one epoch trains each once.
A9A_RECORDS = 32561


def _children(pid: int) -> list[int]:
    """The child processes of ``pid``, started by any of its threads."""
    found = []
    for thread in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (thread / "children").read_text().split()]
        except OSError:
            continue
    return found


def _task_pid(launcher: int, job: str, index: int) -> int | None:
    """The launcher's child process running ``/job:<job>/task:<index>`` now (None if none)."""
    for pid in _children(launcher):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_text().split("\0")
        except OSError:
            continue
        if "--job" in argv and argv[argv.index("--job") + 1] == job and argv[argv.index("--task") + 1] == str(index):
            return pid
    return None


def _token(pid: int) -> str:
    env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
    return env[TOKEN_ENV]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def test_a_ps_task_lost_after_the_client_left_is_recovered_by_its_restart(tmp_path: Path) -> None:
    out, ckpt, left = tmp_path / "run", tmp_path / "ckpt", tmp_path / "left"
    here = Path(__file__).parent / "client_left"
    env = dict(os.environ, PSFLOW_TEST_LEFT_FILE=str(left),
               PYTHONPATH=os.pathsep.join([str(here), *filter(None, [os.environ.get("PYTHONPATH")])]))
    console = open(tmp_path / "console.txt", "w")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124", "--ps", "2",
         "--workers", "2", "--replication", "in-graph", "--batch-size", "128", "--epochs", "1",
         "--save-checkpoints-steps", "50", "--restart-policy", "on-failure", "--checkpoint-dir", str(ckpt),
         "--output", str(out), "--quiet"],
        stdout=console, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO), env=env,
        start_new_session=True)
    console.close()
    client: int | None = None
    try:
        def stopped_after_leave() -> int | None:
            assert launcher.poll() is None, (tmp_path / "console.txt").read_text()[-3000:]
            pid = int(left.read_text() or 0) if left.exists() else 0
            return pid if pid and _state(pid) == "T" else None

        client = wait_until(stopped_after_leave, "the in-graph client left and stopped itself")
        cluster = json.loads((out / "cluster.json").read_text())
        channel = TaskChannel("/job:ps/task:0", cluster["ps"][0], PARAMETER_SERVICE,
                              ConnectConfig(connect_timeout=5.0, rpc_timeout=5.0, token=_token(client)))
        try:
            stats = dict(channel.call("Stats").meta)
        finally:
            channel.close()
        assert stats["finished"] == ["in-graph client"], stats  # its Leave counted: the launcher's training ended
        step = stats["global_step"]
        assert isinstance(step, int) and not (ckpt / checkpoint_name(step)).exists(), (step, sorted(os.listdir(ckpt)))
        ps1 = _task_pid(launcher.pid, "ps", 1)
        assert ps1 is not None
        os.kill(ps1, signal.SIGKILL)
        wait_until(lambda: _task_pid(launcher.pid, "ps", 1) not in (None, ps1), "ps task 1 restarted by the launcher")
        os.kill(client, signal.SIGCONT)
        client = None
        rc = launcher.wait(timeout=300)
    finally:
        if client is not None:
            os.kill(client, signal.SIGCONT)
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    text = (tmp_path / "console.txt").read_text()
    assert rc == 0, text[-3000:]
    log = (out / "logs" / "client-0.log").read_text()
    assert f"the final checkpoint (global_step {step}) could not be written" in log, log[-3000:]
    assert "/job:client/task:0 (pid " in text and "exited with code 1: restart 1 of 3" in text, text[-3000:]
    assert "restored checkpoint" in log and "onto every ps task" in log, log[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "finished" and metrics["examples"] == A9A_RECORDS, metrics
    restarted = metrics["client"][-1]  # the restarted client trained the records since its checkpoint again
    assert restarted["restored"] and 0 < restarted["examples"] < A9A_RECORDS, metrics["client"]
    assert metrics["global_step"] > step, (metrics["global_step"], step)
