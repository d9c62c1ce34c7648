"""An in-graph run whose ps task dies without a restart policy: one line naming the task, no traceback.

Before: the in-graph client's log (and the launcher's report of it) ended with a Python traceback
through the push path (``TaskUnavailableError: /job:ps/task:1: Push: connection ... reset by peer``),
where a between-graph worker says in one line that a ps task failed. Real processes.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import A9A, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def test_a_ps_task_killed_in_an_in_graph_run_is_one_line_in_the_clients_log(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "2", "--workers", "2",
                "--batch-size", "32", "--epochs", "3", "--replication", "in-graph", "--quiet", "--output", str(out),
                "--chaos", "kill:ps:1@step=300", timeout=100)
    assert r.returncode == 1, r.stderr[-3000:]
    assert "/job:ps/task:1 (pid " in r.stderr and "restart policy is 'never'" in r.stderr, r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    for task in ("client-0", "worker-0", "worker-1"):  # a worker whose pull failed says so in one line too
        text = (out / "logs" / f"{task}.log").read_text()
        assert "Traceback" not in text, (task, text[-3000:])
    log = (out / "logs" / "client-0.log").read_text()
    # The client either failed on the dead task (one ERROR line naming it) or was stopped by the launcher first.
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert all(re.search(r"/job:client/task:0: .*/job:ps/task:1", line) or "stop" in line for line in errors), errors
