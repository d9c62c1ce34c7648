"""A deposed primary: it learned that another member is primary at a higher epoch.

From then on it refuses every push and pull with FAILED_PRECONDITION naming the new primary and epoch, logs
one warning line (``/job:ps/task:0: deposed: shard 0's primary is /job:ps_backup/task:0 at epoch 2; refusing
writes``), and rebuilds as a backup of the new primary (its state is replaced by the new primary's snapshot).
So an old primary cut off by a partition never acknowledges a write after the heal: no split brain.
"""

from __future__ import annotations

import logging
import threading

__all__ = ["Deposal"]

log = logging.getLogger("psflow.ps.replication")


class Deposal:
    """Whether member ``task`` was deposed, and by whom; logs the warning once. Thread-safe."""

    def __init__(self, task: str, shard: int) -> None:
        self.task, self.shard = task, shard
        self._lock = threading.Lock()
        self._by: tuple[str, int] | None = None
        self._logged = False

    def depose(self, primary: str | None, epoch: int) -> bool:
        """Records that ``primary`` is the shard's primary at ``epoch``; True the first time (the warning is
        logged then, once per process)."""
        with self._lock:
            first = self._by is None
            self._by = (primary or "unknown", epoch)
            if self._logged:
                return first
            self._logged = True
        log.warning("%s: deposed: shard %d's primary is %s at epoch %d; refusing writes", self.task, self.shard,
                    primary or "unknown", epoch)
        return first

    @property
    def by(self) -> tuple[str, int] | None:
        """(new primary, its epoch), or None when not deposed."""
        return self._by

    def message(self) -> str:
        primary, epoch = self._by or ("unknown", 0)
        return f"{self.task}: deposed: shard {self.shard}'s primary is {primary} at epoch {epoch}; refusing writes"

    def rebuilt(self) -> None:
        """Rebuilt as a backup of the new primary: no longer deposed (the warning is not logged again)."""
        with self._lock:
            self._by = None
