"""A run's end is written once: a signal that reaches the launcher after its end was written (a finished run's
metrics.json, or a failed run's) stops the tasks still running, but neither rewrites that end nor tells the user
a second, different one (psflow.launch.run_end).

The window is real: ``_run_cluster`` returns from ``RunEnd.finished`` (metrics.json written) and closes the
progress bar before it defers signals; a failed run's ``RunEnd.failed`` is followed by closing the client and the
status page. A SIGTERM there raises ``LaunchInterrupted``, and ``LocalCluster.__exit__`` calls
``RunEnd.interrupted``. These tests call the methods in that order, on a real (task-less) cluster, with one real
task process running that the late signal must still stop.
"""

from __future__ import annotations

import io
import json
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from one_worker_cluster import one_worker_cluster

from psflow.launch.processes import LocalCluster
from psflow.launch.run_end import RunEnd

PS_STATS = [{"task": "/job:ps/task:0", "global_step": 42, "pushes_applied": 42}]


@pytest.fixture
def lc(tmp_path: Path) -> Iterator[LocalCluster]:
    with one_worker_cluster(tmp_path) as cluster:
        yield cluster


def metrics(tmp_path: Path) -> dict[str, object]:
    with open(tmp_path / "metrics.json") as f:
        loaded: dict[str, object] = json.load(f)
    return loaded


def test_a_signal_after_a_finished_run_s_end_keeps_it_finished(lc: LocalCluster, tmp_path: Path) -> None:
    out = io.StringIO()
    end = RunEnd(lc, str(tmp_path), started=0.0, out=out)
    final = end.finished(ps_stats=PS_STATS, train_seconds=1.5, evaluation=None, extra={}, client=None)
    assert metrics(tmp_path)["phase"] == "finished"

    report = end.interrupted(signal.SIGTERM)

    written = metrics(tmp_path)
    assert written["phase"] == "finished" and "interrupted" not in written and "exit_code" not in written
    assert written == json.loads(json.dumps(final)) and end.snapshot is final
    assert lc.tasks[0].popen.poll() is not None, "the late signal still stops every task"
    assert "interrupted by SIGTERM at global_step" not in report, report
    assert report.splitlines()[0] == (
        "SIGTERM arrived after the run had finished at global_step 42: its end stands; every task stopped"), report


def test_a_signal_after_a_failed_run_s_end_keeps_its_failure(lc: LocalCluster, tmp_path: Path) -> None:
    end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
    end.failed("/job:worker/task:0 (pid 7) exited with code 1: root cause")
    first = metrics(tmp_path)
    assert (first["phase"], first["exit_code"]) == ("failed", 1)

    report = end.interrupted(signal.SIGINT)

    assert metrics(tmp_path) == first, "the failure's end stands: phase, error and exit code"
    assert lc.tasks[0].popen.poll() is not None
    lines = report.splitlines()
    assert lines[0].startswith("SIGINT arrived after the run had failed with no global_step read (no ps task had answered one)"), report
    # LaunchInterrupted replaced the failure's exception: its report is the only place the user reads the error
    assert "  /job:worker/task:0 (pid 7) exited with code 1: root cause" in lines, report


def test_an_interrupted_run_is_written_once_and_reported_once(lc: LocalCluster, tmp_path: Path) -> None:
    end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
    report = end.interrupted(signal.SIGTERM)
    first = metrics(tmp_path)
    assert (first["phase"], first["interrupted"], first["exit_code"]) == ("interrupted", "SIGTERM", 143)
    assert report.startswith("interrupted by SIGTERM with no global_step read (no ps task had answered one)")

    end.failed("the tasks stopped by the interruption, seen as a failure")
    again = end.interrupted(signal.SIGHUP)

    assert metrics(tmp_path) == first
    assert again.startswith("SIGHUP arrived after the run had been interrupted with no global_step read "
                            "(no ps task had answered one)"), again


