"""A finished run whose ps task exited after training (not restarted) reports its dynamic tables' totals as not
known, naming that task, never the other shares' sum as the whole (psflow.ps.dynamic.spec.table_totals).

Before: metrics.json's ``dynamic_tables`` and the end's ``dynamic table 'w': N rows ...`` line summed the ps
tasks read, leaving out the lost task's share (every dynamic table spans every ps task) as if complete. Real
``psflow train`` processes; ps task 1 is lost by tests/integration/ps_lost_after_training (SIGKILL by pid, after
training; not started again, as in test_ps_lost_not_restarted, or started again empty, as in
test_ps_lost_after_training).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support import A9A, A9A_T, REPO, run_bounded

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.mark.parametrize(("restart", "why"), [("0", "after training"), ("1", "restarted empty")],
                         ids=["exited", "restarted_empty"])
def test_a_ps_task_lost_after_training_leaves_the_tables_totals_not_known(tmp_path: Path, restart: str,
                                                                          why: str) -> None:
    """``restarted_empty``: the task started again empty (nobody restores it) answers Stats with no share; before,
    its share counted as zero (metrics.json 'weights' rows 63, ps task 0's share, as the whole)."""
    out = tmp_path / "run"
    env = dict(os.environ, PSFLOW_TEST_LOSE_PS="1", PSFLOW_TEST_LOSE_RESTART=restart, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).parent / "ps_lost_after_training"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--eval", str(A9A_T),
                     "--num-features", "124", "--ps", "2", "--workers", "2", "--batch-size", "128",
                     "--max-steps", "60", "--output", str(out), "--no-status", "--restart-policy", "never",
                     "--embedding-table", "dynamic", "--connect-timeout", "900",
                     "--checkpoint-dir", str(tmp_path / "ckpt")], timeout=250, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-4000:]
    metrics = json.loads((out / "metrics.json").read_text())
    tables = metrics["dynamic_tables"]
    assert tables, metrics.keys()
    for name, table in tables.items():
        assert table["rows"] is None and table["memory_bytes"] is None, (name, table)
        assert [u["task"] for u in table["shares_unread"]] == ["/job:ps/task:1"], table
        assert why in table["shares_unread"][0]["error"], table
        assert f"psflow: dynamic table {name!r}: totals not known: the share on /job:ps/task:1 was not read" in r.stderr


def test_the_only_ps_task_lost_after_training_still_reports_each_table(tmp_path: Path) -> None:
    """``--ps 1``, that task lost after training: no ps task is read, so no Stats names a table; the launcher names
    them from the run's model. Before, metrics.json had no ``dynamic_tables`` and the console said nothing of them."""
    out = tmp_path / "run"
    env = dict(os.environ, PSFLOW_TEST_LOSE_PS="0", PSFLOW_TEST_LOSE_RESTART="0", PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).parent / "ps_lost_after_training"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--eval", str(A9A_T),
                     "--num-features", "124", "--ps", "1", "--workers", "2", "--batch-size", "128",
                     "--max-steps", "60", "--output", str(out), "--no-status", "--restart-policy", "never",
                     "--embedding-table", "dynamic", "--connect-timeout", "900",
                     "--checkpoint-dir", str(tmp_path / "ckpt")], timeout=250, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-4000:]
    tables = json.loads((out / "metrics.json").read_text()).get("dynamic_tables")
    assert tables, r.stderr[-3000:]
    for name, table in tables.items():
        assert table["rows"] is None and table["admitted"] is None, (name, table)
        assert [u["task"] for u in table["shares_unread"]] == ["/job:ps/task:0"], table
        assert f"psflow: dynamic table {name!r}: totals not known: the share on /job:ps/task:0 was not read" in r.stderr
