"""A save's report the ledger missed (ps task 0 down) reaches it although this chief saves no more (its duties moved to
another worker), and a late report does not take the newest checkpoint's place in the ledger.

Before: the report was sent again only with the same manager's next save; where ps task 0's death also lost the chief
lease and the other worker took the duties, none came, and the run's metrics.json counted 16 checkpoints against 17
saved (tests/integration/test_final_snapshot.py's run with kill:ps:0 beside CPU hogs: worker 0's 'could not report the
checkpoint outcome to the ledger' for ckpt-700, then worker 1 saved from 800 on). A client that fails its first
report; the ledger is the real one (:class:`psflow.ps.save_ledger.SaveLedger`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from psflow.checkpoint.save import CheckpointManager
from psflow.ps.protocol import SaveOutcome
from psflow.ps.save_ledger import SaveLedger
from psflow.rpc.api import TaskUnavailableError


class _Client:
    client_name, step_task = "/job:worker/task:0", 0

    def __init__(self, ledger: SaveLedger, *, down: int) -> None:
        self.ledger, self.down = ledger, down

    def call(self, task: int, request: Any, timeout: float) -> None:
        if self.down > 0:
            self.down -= 1
            raise TaskUnavailableError("/job:ps/task:0: down")
        self.ledger.record(request.outcome)


def test_a_report_missed_while_ps_task_0_was_down_is_sent_without_another_save(tmp_path: Path) -> None:
    ledger = SaveLedger()
    manager = CheckpointManager(str(tmp_path / "ckpt"))
    client = _Client(ledger, down=1)
    manager._report(client, SaveOutcome(True, 700, "ckpt-000000700"))  # type: ignore[arg-type]
    assert ledger.saved == 0
    ledger.record(SaveOutcome(True, 800, "ckpt-000000800", report_id="/job:worker/task:1/p/1"))  # the new holder's
    manager.send_unsent(client)  # type: ignore[arg-type]
    assert ledger.saved == 2
    assert (ledger.last_saved_step, ledger.last_saved_path) == (800, "ckpt-000000800")
    manager.send_unsent(client)  # type: ignore[arg-type]  # nothing left: counted once
    assert ledger.saved == 2


def test_a_late_success_leaves_the_failure_streak_of_newer_saves() -> None:
    ledger = SaveLedger()
    ledger.record(SaveOutcome(True, 800, "ckpt-000000800"))
    ledger.record(SaveOutcome(False, 900, error="CheckpointError: x"))
    ledger.record(SaveOutcome(True, 700, "ckpt-000000700"))
    assert (ledger.saved, ledger.failed, ledger.failed_in_a_row) == (2, 1, 1)
    assert ledger.last_saved_step == 800
    ledger.record(SaveOutcome(True, 1000, "ckpt-000001000"))
    assert (ledger.failed_in_a_row, ledger.last_saved_path) == (0, "ckpt-000001000")
