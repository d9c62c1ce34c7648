"""The launcher's failure report: a task's one-line expected error instead of its log's tail (issue 16)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from psflow.launch.processes import TaskProcess, failure_report
from psflow.launch.task import expected_failure
from psflow.train.config import ConfigError


def task(tmp_path: Path, job: str, index: int, pid: int, exit_code: int | None, log: str) -> TaskProcess:
    log_path = tmp_path / f"{job}-{index}.log"
    log_path.write_text(log)
    popen: Any = SimpleNamespace(pid=pid)
    return TaskProcess(job, index, popen, str(log_path), None, exit_code=exit_code,  # type: ignore[arg-type]
                       error_path=str(tmp_path / f"error-{job}-{index}.json"))


def test_the_root_causes_one_line_replaces_its_traceback(tmp_path: Path) -> None:
    worker = task(tmp_path, "worker", 0, 101, 1, "Traceback (most recent call last):\n  ...\nConfigError: boom\n")
    ps = task(tmp_path, "ps", 0, 100, None, "")
    code = expected_failure("/job:worker/task:0", ConfigError("--train: f.txt:5: malformed token 'x'"),
                            error_file=worker.error_path, verbose=False)
    assert code == 1
    assert json.loads(Path(str(worker.error_path)).read_text()) == {
        "task": "/job:worker/task:0", "type": "ConfigError", "message": "--train: f.txt:5: malformed token 'x'"}
    assert failure_report([worker], [ps]).splitlines() == [
        f"/job:worker/task:0 (pid 101) exited with code 1: root cause; log: {worker.log_path}",
        "  --train: f.txt:5: malformed token 'x'",
        "stopped /job:ps/task:0 (pid 100) after the failure",
    ]


def test_without_a_one_line_error_the_report_shows_the_log_tail(tmp_path: Path) -> None:
    worker = task(tmp_path, "worker", 0, 101, 1, "Traceback (most recent call last):\nKeyError: 'x'\n")
    report = failure_report([worker], [])
    assert "  last lines of its log:" in report and "    KeyError: 'x'" in report
