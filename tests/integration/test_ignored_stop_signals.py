"""A stop signal a task inherits ignored stays ignored: ``nohup psflow server ...`` survives the hangup.

``nohup`` (as ``setsid nohup``, a background job of a non-interactive shell for SIGINT, ...) starts a command
with SIGHUP ignored (``SIG_IGN``), which ``exec`` keeps; psflow's StopRequest and the launcher's handlers replaced
it, so the hangup at logout stopped the ps tasks, which hold the only copy of the model since the last checkpoint.
Real ``psflow server`` ps tasks, ``psflow train`` runs (a cluster of processes, ``--in-process``), started by a
wrapper that sets the dispositions and execs them (:func:`support.with_stop_signals`); every process this module
starts is killed by pid at the end if it still runs. Waits are safety nets, never assertions on speed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import A9A, REPO, wait_until, with_stop_signals

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.rpc.api import PARAMETER_SERVICE, ConnectConfig
from psflow.rpc.grpc_client import TaskChannel

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

LIMIT = 120.0  # safety net, seconds

NOTICE = "SIGHUP is ignored (inherited): stop with SIGTERM or SIGINT"

Start = Callable[..., subprocess.Popen[bytes]]


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    """Starts ``python -m psflow ARGS`` with ``ignored`` stop signals ignored, its output in ``tmp_path/NAME.log``."""
    started: list[subprocess.Popen[bytes]] = []

    def run(name: str, *args: str, ignored: tuple[int, ...] = ()) -> subprocess.Popen[bytes]:
        with open(tmp_path / f"{name}.log", "wb") as out:
            proc = subprocess.Popen(with_stop_signals([sys.executable, "-m", "psflow", *args], ignored=ignored),
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO),
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
        started.append(proc)
        return proc

    try:
        yield run
    finally:
        for proc in started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # (its own session: the run's tasks too)
            proc.wait(timeout=30)


def _exit_code(proc: subprocess.Popen[bytes], log: Path) -> int:
    try:
        return proc.wait(timeout=LIMIT)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"still running {LIMIT:.0f} s on:\n{log.read_text(errors='replace')[-3000:]}") from None


def _serving_ps_task(start: Start, tmp_path: Path, *, ignored: tuple[int, ...]) -> tuple[
        subprocess.Popen[bytes], str, Path]:
    address = f"127.0.0.1:{free_ports(1)[0]}"
    cluster = tmp_path / "cluster.json"
    cluster.write_text(ClusterSpec({"ps": [address], "worker": ["127.0.0.1:1"]}).to_json())
    proc = start("ps-0", "server", "--cluster", str(cluster), "--job", "ps", "--task", "0", "--insecure",
                 ignored=ignored)
    log = tmp_path / "ps-0.log"
    wait_until(lambda: "serving at" in log.read_text(errors="replace") or proc.poll() is not None,
               "the ps task serving", limit=LIMIT)
    assert proc.poll() is None, log.read_text(errors="replace")
    return proc, address, log


def test_a_ps_task_started_with_sighup_ignored_keeps_serving_through_a_hangup(start: Start, tmp_path: Path) -> None:
    """Its StopRequest put a handler in place of the inherited SIG_IGN: SIGHUP stopped it (129)."""
    proc, address, log = _serving_ps_task(start, tmp_path, ignored=(signal.SIGHUP,))
    assert f"/job:ps/task:0: {NOTICE}" in log.read_text(errors="replace")
    os.kill(proc.pid, signal.SIGHUP)  # an ignored signal is discarded as it is sent: nothing left to handle
    channel = TaskChannel("/job:ps/task:0", address, PARAMETER_SERVICE,
                          ConnectConfig(token=None, connect_timeout=LIMIT, rpc_timeout=30))
    try:
        stats = channel.call("Stats").meta  # a real call, answered after the hangup
    finally:
        channel.close()
    assert stats["task"] == "/job:ps/task:0", stats
    assert proc.poll() is None, log.read_text(errors="replace")
    os.kill(proc.pid, signal.SIGTERM)
    assert _exit_code(proc, log) == 143, log.read_text(errors="replace")[-3000:]
    text = log.read_text(errors="replace")
    assert "stopping (SIGTERM)" in text and "SIGHUP)" not in text, text[-3000:]


def test_a_ps_task_not_ignoring_sighup_stops_on_it_with_129(start: Start, tmp_path: Path) -> None:
    proc, _, log = _serving_ps_task(start, tmp_path, ignored=())
    assert "ignored" not in log.read_text(errors="replace")
    os.kill(proc.pid, signal.SIGHUP)
    assert _exit_code(proc, log) == 129, log.read_text(errors="replace")[-3000:]
    assert "stopping (SIGHUP)" in log.read_text(errors="replace")


def test_an_in_process_run_started_with_sighup_ignored_goes_on_through_a_hangup(start: Start, tmp_path: Path) -> None:
    """``nohup psflow train --in-process ... &``: its LauncherSignals replaced the SIG_IGN, and SIGHUP ended the run
    (129). It trains on; SIGTERM ends it (143, interrupted by SIGTERM), and it said at start which signals stop it."""
    out = tmp_path / "run"
    proc = start("run", "train", "--train", str(A9A), "--num-features", "124", "--in-process", "--batch-size", "32",
                 "--epochs", "500", "--log-every", "50", "--no-status", "--output", str(out), ignored=(signal.SIGHUP,))
    log, worker_log = tmp_path / "run.log", out / "logs" / "worker-0.log"
    wait_until(lambda: proc.poll() is not None or (worker_log.exists() and "step=" in worker_log.read_text()),
               "the run training", limit=LIMIT)  # (its signal handlers are in place before the first step)
    assert proc.poll() is None, log.read_text(errors="replace")
    os.kill(proc.pid, signal.SIGHUP)  # discarded as it is sent, when ignored
    os.kill(proc.pid, signal.SIGTERM)
    assert _exit_code(proc, log) == 143, log.read_text(errors="replace")[-3000:]
    assert f"psflow: {NOTICE}" in log.read_text(errors="replace")
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["phase"], metrics["interrupted"], metrics["exit_code"]) == ("interrupted", "SIGTERM", 143), metrics


def test_a_ps_task_whose_shell_ended_stops_on_sigterm_without_naming_a_launcher(tmp_path: Path) -> None:
    """``ssh host 'nohup psflow server ... &'``: the shell that started the task ends (here once the task serves) and
    the task, started by hand (no lifeline), lives on reparented. Its SIGTERM line said 'the launcher (pid N) is
    gone', naming the shell as a launcher that never was."""
    address = f"127.0.0.1:{free_ports(1)[0]}"
    cluster = tmp_path / "cluster.json"
    cluster.write_text(ClusterSpec({"ps": [address], "worker": ["127.0.0.1:1"]}).to_json())
    log = tmp_path / "ps-0.log"
    command = with_stop_signals([sys.executable, "-m", "psflow", "server", "--cluster", str(cluster), "--job", "ps",
                                 "--task", "0", "--insecure"], ignored=(signal.SIGHUP,))
    # The session's shell: starts the task, then lives until its input ends (the logout), after the task serves.
    shell = subprocess.Popen(["sh", "-c", '"$@" > "$0" 2>&1 < /dev/null & echo $!; read _ || true', str(log), *command],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(REPO),
                             env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert shell.stdout is not None and shell.stdin is not None
    pid = int(shell.stdout.readline())  # the task's (the wrapper execs it)
    try:
        wait_until(lambda: "serving at" in (log.read_text(errors="replace") if log.exists() else "") or not _alive(pid),
                   "the ps task serving", limit=LIMIT)  # (the shell opens the log: it may not exist yet)
        shell.stdin.close()
        assert shell.wait(timeout=LIMIT) == 0  # the shell is gone; the task lives on
        assert _alive(pid), log.read_text(errors="replace")
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not _alive(pid), "the ps task gone", limit=LIMIT)
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
    text = log.read_text(errors="replace")
    assert "stopping (SIGTERM); exiting with status 143" in text and "the launcher (pid" not in text, text[-3000:]


def _alive(pid: int) -> bool:
    """Not a child of this process (it cannot be waited for): alive while /proc shows it, not as a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"
