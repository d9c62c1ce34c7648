"""The cluster's checkpoint ledger as the chief's peers and the launcher see it.

The ps task holding global_step keeps the ledger (``CheckpointStatus``: the lineage, saves completed and
failed, the newest checkpoint; :mod:`psflow.ps.checkpointing`); :func:`checkpoint_status` reads it once and
:class:`SaveStatusWatcher` turns its readings into the launcher's console lines and counts, across restarts
of the task holding it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from psflow.ps.client import ParameterClient
from psflow.ps.protocol import CheckpointStatusReply, CheckpointStatusRequest
from psflow.rpc.api import RpcError

__all__ = ["checkpoint_status", "SaveStatusWatcher"]


def checkpoint_status(client: ParameterClient, *, timeout: float = 5.0) -> dict[str, Any]:
    """The cluster's checkpoint ledger (``CheckpointStatus`` of the ps task holding global_step).

    ``{lineage, saved, failed, failed_in_a_row, last_saved_step, last_saved_path, failures}``;
    see :mod:`psflow.ps.checkpointing`. Blocks for one RPC.

    Raises:
        RpcError: the task could not be reached.
    """
    return CheckpointStatusReply.from_frame(client.call(client.step_task, CheckpointStatusRequest(),
                                                        timeout=timeout)).as_dict()


class SaveStatusWatcher:
    """The launcher's view of the ledger: a console line for every failed save, and the counts.

    :meth:`poll` asks the ledger at most every ``every`` seconds (:meth:`update`
    takes a ledger read elsewhere). Counts go on across a restart of the ps task
    holding the ledger (which starts it from zero), and so does the newest
    checkpoint (a restarted ledger knows none until its first save); failures in
    its last moments before such a restart can be missed. ``psflow train``'s ps task 0
    keeps its ledger in a file (:class:`~psflow.ps.save_ledger.SaveLedger`): restarted, it
    goes on with the same counts, so nothing is missed. With replicated ps shards
    a promoted backup of shard 0 serves the same ledger
    (:mod:`psflow.ps.replication.save_ledger`): nothing is missed then. Not thread-safe.
    """

    def __init__(self, *, max_failed_saves: int, every: float = 2.0) -> None:
        self.max_failed_saves = max_failed_saves
        self.every = every
        self._last_poll = float("-inf")
        self._seen = 0       # failures of the current ledger already reported
        self._saved = 0      # saves of the current ledger
        self._earlier = (0, 0)  # (failed, saved) of ledgers before a restart of their task
        self._in_a_row = 0
        self._newest: tuple[int | None, str | None] = (None, None)  # (global_step, path) of the newest save seen

    @property
    def failed(self) -> int:
        """Failed saves seen in all."""
        return self._earlier[0] + self._seen

    @property
    def saved(self) -> int:
        """Completed saves seen in all."""
        return self._earlier[1] + self._saved

    def poll(self, client: ParameterClient, *, force: bool = False) -> list[str]:
        """Console lines for the failures since the last poll (none if polled less than ``every`` s ago).

        ``force``: poll now, whatever the time since the last one, wait for the channel to be
        connected (a channel whose first calls failed, before the ps tasks listened, backs off its
        reconnects) and longer for the answer (10 s instead of 2): a forced poll is the last one
        before the ps tasks stop (the run ended or failed), so a busy ps task or a short run must not
        cost the user the lines of its last failures.

        Never raises: a ledger that cannot be read now is read at a later poll.
        """
        now = time.monotonic()
        if not force and now - self._last_poll < self.every:
            return []
        self._last_poll = now
        try:
            if force:  # the channel may be backing off its reconnects (it was made before the ps tasks listened)
                client.channels[client.step_task].wait_ready(timeout=10.0)
            status = checkpoint_status(client, timeout=10.0 if force else 2.0)
        except RpcError:
            return []
        return self.update(status)

    def update(self, status: Mapping[str, Any]) -> list[str]:
        """Takes one reading of the ledger (``CheckpointStatus``); returns the console lines for the
        failures it shows for the first time."""
        failed, saved = int(status.get("failed") or 0), int(status.get("saved") or 0)
        if failed < self._seen or saved < self._saved:  # the ledger's task restarted: a new ledger
            self._earlier = (self.failed, self.saved)
            self._seen = self._saved = 0
        lines = []
        failures = [f for f in status.get("failures") or [] if isinstance(f, dict) and int(f.get("seq") or 0) > self._seen]
        missed = failed - self._seen - len(failures)
        if missed > 0:
            lines.append(f"psflow: {missed} checkpoint saves FAILED (details in the chief's log)")
        for f in failures:  # a save whose global_step was not read (its report carries none) says so
            at = "(no global_step read)" if f.get("global_step") is None else f"at global_step {f.get('global_step')}"
            lines.append(f"psflow: checkpoint {at} FAILED ({f.get('writer')}): {f.get('error')}")
        self._seen, self._saved = failed, saved
        self._in_a_row = int(status.get("failed_in_a_row") or 0)
        if status.get("last_saved_path"):
            step = status.get("last_saved_step")
            self._newest = (step if isinstance(step, int) else None, str(status["last_saved_path"]))
        if lines:
            limit = (f"the run stops after {self.max_failed_saves} in a row (--max-failed-saves)"
                     if self.max_failed_saves else "--max-failed-saves 0: the run goes on without checkpoints")
            lines.append(f"psflow: {status.get('failed_in_a_row')} checkpoint saves failed in a row, {self.failed} in all; "
                         f"{limit}")
        return lines

    def metrics(self) -> dict[str, int]:
        """``checkpoints_saved`` and ``checkpoints_failed`` for metrics.json."""
        return {"checkpoints_saved": self.saved, "checkpoints_failed": self.failed}

    def ledger(self) -> dict[str, Any]:
        """The run's ledger as seen so far, over every restart of its task: ``saved``, ``failed``,
        ``failed_in_a_row`` (the current ledger's), ``last_saved_step`` and ``last_saved_path``."""
        return {"saved": self.saved, "failed": self.failed, "failed_in_a_row": self._in_a_row,
                "last_saved_step": self._newest[0], "last_saved_path": self._newest[1]}
