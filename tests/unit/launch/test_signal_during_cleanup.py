"""A signal that reaches the launcher while ``LocalCluster.__exit__`` stops the tasks (its cleanup: deferred, no
signal cuts it) is raised once every task is stopped, as one a moment earlier would have been: never dropped.

The cleanup defers signals with ``check=False`` (it must not raise in the middle of an exception in flight), so a
signal that came there was recorded and never raised nor said: after a task's taken port (``PortTaken``) the launcher
started the cluster again on new ports and trained on, the user's Ctrl-C or SIGTERM gone without a word; after a
finished run's end it exited 0 saying nothing of it. Real processes: the task, stopped by ``stop_all``'s SIGTERM,
sends the launcher (this process, by pid) the signal as it goes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from psflow.launch.lifeline import LaunchInterrupted
from psflow.launch.port_retry import PortTaken
from psflow.launch.processes import LaunchError, LocalCluster, TaskProcess
from psflow.launch.run_end import RunEnd

pytestmark = pytest.mark.timeout(60)

PS_STATS = [{"task": "/job:ps/task:0", "global_step": 42, "pushes_applied": 42}]

# The task: on SIGTERM (stop_all's), sends the launcher SIGNAL, then exits.
TASK = textwrap.dedent("""
    import os, signal, sys, time
    launcher, sig = int(sys.argv[1]), int(sys.argv[2])
    def stopped(signum, frame):
        os.kill(launcher, sig)
        os._exit(0)
    signal.signal(signal.SIGTERM, stopped)
    print("ready", flush=True)
    time.sleep(50)
""")


@contextlib.contextmanager
def cluster_signalling_on_stop(tmp_path: Path, sig: int) -> Iterator[LocalCluster]:
    """A task-less cluster (its files under ``tmp_path``) with one running task process that sends this process
    ``sig`` when it is stopped; the process is killed on leaving, where still running."""
    cluster = LocalCluster.create(1, 1, str(tmp_path))
    log = open(tmp_path / "worker-0.log", "w")
    popen = subprocess.Popen([sys.executable, "-c", TASK, str(os.getpid()), str(int(sig))], process_group=0,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert popen.stdout is not None and popen.stdout.readline() == "ready\n"  # its handler is in place
        cluster.tasks.append(TaskProcess("worker", 0, popen, str(tmp_path / "worker-0.log"), log))
        yield cluster
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.wait(timeout=10)
        if popen.stdout is not None:
            popen.stdout.close()
        log.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_a_taken_port_s_cluster_stops_ends_the_launch(tmp_path: Path, sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    with cluster_signalling_on_stop(tmp_path, sig) as lc:
        end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
        lc.on_interrupt = end.interrupted
        with pytest.raises(LaunchInterrupted) as raised:
            with lc:
                raise PortTaken("port 1 of /job:ps/task:0 was taken", task="/job:ps/task:0", port=1)
        assert lc.tasks[0].popen.poll() is not None
    e = raised.value
    assert (e.signum, e.exit_code) == (sig, 128 + sig), "not PortTaken: the run is not started again"
    assert isinstance(e.__cause__, PortTaken)
    assert e.report.startswith(f"interrupted by {signal.Signals(sig).name} with no global_step read "
                               "(no ps task had answered one)"), e.report
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert (written["phase"], written["exit_code"]) == ("interrupted", 128 + sig)
    assert signal.getsignal(sig) == before


def test_a_signal_while_a_finished_run_s_tasks_stop_is_said_and_keeps_its_end(tmp_path: Path) -> None:
    with cluster_signalling_on_stop(tmp_path, signal.SIGTERM) as lc:
        end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
        lc.on_interrupt = end.interrupted
        with pytest.raises(LaunchInterrupted) as raised:
            with lc:
                final = end.finished(ps_stats=PS_STATS, train_seconds=1.5, evaluation=None, extra={}, client=None)
    e = raised.value
    assert e.exit_code == 0 and e.ended is final, "its end stands: exit status 0"
    assert e.report.splitlines()[0] == (
        "SIGTERM arrived after the run had finished at global_step 42: its end stands; every task stopped"), e.report
    assert json.loads((tmp_path / "metrics.json").read_text())["phase"] == "finished"


def test_a_signal_while_a_failed_run_s_tasks_stop_keeps_its_failure(tmp_path: Path) -> None:
    with cluster_signalling_on_stop(tmp_path, signal.SIGHUP) as lc:
        end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
        lc.on_interrupt = end.interrupted
        with pytest.raises(LaunchInterrupted) as raised:
            with lc:
                end.failed("/job:worker/task:0 (pid 7) exited with code 1: root cause")
                raise LaunchError("/job:worker/task:0 (pid 7) exited with code 1: root cause")
    e = raised.value
    assert e.exit_code == 1 and isinstance(e.__cause__, LaunchError), "the failure's status"
    lines = e.report.splitlines()
    assert lines[0].startswith("SIGHUP arrived after the run had failed with no global_step read (no ps task had answered one)"), e.report
    assert "  /job:worker/task:0 (pid 7) exited with code 1: root cause" in lines, e.report  # its error, said once
    assert json.loads((tmp_path / "metrics.json").read_text())["phase"] == "failed"


def test_a_signal_while_the_tasks_of_a_run_failed_before_its_end_stop_keeps_the_failure(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A failure no end was taken for (raised in _run_cluster before its watch: a task not started, the model refused
    # after the tasks started): its error and exit status 1 stand, as before 3334f34; the signal is said, not dropped.
    before = signal.getsignal(signal.SIGTERM)
    with cluster_signalling_on_stop(tmp_path, signal.SIGTERM) as lc:
        end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
        lc.on_interrupt = end.interrupted
        with pytest.raises(LaunchError) as raised:
            with lc:
                raise LaunchError("could not start /job:worker/task:1: [Errno 24] Too many open files")
        assert lc.tasks[0].popen.poll() is not None
    assert not isinstance(raised.value, PortTaken) and str(raised.value).startswith("could not start /job:worker/")
    assert not (tmp_path / "metrics.json").exists(), "no end of it: none written, as without the signal"
    assert "SIGTERM arrived while the tasks of a failed run were stopped: its failure stands" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGTERM) == before