@pytest.mark.parametrize("phase", ["finished", "failed"])
def test_an_in_process_run_s_end_written_before_the_signal_is_the_one_reported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase: str) -> None:
    """``psflow train --in-process``: the run wrote its end (InProcessEnding) and the signal came after (a finished
    run's, between writing it and restoring the signal handlers; a failed run's, while it was written): the user
    read 'interrupted by SIGTERM' beside a metrics.json that says otherwise."""
    from psflow.cli import train as cli_train
    from psflow.cluster import ClusterSpec
    from psflow.launch import in_process
    from psflow.launch.lifeline import LaunchInterrupted
    from psflow.status.final_snapshot import final_snapshot
    from psflow.train.config import TrainConfig

    extra = {"error": "ValueError: boom", "exit_code": 1} if phase == "failed" else {}
    final = final_snapshot(phase=phase, ps_stats=PS_STATS, wall_seconds=1.0, extra=extra)

    def ends_then_signalled(config: object, output: str, *, on_end: Callable[..., None], **_: object) -> None:
        on_end(final, ClusterSpec({"ps": ["127.0.0.1:1"]}))
        raise LaunchInterrupted(signal.SIGTERM)

    monkeypatch.setattr(in_process, "run_in_process", ends_then_signalled)
    with pytest.raises(LaunchInterrupted) as raised:
        cli_train._in_process(TrainConfig(), str(tmp_path), None)  # type: ignore[arg-type]
    assert metrics(tmp_path)["phase"] == phase
    report = str(raised.value)
    assert report.startswith(f"SIGTERM arrived after the run had {phase} at global_step 42: its end stands"), report
    assert ("  ValueError: boom" in report.splitlines()) == (phase == "failed"), report
    assert raised.value.exit_code == {"finished": 0, "failed": 1}[phase]  # the end's own status, not 143


def _signalled_while_writing(monkeypatch: pytest.MonkeyPatch, module: object) -> None:
    """``module.write_run_files`` gets SIGTERM (this process's own handler) as it starts writing the run's end."""
    write = module.write_run_files  # type: ignore[attr-defined]

    def signalled(*args: object, **kwargs: object) -> object:
        signal.raise_signal(signal.SIGTERM)
        return write(*args, **kwargs)

    monkeypatch.setattr(module, "write_run_files", signalled)


