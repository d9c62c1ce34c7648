"""The checkpoint reports a worker's saves could not deliver, sent by that worker whether or not it still holds the
chief duties (:class:`SendUnsentReports`).

A save's outcome is counted in the ledger of the ps task holding global_step (:mod:`psflow.ps.save_ledger`); one
sent while that task was down is kept and sent again with the same manager's next save
(:meth:`psflow.checkpoint.save.CheckpointManager.send_unsent`). Where the task's death also lost the chief lease
(the embedded coordination lives on ps task 0) and another worker took the duties, this one saves no more, and the
report was never sent: metrics.json counted one checkpoint fewer than were saved. This hook, outside the duties'
:class:`~psflow.train.leader_hooks.LeaderOnlyHook`, tries again after each step (at most every
:data:`EVERY` s, and only while a report waits: no RPC otherwise) and at the session's end. A report counted already
(its id) is not counted twice.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from psflow.checkpoint.save import CheckpointManager
from psflow.train.hook_api import RunContext, RunValues, SessionRunHook

if TYPE_CHECKING:
    from psflow.train.session import MonitoredTrainingSession

__all__ = ["EVERY", "SendUnsentReports"]

#: seconds between two tries while a report waits
EVERY = 1.0


class SendUnsentReports(SessionRunHook):
    """Sends ``manager``'s reports not delivered; see the module docstring. Never raises."""

    ends_always = True

    def __init__(self, manager: CheckpointManager) -> None:
        self.manager = manager
        self._last = float("-inf")

    def after_run(self, context: RunContext, values: RunValues) -> None:
        if time.monotonic() - self._last >= EVERY:
            self._last = time.monotonic()
            self.manager.send_unsent(context.session.client)

    def end(self, session: MonitoredTrainingSession) -> None:
        self.manager.send_unsent(session.client)
