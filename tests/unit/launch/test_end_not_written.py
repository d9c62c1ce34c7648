"""A run's end whose metrics.json cannot be written (a full disk, a read-only or vanished run directory) is not
written: the run failed (exit status 1, one line naming the file and the OSError), cluster and ``--in-process``
alike, and a signal after it never says that its end stands (psflow.launch.run_end, launcher_signals).

Before, RunEnd._write kept the snapshot as the run's end whatever its files' fate: a later SIGTERM reported 'its end
stands' beside no metrics.json, exited 143, the OSError nowhere in the report; and ``--in-process`` set the end as
written regardless (InProcessEnding never raised): the run exited 0 with no metrics.json. The disk is made full by a
writer that raises OSError(ENOSPC) for metrics.json (tests run as root: a chmod would not refuse the write).
"""

from __future__ import annotations

import errno
import io
import signal
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from one_worker_cluster import one_worker_cluster

from psflow.launch.lifeline import LaunchInterrupted
from psflow.launch.processes import LocalCluster
from psflow.launch.run_end import RunEnd

PS_STATS = [{"task": "/job:ps/task:0", "global_step": 42, "pushes_applied": 42}]
FULL = "No space left on device"


@pytest.fixture
def lc(tmp_path: Path) -> Iterator[LocalCluster]:
    with one_worker_cluster(tmp_path) as cluster:
        yield cluster


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every write of a metrics.json fails as on a full disk; the other files are written."""
    from psflow import storage

    write = storage.write_atomically

    def refusing(path: str, *args: object, **kwargs: object) -> None:
        if path.endswith("metrics.json"):
            raise OSError(errno.ENOSPC, FULL, path)
        write(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(storage, "write_atomically", refusing)


def _later_signal(lc: LocalCluster, signum: int) -> LaunchInterrupted:
    """The LaunchInterrupted a signal after the end raises (the launcher's handler's, as check() raises it)."""
    lc.signals.received = signum
    with pytest.raises(LaunchInterrupted) as raised:
        lc.signals.check()
    return raised.value


@pytest.mark.usefixtures("full_disk")
def test_a_finished_end_not_written_fails_and_a_later_signal_does_not_say_it_stands(
        lc: LocalCluster, tmp_path: Path) -> None:
    out = io.StringIO()
    end = RunEnd(lc, str(tmp_path), started=0.0, out=out)
    with pytest.raises(OSError) as raised:
        end.finished(ps_stats=PS_STATS, train_seconds=1.5, evaluation=None, extra={}, client=None)
    assert f"could not write {tmp_path}/metrics.json" in str(raised.value) and FULL in str(raised.value)
    assert getattr(raised.value, "final", {}).get("global_step") == 42  # training's result, for the summary
    assert out.getvalue() == "", "the error's one line is main's (raised), not a second one here"
    assert not (tmp_path / "metrics.json").exists()
    assert lc.signals.ended is None, "an end not written is no end a signal leaves standing"

    report = end.interrupted(signal.SIGTERM)
    assert "its end stands" not in report, report
    assert report.splitlines()[0] == ("SIGTERM arrived after the run had finished at global_step 42: its end was "
                                      "not written whole; every task stopped"), report
    assert any(f"could not write {tmp_path}/metrics.json" in line and FULL in line
               for line in report.splitlines()), report
    assert lc.tasks[0].popen.poll() is not None, "the late signal still stops every task"
    assert not (tmp_path / "metrics.json").exists()
    assert _later_signal(lc, signal.SIGTERM).exit_code == 1, "the run failed: 1, not 143"


@pytest.mark.usefixtures("full_disk")
def test_a_failed_end_not_written_keeps_exit_status_1_and_names_the_error(lc: LocalCluster, tmp_path: Path) -> None:
    out = io.StringIO()
    end = RunEnd(lc, str(tmp_path), started=0.0, out=out)
    end.failed("/job:worker/task:0 (pid 7) exited with code 1: root cause")
    assert FULL in out.getvalue() and "metrics.json" in out.getvalue(), out.getvalue()
    assert lc.signals.ended is None

    report = end.interrupted(signal.SIGINT)
    assert "its end stands" not in report and FULL in report, report
    assert "  /job:worker/task:0 (pid 7) exited with code 1: root cause" in report.splitlines(), report
    assert _later_signal(lc, signal.SIGINT).exit_code == 1


@pytest.mark.usefixtures("full_disk")
def test_an_interrupted_end_not_written_names_the_error_not_the_file(lc: LocalCluster, tmp_path: Path) -> None:
    end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
    report = end.interrupted(signal.SIGTERM)
    assert report.startswith("interrupted by SIGTERM with no global_step read (no ps task had answered one)"), report
    assert f"metrics: {tmp_path}/metrics.json" not in report and FULL in report, report
    assert _later_signal(lc, signal.SIGTERM).exit_code == 128 + signal.SIGTERM  # the user's stop, as before


def _in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, phase: str, *, signalled: bool) -> None:
    """cli.train's --in-process end (its on_end and InProcessEnding) of a ``phase`` run; ``signalled``: a SIGTERM
    as it is written."""
    from psflow.cli import train as cli_train
    from psflow.cluster import ClusterSpec
    from psflow.launch import in_process
    from psflow.status.final_snapshot import final_snapshot
    from psflow.train.config import TrainConfig

    extra = {"error": "ValueError: boom", "exit_code": 1} if phase == "failed" else {}
    final = final_snapshot(phase=phase, ps_stats=PS_STATS, wall_seconds=1.0, extra=extra)

    def ends(config: object, output: str, *, on_end: Callable[..., None], **_: object) -> dict[str, object]:
        on_end(final, ClusterSpec({"ps": ["127.0.0.1:1"]}))
        return final

    monkeypatch.setattr(in_process, "run_in_process", ends)
    if signalled:  # SIGTERM (this process's own handler, _in_process's) as the end is written: raised once it is
        from psflow.launch import run_status

        write = run_status.write_run_files

        def written_signalled(*args: object, **kwargs: object) -> object:
            signal.raise_signal(signal.SIGTERM)
            return write(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(run_status, "write_run_files", written_signalled)
    cli_train._in_process(TrainConfig(), str(tmp_path), None)  # type: ignore[arg-type]


@pytest.mark.usefixtures("full_disk")
def test_an_in_process_finished_end_not_written_raises(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(OSError) as raised:
        _in_process(tmp_path, monkeypatch, "finished", signalled=False)
    assert f"could not write {tmp_path}/metrics.json" in str(raised.value) and FULL in str(raised.value)
    assert "metrics.json" not in capsys.readouterr().err, "one line: main's"
    assert not (tmp_path / "metrics.json").exists()


@pytest.mark.usefixtures("full_disk")
@pytest.mark.parametrize("phase", ["finished", "failed"])
def test_an_in_process_end_not_written_then_a_signal_exits_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             phase: str) -> None:
    with pytest.raises(LaunchInterrupted) as raised:
        _in_process(tmp_path, monkeypatch, phase, signalled=True)
    report = str(raised.value)
    assert report.startswith(f"SIGTERM arrived after the run had {phase} at global_step 42: its end was not written "
                             "whole"), report
    assert FULL in report and "its end stands" not in report, report
    assert raised.value.ended is None and raised.value.exit_code == 1


# ---- metrics.json written, a side file (status.json, metrics.prom) not: the end stands (metrics.json IS the end) ----
PROM_REFUSED = "could not write {dir}/metrics.prom: [Errno 28] No space left on device"


def _prom_refused(monkeypatch: pytest.MonkeyPatch, module: object, *, signalled: bool = False) -> None:
    """``module``'s write_run_files writes metrics.json as usual, then reports metrics.prom not written (a full disk
    after the first file: the live page's and scrape files are not the run's end); ``signalled``: a SIGTERM first."""
    from psflow.launch import run_status

    write = run_status.write_run_files

    def refusing(final: object, output_dir: str, collector: object) -> dict[str, str]:
        if signalled:
            signal.raise_signal(signal.SIGTERM)
        failed = write(final, output_dir, None)  # type: ignore[arg-type]
        return {**failed, "metrics.prom": PROM_REFUSED.format(dir=output_dir)}

    monkeypatch.setattr(module, "write_run_files", refusing)


def test_a_finished_end_whose_metrics_json_was_written_stands_after_a_later_signal(
        lc: LocalCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from psflow.launch import run_end

    _prom_refused(monkeypatch, run_end)
    out = io.StringIO()
    end = RunEnd(lc, str(tmp_path), started=0.0, out=out)
    final = end.finished(ps_stats=PS_STATS, train_seconds=1.5, evaluation=None, extra={}, client=None)
    assert (tmp_path / "metrics.json").exists()
    assert out.getvalue().splitlines() == ["psflow: " + PROM_REFUSED.format(dir=tmp_path)], out.getvalue()
    assert lc.signals.ended is final, "metrics.json written: the run's end, whatever the scrape file's fate"

    report = end.interrupted(signal.SIGTERM)
    assert report.splitlines() == [
        "SIGTERM arrived after the run had finished at global_step 42: its end stands; every task stopped",
        "  " + PROM_REFUSED.format(dir=tmp_path), f"metrics: {tmp_path}/metrics.json"], report
    assert _later_signal(lc, signal.SIGTERM).exit_code == 0, "a finished run: 0, as without the signal"


def test_an_in_process_finished_end_whose_metrics_json_was_written_stands_after_a_signal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from psflow.launch import run_status

    _prom_refused(monkeypatch, run_status, signalled=True)

    with pytest.raises(LaunchInterrupted) as raised:
        _in_process(tmp_path, monkeypatch, "finished", signalled=False)
    report = str(raised.value)
    assert report.splitlines() == [
        "SIGTERM arrived after the run had finished at global_step 42: its end stands",
        "  " + PROM_REFUSED.format(dir=tmp_path), f"metrics: {tmp_path}/metrics.json"], report
    assert raised.value.ended is not None and raised.value.exit_code == 0
    assert (tmp_path / "metrics.json").exists()