def test_a_signal_while_a_finished_run_s_end_is_written_does_not_cut_it(
        lc: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """RunEnd.finished marks its end written (snapshot) before it writes the files: a signal arriving while it writes
    them (the launcher defers none there) cut the writing, and RunEnd.interrupted, seeing the snapshot, wrote nothing
    and said 'its end stands': no metrics.json at all (or the status page's files missing), the user told it stood."""
    from psflow.launch import run_end
    from psflow.launch.lifeline import LaunchInterrupted

    _signalled_while_writing(monkeypatch, run_end)
    end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
    lc.on_interrupt = end.interrupted
    with pytest.raises(LaunchInterrupted) as raised, lc:  # installs the launcher's handlers, as _run_cluster's
        end.finished(ps_stats=PS_STATS, train_seconds=1.5, evaluation=None, extra={}, client=None)

    written = metrics(tmp_path)
    assert written["phase"] == "finished" and written["global_step"] == 42, written
    report = str(raised.value)
    assert report.startswith("SIGTERM arrived after the run had finished at global_step 42: its end stands"), report
    # The finished run's own exit status, not 128 + signum: a script reading it believed the run failed.
    assert raised.value.ended is not None and raised.value.exit_code == 0


def test_a_signal_while_a_failed_run_s_end_is_written_leaves_its_failure_s_exit_status(
        lc: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed run's end (RunEnd.failed, after its tasks stopped) with a SIGTERM as it is written: raised once written,
    it replaced the failure's LaunchError and the launcher exited 143 for a run whose metrics.json says failed, exit
    code 1. The exit status is the failure's, and its error is in the report."""
    from psflow.launch import run_end
    from psflow.launch.lifeline import LaunchInterrupted

    _signalled_while_writing(monkeypatch, run_end)
    end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
    lc.on_interrupt = end.interrupted
    with pytest.raises(LaunchInterrupted) as raised, lc:
        end.failed("/job:worker/task:0 (pid 7) exited with code 1: root cause")

    written = metrics(tmp_path)
    assert (written["phase"], written["exit_code"]) == ("failed", 1), written
    report = str(raised.value)
    assert report.startswith("SIGTERM arrived after the run had failed with no global_step read (no ps task had answered one)"), report
    assert "  /job:worker/task:0 (pid 7) exited with code 1: root cause" in report.splitlines(), report
    assert raised.value.exit_code == 1


def test_a_signal_while_an_in_process_run_s_end_is_written_does_not_cut_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--in-process``: InProcessEnding keeps the final snapshot before it writes the files; a signal while it writes
    them left no metrics.json, and the report (b490cf9) said the run's end stood."""
    from psflow.cli import train as cli_train
    from psflow.cluster import ClusterSpec
    from psflow.launch import in_process, run_status
    from psflow.launch.lifeline import LaunchInterrupted
    from psflow.status.final_snapshot import final_snapshot
    from psflow.train.config import TrainConfig

    final = final_snapshot(phase="finished", ps_stats=PS_STATS, wall_seconds=1.0)

    def ends(config: object, output: str, *, on_end: Callable[..., None], **_: object) -> dict[str, object]:
        on_end(final, ClusterSpec({"ps": ["127.0.0.1:1"]}))
        return final

    monkeypatch.setattr(in_process, "run_in_process", ends)
    _signalled_while_writing(monkeypatch, run_status)
    with pytest.raises(LaunchInterrupted) as raised:
        cli_train._in_process(TrainConfig(), str(tmp_path), None)  # type: ignore[arg-type]
    assert metrics(tmp_path)["phase"] == "finished"
    report = str(raised.value)
    assert report.startswith("SIGTERM arrived after the run had finished at global_step 42: its end stands"), report
    assert raised.value.exit_code == 0


def _hangs_until_cut(monkeypatch: pytest.MonkeyPatch, module: object) -> dict[str, bool]:
    """``module.write_run_files``'s first call hangs (a stuck disk whose writes Python retries after each signal
    handler, as it does on EINTR) until a signal's handler raises, or gives up after 30 s; SIGINT reaches it as it
    starts, and again once the first was recorded (the user pressing Ctrl-C twice). Later calls write."""
    import os
    import threading
    import time

    from psflow.launch.lifeline import LaunchInterrupted

    write = module.write_run_files  # type: ignore[attr-defined]
    seen = {"hung": False, "gave_up": False}

    def hangs(*args: object, **kwargs: object) -> object:
        if seen["hung"]:
            return write(*args, **kwargs)
        seen["hung"] = True
        signal.raise_signal(signal.SIGINT)  # deferred: the first one never cuts the end's writing
        threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT), daemon=True).start()
        try:
            for _ in range(600):  # short sleeps: the handler runs between them
                time.sleep(0.05)
        except LaunchInterrupted:
            raise
        seen["gave_up"] = True
        return write(*args, **kwargs)

    monkeypatch.setattr(module, "write_run_files", hangs)
    return seen


