"""The launcher's line for a failed save whose global_step was not read (ps task 0 not answering, or not ready: the
ledger's report carries none) says so, never 'checkpoint at global_step None FAILED' (psflow.checkpoint.ledger)."""

from __future__ import annotations

from psflow.checkpoint.ledger import SaveStatusWatcher


def test_a_failure_with_no_global_step_says_none_was_read() -> None:
    watcher = SaveStatusWatcher(max_failed_saves=3)
    lines = watcher.update({"failed": 2, "saved": 0, "failed_in_a_row": 2, "failures": [
        {"seq": 1, "global_step": None, "writer": "/job:worker/task:0", "error": "CheckpointError: x"},
        {"seq": 2, "global_step": 40, "writer": "/job:worker/task:0", "error": "CheckpointError: y"}]})
    assert lines[0] == ("psflow: checkpoint (no global_step read) FAILED (/job:worker/task:0): CheckpointError: x")
    assert lines[1] == "psflow: checkpoint at global_step 40 FAILED (/job:worker/task:0): CheckpointError: y"
