"""A signal before any ps task answered global_step is reported without a 'None': the report says no global_step
was read.

Before: ``psflow train`` interrupted while its ps tasks were starting (or before the chief created global_step)
said ``interrupted by SIGINT at global_step None after 0.9 s; every task stopped:``, and so did the report of
an end a signal cut and a signal after such a run's failure (``SIGINT arrived after the run had failed at
global_step None``). ``RunEnd`` without a client reads no ps task, as a launcher whose ps tasks never answered
does; a real (task-less) cluster with one real task process (tests/one_worker_cluster.py).
"""

from __future__ import annotations

import io
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from one_worker_cluster import one_worker_cluster

from psflow.launch.lifeline import LaunchInterrupted
from psflow.launch.processes import LocalCluster
from psflow.launch.run_end import RunEnd

pytestmark = pytest.mark.timeout(60)

NO_STEP = "with no global_step read (no ps task had answered one)"


@pytest.fixture
def lc(tmp_path: Path) -> Iterator[LocalCluster]:
    with one_worker_cluster(tmp_path) as cluster:
        yield cluster


def test_an_interrupted_run_before_any_step_says_none_was_read(lc: LocalCluster, tmp_path: Path) -> None:
    report = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO()).interrupted(signal.SIGINT)
    assert "None" not in report, report
    assert report.startswith(f"interrupted by SIGINT {NO_STEP} after "), report


def test_an_end_a_signal_cut_before_any_step_says_none_was_read(lc: LocalCluster, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())

    def cut(final: dict[str, Any]) -> dict[str, str]:
        raise LaunchInterrupted(signal.SIGTERM)

    monkeypatch.setattr(end, "_write", cut)
    report = end.interrupted(signal.SIGINT)
    assert "None" not in report, report
    assert report.startswith(f"interrupted by SIGINT {NO_STEP} after "), report


def test_a_signal_after_a_failure_before_any_step_says_none_was_read(lc: LocalCluster, tmp_path: Path) -> None:
    end = RunEnd(lc, str(tmp_path), started=0.0, out=io.StringIO())
    end.failed("/job:ps/task:0 (pid 7) exited with code 1: root cause")
    report = end.interrupted(signal.SIGINT)
    assert "None" not in report, report
    assert report.startswith(f"SIGINT arrived after the run had failed {NO_STEP}: its end stands"), report
