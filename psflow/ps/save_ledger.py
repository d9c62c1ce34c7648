"""The checkpoint ledger of the ps task holding global_step (``CheckpointStatus``, served by
:mod:`psflow.ps.checkpointing`): the lineage of the model state, the saves done and failed, the failures in a
row ``--max-failed-saves`` reads, the newest saved step and path, the newest failures.

Guarantees: thread-safe; a report carrying an id (:attr:`~psflow.ps.protocol.SaveOutcome.report_id`) that was
counted already (one of the newest 64: a resend after a failover) is not counted again. Kept in memory: a
restarted task starts from zero; a replicated shard carries it to its backups
(:mod:`psflow.ps.replication.save_ledger`, through :meth:`SaveLedger.export` and :meth:`SaveLedger.load`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from psflow.ps.protocol import CheckpointStatusReply, SaveOutcome
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

__all__ = ["SaveLedger"]


class SaveLedger:
    """The lineage and save outcomes of one ps task (see ``CheckpointStatus``); thread-safe. Its service owns
    it, so gRPC and the TCP carrier serve the same one."""

    _KEEP = 20  # failures kept for the status reply
    _REPORTS = 64  # ids of the newest reports kept: a resent one is counted once

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.lineage: str | None = None
        self.saved = 0
        self.failed = 0
        self.failed_in_a_row = 0
        self.last_saved_step: int | None = None
        self.last_saved_path: str | None = None
        self.failures: list[dict[str, Any]] = []
        self.reports: list[str] = []  # the newest reports' ids (SaveOutcome.report_id), oldest first

    def set_lineage(self, lineage: str, *, only_if_unset: bool) -> None:
        with self._lock:
            if self.lineage is None or not only_if_unset:
                self.lineage = lineage

    def record(self, outcome: SaveOutcome) -> None:
        """Counts ``outcome`` once: a report whose id was counted already (a resend) changes nothing."""
        with self._lock:
            if outcome.report_id:
                if outcome.report_id in self.reports:
                    return
                self.reports.append(outcome.report_id)
                del self.reports[:-self._REPORTS]
            if outcome.saved:
                self.saved += 1
                self.failed_in_a_row = 0
                self.last_saved_step, self.last_saved_path = outcome.global_step, outcome.path
                return
            self.failed += 1
            self.failed_in_a_row += 1
            self.failures.append({"seq": self.failed, "global_step": outcome.global_step, "error": outcome.error,
                                  "writer": outcome.writer, "time": time.time()})
            del self.failures[:-self._KEEP]

    def status(self) -> CheckpointStatusReply:
        with self._lock:
            return self._status()

    def _status(self) -> CheckpointStatusReply:
        return CheckpointStatusReply(self.lineage, self.saved, self.failed, self.failed_in_a_row,
                                     self.last_saved_step, self.last_saved_path, [dict(f) for f in self.failures])

    def export(self) -> dict[str, Any]:
        """The whole ledger (JSON: what ``CheckpointStatus`` replies, and the newest reports' ids), for a
        replicated shard's backups."""
        with self._lock:  # one reading: the counts and the ids of the reports they count
            return {**self._status().as_dict(), "reports": list(self.reports)}

    def load(self, state: Any) -> None:
        """Replaces the whole ledger with ``state`` (an :meth:`export`).

        Raises:
            ValueError: ``state`` is malformed (nothing changed).
        """
        if not isinstance(state, dict):
            raise ValueError(f"a checkpoint ledger is a mapping, got {type(state).__name__}")
        try:
            status = CheckpointStatusReply.from_frame(Frame(state))
        except InvalidRequest as e:
            raise ValueError(f"malformed checkpoint ledger: {e}") from e
        reports = state.get("reports") or []
        if not (isinstance(reports, list) and all(isinstance(r, str) for r in reports)):
            raise ValueError(f"malformed checkpoint ledger: 'reports' must be a list of strings, got {reports!r:.60}")
        with self._lock:
            self.reports = reports[-self._REPORTS:]
            self.lineage, self.saved, self.failed = status.lineage, status.saved, status.failed
            self.failed_in_a_row = status.failed_in_a_row
            self.last_saved_step, self.last_saved_path = status.last_saved_step, status.last_saved_path
            self.failures = [dict(f) for f in status.failures][-self._KEEP:]
