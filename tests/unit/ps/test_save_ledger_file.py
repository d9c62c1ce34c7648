"""The checkpoint ledger kept in a file outlives a restart of its ps task (``psflow train``'s ps task 0).

Kept in memory only, a ledger restarted with its task started from zero, and the launcher, which reads it
every two seconds, missed the saves and failures in between: a run with ps task 0 killed at step 300 logged
33 saves and 1 failure in its chief's log and wrote 26 and 0 into metrics.json. A restarted task here is a new
ledger on the same file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from psflow.ps.protocol import SaveOutcome
from psflow.ps.save_ledger import SaveLedger

pytestmark = pytest.mark.timeout(30)


def _reports(ledger: SaveLedger) -> None:
    ledger.set_lineage("run-a", only_if_unset=True)
    ledger.record(SaveOutcome(True, 10, "/ckpt/ckpt-000000010", writer="chief", report_id="chief/1/1"))
    ledger.record(SaveOutcome(False, 20, error="CheckpointError: disk full", writer="chief", report_id="chief/1/2"))
    ledger.record(SaveOutcome(True, 30, "/ckpt/ckpt-000000030", writer="chief", report_id="chief/1/3"))
    ledger.record(SaveOutcome(False, 40, error="CheckpointError: disk full", writer="chief", report_id="chief/1/4"))


def test_a_restarted_ledger_goes_on_with_the_counts_of_its_file(tmp_path: Path) -> None:
    file = str(tmp_path / "state" / "ps-0" / "checkpoint_ledger.json")
    before = SaveLedger(file)
    _reports(before)
    after = SaveLedger(file)  # the task restarted
    status = after.status()
    assert (status.saved, status.failed, status.failed_in_a_row) == (2, 2, 1)
    assert (status.last_saved_step, status.last_saved_path) == (30, "/ckpt/ckpt-000000030")
    assert [f["global_step"] for f in status.failures] == [20, 40]
    assert status.lineage is None  # the restore sets it
    after.record(SaveOutcome(False, 40, error="CheckpointError: disk full", writer="chief", report_id="chief/1/4"))
    assert after.status().failed == 2  # a report resent after the restart is counted once


def test_without_a_file_a_ledger_starts_from_zero_and_a_damaged_file_is_logged(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _reports(SaveLedger())
    assert SaveLedger().status().saved == 0
    file = tmp_path / "checkpoint_ledger.json"
    file.write_text("{not json\n")
    ledger = SaveLedger(str(file))
    assert (ledger.status().saved, ledger.status().failed) == (0, 0)
    assert str(file) in caplog.text
    ledger.record(SaveOutcome(True, 5, "/ckpt/ckpt-000000005", writer="chief", report_id="c/1/1"))
    assert SaveLedger(str(file)).status().saved == 1  # written whole again
