"""The launcher's decision to start its cluster again when a task's port was taken (psflow.launch.port_retry)."""

from __future__ import annotations

import io
import json
import os
import signal
from pathlib import Path
from typing import Any, cast

import pytest

from psflow.launch.launcher_signals import LauncherSignals
from psflow.launch.lifeline import LaunchInterrupted
from psflow.launch.port_retry import PortTaken, StartupWatch, start_until_bound, taken_port
from psflow.launch.processes import LocalCluster, TaskProcess
from psflow.launch.task import expected_failure
from psflow.rpc.api import ListenError
from psflow.server import STEP_JOURNAL_FILE


def _task(error_path: Path, exit_code: int | None) -> TaskProcess:
    # taken_port reads only the exit code and the error file: no process is needed.
    return TaskProcess("ps", 0, cast(Any, None), "unused.log", cast(Any, None), exit_code=exit_code,
                       error_path=str(error_path))


def test_the_port_comes_from_the_error_file_the_task_wrote(tmp_path: Path) -> None:
    error_file = tmp_path / "error-ps-0.json"
    expected_failure("/job:ps/task:0", ListenError("/job:ps/task:0: cannot listen on 127.0.0.1:20001: port 20001 is "
                                                   "already in use", port_taken=20001),
                     error_file=str(error_file), verbose=False)
    assert json.loads(error_file.read_text())["port_taken"] == 20001
    assert taken_port(_task(error_file, 1)) == 20001
    assert taken_port(_task(error_file, None)) is None  # still running: not a failure yet
    assert taken_port(_task(error_file, 0)) is None


def test_other_start_failures_are_not_a_taken_port(tmp_path: Path) -> None:
    error_file = tmp_path / "error-ps-0.json"
    expected_failure("/job:ps/task:0", ListenError("/job:ps/task:0: cannot listen on 10.9.9.9:20001: 10.9.9.9 is not "
                                                   "an address of this machine"),
                     error_file=str(error_file), verbose=False)
    assert "port_taken" not in json.loads(error_file.read_text())
    assert taken_port(_task(error_file, 1)) is None
    assert taken_port(_task(tmp_path / "never-written.json", 1)) is None
    error_file.write_text("{not json")
    assert taken_port(_task(error_file, 1)) is None
    error_file.write_text(json.dumps({"message": "x", "port_taken": True}))
    assert taken_port(_task(error_file, 1)) is None


def test_training_started_once_a_step_journal_is_written(tmp_path: Path) -> None:
    watch = StartupWatch(str(tmp_path))
    assert not watch.training_started()  # no state directory at all yet
    (tmp_path / "state" / "ps-0").mkdir(parents=True)
    assert not watch.training_started()
    (tmp_path / "state" / "ps-0" / STEP_JOURNAL_FILE).write_text('{"bound": 1000}')
    assert watch.training_started()


def test_an_earlier_runs_journal_is_not_training_of_this_one_until_it_changes(tmp_path: Path) -> None:
    journal = tmp_path / "state" / "ps-0" / STEP_JOURNAL_FILE
    journal.parent.mkdir(parents=True)
    journal.write_text('{"bound": 1000}')
    os.utime(journal, ns=(1_000_000_000, 1_000_000_000))
    watch = StartupWatch(str(tmp_path))
    assert not watch.training_started()
    journal.write_text('{"bound": 2000}')  # a new bound: this run handed out a step value
    assert watch.training_started()


def test_the_console_line_names_the_port_and_the_task() -> None:
    e = PortTaken("whatever the task said", task="/job:ps/task:0", port=20001)
    assert e.retry_line() == ("port 20001 of /job:ps/task:0 was taken by another process; "
                              "starting the cluster again on new ports")


class _SignalledLine(io.StringIO):
    """The console: as the launcher says it starts again (between two starts), it is sent SIGTERM (this process)."""

    def write(self, text: str) -> int:
        if "starting the cluster again" in text:
            os.kill(os.getpid(), signal.SIGTERM)
        return super().write(text)


def test_a_signal_between_two_starts_is_raised_by_the_next_start_and_the_handlers_put_back(tmp_path: Path) -> None:
    """Before, leaving the first start's cluster put the caller's handlers back until the next one: the SIGTERM of
    the line between them took the caller's action (SIG_DFL: the launcher killed, no report, its locks left)."""
    caller = signal.getsignal(signal.SIGTERM)
    signals, starts = LauncherSignals(), []

    def start(retry: bool) -> None:
        with LocalCluster.create(1, 1, str(tmp_path), signals=signals) as lc:
            starts.append(retry)
            if len(starts) == 1:
                raise PortTaken("port 1 is already in use", task="/job:ps/task:0", port=1)
            lc.signals.check()  # as _run_cluster does before it starts a task

    with pytest.raises(LaunchInterrupted) as raised:
        start_until_bound(start, signals, _SignalledLine())
    assert raised.value.signum == signal.SIGTERM and raised.value.exit_code == 143
    assert starts == [True, True]  # raised by the second start (whose end reports it), not between
    assert json.loads((tmp_path / "metrics.json").read_text())["phase"] == "interrupted"
    assert signal.getsignal(signal.SIGTERM) == caller


def test_starts_that_end_otherwise_between_two_put_the_handlers_back(tmp_path: Path) -> None:
    caller = signal.getsignal(signal.SIGTERM)
    signals, starts = LauncherSignals(), []

    def start(retry: bool) -> None:
        starts.append(retry)
        if len(starts) == 1:
            with LocalCluster.create(1, 1, str(tmp_path), signals=signals):
                raise PortTaken("port 1 is already in use", task="/job:ps/task:0", port=1)
        raise OSError("cluster.json: no space left")  # the next start fails before its cluster is entered

    with pytest.raises(OSError, match="no space"):
        start_until_bound(start, signals, io.StringIO())
    assert signal.getsignal(signal.SIGTERM) == caller
    assert signals.received is None and not signals._deferred  # nothing parked left behind
