"""The checkpoint ledger of the ps task holding global_step (``CheckpointStatus``, served by
:mod:`psflow.ps.checkpointing`): the lineage of the model state, the saves done and failed, the failures in a
row ``--max-failed-saves`` reads, the newest saved step and path, the newest failures.

Guarantees: thread-safe; a report carrying an id (:attr:`~psflow.ps.protocol.SaveOutcome.report_id`) that was
counted already (one of the newest 64: a resend after a failover) is not counted again; a late report of a save
older than the newest counted is counted, and leaves the newest checkpoint and the failure streak as they are. Kept in memory, and,
with a ``file`` (``psflow train``'s ps task 0: ``RUN_DIR/state/ps-0/`` :data:`SAVE_LEDGER_FILE`), written there
after every report, so that the task restarted by the launcher goes on with the same counts, newest checkpoint
and failed-save streak (the lineage is not kept: the restore sets it). Without one a restarted task starts from
zero; a replicated shard carries it to its backups (:mod:`psflow.ps.replication.save_ledger`, through
:meth:`SaveLedger.export` and :meth:`SaveLedger.load`).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from typing import Any

from psflow import jsonio, storage
from psflow.ps.protocol import CheckpointStatusReply, SaveOutcome
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

__all__ = ["SaveLedger", "SAVE_LEDGER_FILE"]

#: The ledger's file in a ps task's state directory (``psflow train``: ``RUN_DIR/state/ps-0/``).
SAVE_LEDGER_FILE = "checkpoint_ledger.json"

log = logging.getLogger(__name__)


class SaveLedger:
    """The lineage and save outcomes of one ps task (see ``CheckpointStatus``); thread-safe. Its service owns
    it, so gRPC and the TCP carrier serve the same one."""

    _KEEP = 20  # failures kept for the status reply
    _REPORTS = 64  # ids of the newest reports kept: a resent one is counted once

    def __init__(self, file: str | None = None) -> None:
        """``file``: where the ledger is kept across restarts of its task (see the module doc); what it holds is
        loaded now. A file that cannot be read or is not a ledger is logged (naming it) and the ledger starts
        from zero: losing the counts loses no training. None: in memory only."""
        self._lock = threading.Lock()
        self.file = file
        self.lineage: str | None = None
        self.saved = 0
        self.failed = 0
        self.failed_in_a_row = 0
        self.last_saved_step: int | None = None
        self.last_saved_path: str | None = None
        self.failures: list[dict[str, Any]] = []
        self.reports: list[str] = []  # the newest reports' ids (SaveOutcome.report_id), oldest first
        if file is not None:
            self._read(file)

    def _read(self, file: str) -> None:
        try:
            with open(file, encoding="utf-8") as f:
                state = json.load(f)
            self.load({**state, "lineage": None} if isinstance(state, dict) else state)
        except FileNotFoundError:
            return
        except (OSError, ValueError) as e:
            log.warning("checkpoint ledger %s not read (the counts start from zero): %s", file, e)

    def _keep(self) -> None:
        """Writes the ledger to its file (under the lock); a failed write is logged, the count in memory stands."""
        if self.file is None:
            return
        state = {**self._status().as_dict(), "reports": list(self.reports)}
        del state["lineage"]
        try:
            storage.makedirs(os.path.dirname(self.file) or ".")
            storage.write_atomically(self.file, jsonio.dumps(state, what=self.file).encode())
        except (OSError, ValueError) as e:
            log.warning("checkpoint ledger %s not written (a restart of this task would lose the counts): %s",
                        self.file, e)

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
                if not self._older(outcome.global_step):  # (a late report of an earlier chief: counted only)
                    self.failed_in_a_row = 0
                    self.last_saved_step, self.last_saved_path = outcome.global_step, outcome.path
            else:
                self.failed += 1
                self.failed_in_a_row += 1
                self.failures.append({"seq": self.failed, "global_step": outcome.global_step, "error": outcome.error,
                                      "writer": outcome.writer, "time": time.time()})
                del self.failures[:-self._KEEP]
            self._keep()

    def _older(self, step: int | None) -> bool:
        """Whether a save at ``step`` is older than the newest counted (its report came late: sent again by a chief
        whose duties moved on meanwhile); it does not take the newest checkpoint's place."""
        return step is not None and self.last_saved_step is not None and step < self.last_saved_step

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