def test_a_second_signal_cuts_a_finished_run_s_end_that_hangs(
        lc: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The end's files are written with signals deferred; a write that hangs (a stuck NFS mount) kept the launcher
    from stopping at all: the second Ctrl-C was ignored as the first was. It cuts the writing (as a hanging
    checkpoint save's, in_process._uncut); the end is then the interrupted one, written whole, and said so."""
    from psflow.launch import run_end
    from psflow.launch.lifeline import LaunchInterrupted

    seen = _hangs_until_cut(monkeypatch, run_end)
    end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
    lc.on_interrupt = end.interrupted
    with pytest.raises(LaunchInterrupted) as raised, lc:  # installs the launcher's handlers, as _run_cluster's
        end.finished(ps_stats=PS_STATS, train_seconds=1.5, evaluation=None, extra={}, client=None)

    assert seen == {"hung": True, "gave_up": False}, seen
    assert metrics(tmp_path)["phase"] == "interrupted"
    report = str(raised.value)
    assert report.startswith("interrupted by SIGINT with no global_step read (no ps task had answered one)"), report
    assert raised.value.exit_code == 128 + signal.SIGINT


def test_a_second_signal_cuts_an_in_process_run_s_end_that_hangs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--in-process``: the same hang, the same second Ctrl-C; the report does not say an end stands that was not
    written."""
    from psflow.cli import train as cli_train
    from psflow.cluster import ClusterSpec
    from psflow.launch import in_process, run_status
    from psflow.launch.lifeline import LaunchInterrupted
    from psflow.status.final_snapshot import final_snapshot
    from psflow.train.config import TrainConfig

    final = final_snapshot(phase="finished", ps_stats=PS_STATS, wall_seconds=1.0)

    def ends(config: object, output: str, *, on_end: Callable[..., None], **_: object) -> dict[str, object]:
        on_end(final, ClusterSpec({"ps": ["127.0.0.1:1"]}))
        return final

    monkeypatch.setattr(in_process, "run_in_process", ends)
    seen = _hangs_until_cut(monkeypatch, run_status)
    with pytest.raises(LaunchInterrupted) as raised:
        cli_train._in_process(TrainConfig(), str(tmp_path), None)  # type: ignore[arg-type]
    assert seen == {"hung": True, "gave_up": False}, seen
    report = str(raised.value)
    assert "its end stands" not in report, report
    assert report.startswith("interrupted by SIGINT while the run's end (finished at global_step 42) was written"), \
        report
    assert raised.value.exit_code == 128 + signal.SIGINT


def test_a_double_signal_leaves_the_interrupted_end_whole(
        lc: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second signal of a double Ctrl-C reaching the launcher while the interrupted end is written is ignored (the
    cleanup the first started), not the cut of a hanging write: metrics.json, and the report, are the interrupted
    run's."""
    from psflow.launch import run_end
    from psflow.launch.lifeline import LaunchInterrupted

    _signalled_while_writing(monkeypatch, run_end)
    end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
    lc.on_interrupt = end.interrupted
    with pytest.raises(LaunchInterrupted) as raised, lc:
        signal.raise_signal(signal.SIGTERM)  # the first: ends the run

    assert metrics(tmp_path)["phase"] == "interrupted"
    report = str(raised.value)
    assert report.startswith("interrupted by SIGTERM with no global_step read (no ps task had answered one)"), report


def test_a_double_signal_leaves_an_in_process_run_s_interrupted_end_whole(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--in-process``, a real run's double SIGTERM (20 ms apart): the second reached the writing of the interrupted
    end and cut it (no metrics.prom), the report saying so."""
    from psflow.cli import train as cli_train
    from psflow.cluster import ClusterSpec
    from psflow.launch import in_process, run_status
    from psflow.launch.lifeline import LaunchInterrupted
    from psflow.status.final_snapshot import final_snapshot
    from psflow.train.config import TrainConfig

    final = final_snapshot(phase="interrupted", ps_stats=PS_STATS, wall_seconds=1.0,
                           extra={"interrupted": "SIGTERM", "exit_code": 143})

    def interrupted(config: object, output: str, *, on_end: Callable[..., None], **_: object) -> None:
        try:
            signal.raise_signal(signal.SIGTERM)  # the first: ends the run
        except LaunchInterrupted:
            on_end(final, ClusterSpec({"ps": ["127.0.0.1:1"]}))
            raise

    monkeypatch.setattr(in_process, "run_in_process", interrupted)
    _signalled_while_writing(monkeypatch, run_status)
    with pytest.raises(LaunchInterrupted) as raised:
        cli_train._in_process(TrainConfig(), str(tmp_path), None)  # type: ignore[arg-type]
    assert metrics(tmp_path)["phase"] == "interrupted"
    assert (tmp_path / "metrics.prom").exists()
    report = str(raised.value)
    assert report.startswith("interrupted by SIGTERM at global_step 42"), report


def _stuck(monkeypatch: pytest.MonkeyPatch, module: object) -> dict[str, int]:
    """``module.write_run_files`` hangs at every call (a stuck mount: every write to the run directory blocks, retried
    after each signal handler) until a signal's handler raises, or gives up after 30 s and writes. The first call gets
    SIGINT as it starts and again once the first was recorded (Ctrl-C twice); each later call gets one more."""
    import os
    import threading
    import time

    from psflow.launch.lifeline import LaunchInterrupted

    write = module.write_run_files  # type: ignore[attr-defined]
    seen = {"calls": 0, "cut": 0, "gave_up": 0}

    def hangs(*args: object, **kwargs: object) -> object:
        seen["calls"] += 1
        try:
            if seen["calls"] == 1:
                signal.raise_signal(signal.SIGINT)  # deferred: the first one never cuts the end's writing
            threading.Thread(target=os.kill, args=(os.getpid(), signal.SIGINT), daemon=True).start()
            for _ in range(600):  # short sleeps: the handler runs between them
                time.sleep(0.05)
        except LaunchInterrupted:
            seen["cut"] += 1
            raise
        seen["gave_up"] += 1
        return write(*args, **kwargs)

    monkeypatch.setattr(module, "write_run_files", hangs)
    return seen


def test_a_stuck_run_directory_does_not_keep_the_launcher_from_stopping(
        lc: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second Ctrl-C cuts a finished end's writing that hangs (a596763); the interrupted end is then written, to
    the same stuck directory: it hung too, and no signal could cut it (the cleanup the first started ignores them), so
    the launcher could only be SIGKILLed. After a cut, the next signal cuts that writing too; the report says the end
    was not written, the exit status is 128 + n, and the tasks are stopped."""
    from psflow.launch import run_end
    from psflow.launch.lifeline import LaunchInterrupted

    seen = _stuck(monkeypatch, run_end)
    end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
    lc.on_interrupt = end.interrupted
    with pytest.raises(LaunchInterrupted) as raised, lc:
        end.finished(ps_stats=PS_STATS, train_seconds=1.5, evaluation=None, extra={}, client=None)

    assert seen == {"calls": 2, "cut": 2, "gave_up": 0}, seen
    assert not (tmp_path / "metrics.json").exists()
    report = str(raised.value)
    assert report.startswith("interrupted by SIGINT with no global_step read (no ps task had answered one)"), report
    assert f"its end was not written: a signal cut the writing of {tmp_path}'s files twice" in report, report
    assert raised.value.exit_code == 128 + signal.SIGINT and raised.value.ended is None
    assert lc.tasks[0].popen.poll() is not None, "every task stopped"


def test_a_stuck_run_directory_does_not_keep_an_in_process_run_from_stopping(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--in-process``: run_in_process writes the interrupted end after the cut one (its except); it hung as well."""
    from psflow.cli import train as cli_train
    from psflow.cluster import ClusterSpec
    from psflow.launch import in_process, run_status
    from psflow.launch.lifeline import LaunchInterrupted
    from psflow.status.final_snapshot import final_snapshot
    from psflow.train.config import TrainConfig

    final = final_snapshot(phase="finished", ps_stats=PS_STATS, wall_seconds=1.0)
    stopped = final_snapshot(phase="interrupted", ps_stats=PS_STATS, wall_seconds=1.0,
                             extra={"interrupted": "SIGINT", "exit_code": 130})

    def ends(config: object, output: str, *, on_end: Callable[..., None], **_: object) -> dict[str, object]:
        cluster = ClusterSpec({"ps": ["127.0.0.1:1"]})
        try:
            on_end(final, cluster)
        except BaseException:  # as run_in_process: a failed or interrupted run ends with its snapshot too
            on_end(stopped, cluster)
            raise
        return final

    monkeypatch.setattr(in_process, "run_in_process", ends)
    seen = _stuck(monkeypatch, run_status)
    with pytest.raises(LaunchInterrupted) as raised:
        cli_train._in_process(TrainConfig(), str(tmp_path), None)  # type: ignore[arg-type]
    assert seen == {"calls": 2, "cut": 2, "gave_up": 0}, seen
    assert not (tmp_path / "metrics.json").exists()
    assert str(raised.value).startswith("interrupted by SIGINT while the run's end (finished at global_step 42) was "
                                        "written: a second signal cut the writing"), str(raised.value)
    assert raised.value.exit_code == 128 + signal.SIGINT


def _stuck_in_the_cleanup(monkeypatch: pytest.MonkeyPatch, module: object) -> dict[str, int]:
    """``module.write_run_files`` hangs at every call (a stuck mount) until a signal's handler raises, or gives up
    after 5 s and writes; while it hangs, SIGINT reaches it twice, at two of its sleeps (the user, the launcher
    stopped by the first signal and still there, pressing Ctrl-C again, and again)."""
    import time

    from psflow.launch.lifeline import LaunchInterrupted

    write = module.write_run_files  # type: ignore[attr-defined]
    seen = {"calls": 0, "cut": 0, "gave_up": 0}

    def hangs(*args: object, **kwargs: object) -> object:
        seen["calls"] += 1
        try:
            for i in range(100):  # short sleeps: the handler runs between them
                if i in (10, 20):
                    signal.raise_signal(signal.SIGINT)
                time.sleep(0.05)
        except LaunchInterrupted:
            seen["cut"] += 1
            raise
        seen["gave_up"] += 1
        return write(*args, **kwargs)

    monkeypatch.setattr(module, "write_run_files", hangs)
    return seen


def test_a_stuck_run_directory_does_not_keep_an_interrupted_launcher_from_stopping(
        lc: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """A SIGTERM mid-run; the interrupted end's writing (the cleanup it started) hangs on a stuck run directory: every
    later signal was ignored, only SIGKILL stopped the launcher. A signal there is said and ignored (a double Ctrl-C's
    second leaves the interrupted end whole); the next one cuts the writing: no end, exit 128 + the first's number."""
    from psflow.launch import run_end
    from psflow.launch.lifeline import LaunchInterrupted

    seen = _stuck_in_the_cleanup(monkeypatch, run_end)
    end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
    lc.on_interrupt = end.interrupted
    with pytest.raises(LaunchInterrupted) as raised, lc:
        signal.raise_signal(signal.SIGTERM)  # the first: ends the run

    assert seen == {"calls": 1, "cut": 1, "gave_up": 0}, seen
    assert not (tmp_path / "metrics.json").exists()
    report = str(raised.value)
    assert report.startswith("interrupted by SIGTERM with no global_step read (no ps task had answered one)"), report
    assert f"its end was not written: a signal cut the writing of {tmp_path}'s files (does its disk" in report, report
    assert raised.value.exit_code == 128 + signal.SIGTERM and raised.value.ended is None
    assert lc.tasks[0].popen.poll() is not None, "every task stopped"
    said = [line for line in capfd.readouterr().err.splitlines() if "SIGINT" in line]
    assert said == [f"psflow: SIGINT while the run's end is written to {tmp_path}: ignored; "
                    "another signal stops the launcher without it"], said


def test_a_stuck_run_directory_does_not_keep_an_interrupted_in_process_run_from_stopping(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """``--in-process``: the same SIGTERM mid-run, the interrupted end's writing stuck, Ctrl-C twice."""
    from psflow.cli import train as cli_train
    from psflow.cluster import ClusterSpec
    from psflow.launch import in_process, run_status
    from psflow.launch.lifeline import LaunchInterrupted
    from psflow.status.final_snapshot import final_snapshot
    from psflow.train.config import TrainConfig

    stopped = final_snapshot(phase="interrupted", ps_stats=PS_STATS, wall_seconds=1.0,
                             extra={"interrupted": "SIGTERM", "exit_code": 143})

    def interrupted(config: object, output: str, *, on_end: Callable[..., None], **_: object) -> None:
        try:
            signal.raise_signal(signal.SIGTERM)  # the first: ends the run
        except LaunchInterrupted:
            on_end(stopped, ClusterSpec({"ps": ["127.0.0.1:1"]}))
            raise

    monkeypatch.setattr(in_process, "run_in_process", interrupted)
    seen = _stuck_in_the_cleanup(monkeypatch, run_status)
    with pytest.raises(LaunchInterrupted) as raised:
        cli_train._in_process(TrainConfig(), str(tmp_path), None)  # type: ignore[arg-type]
    assert seen == {"calls": 1, "cut": 1, "gave_up": 0}, seen
    assert not (tmp_path / "metrics.json").exists()
    report = str(raised.value)
    assert report.startswith("interrupted by SIGTERM while the run's end (interrupted at global_step 42) was written: "
                             "a second signal cut the writing"), report
    assert raised.value.exit_code == 128 + signal.SIGTERM
    said = [line for line in capfd.readouterr().err.splitlines() if "SIGINT" in line]
    assert said == [f"psflow: SIGINT while the run's end is written to {tmp_path}: ignored; "
                    "another signal stops the launcher without it"], said
