"""The count of applied pushes a replicated shard's checkpoints carry (issue 28).

A shard counts ``pushes_applied``; its workers report ``pushes_acknowledged``; ``updates_lost`` is their
difference once every replica of the shard was lost and its state came back from a checkpoint. For that
difference to be exact, the checkpoint holds the count of the pushes its snapshot holds and a restore sets the
count back to it (:class:`psflow.ps.checkpointing.PushCount`, which :class:`CheckpointCount` is):

* :meth:`CheckpointCount.holding` keeps pushes from being applied while a ``SaveShard`` snapshots the shard:
  in async and ssp mode the lock a replicated push is applied and recorded under (an ssp push waits for the
  slowest worker after it, outside the lock), in sync mode the aggregator's lock its steps are applied and
  recorded under. So the snapshot holds exactly the pushes counted.
* :meth:`CheckpointCount.restored` sets the count; the ``LoadShard`` it comes with is replicated whole (a
  full entry), so the backups get it too.
* Each client process's count of the pushes the snapshot holds goes with the total (the dedup table's
  ``applied``: :meth:`psflow.ps.replication.dedup.DedupTable.lost` reports the loss per process from it).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from psflow.ps.checkpointing import HeldPushes
from psflow.ps.replication.dedup import DedupTable
from psflow.ps.update_mode import UpdateMode

__all__ = ["CheckpointCount"]


class CheckpointCount:
    """The ``pushes_applied`` of one shard member's counts, as its checkpoints save and load it."""

    def __init__(self, counts: dict[str, int], dedup: DedupTable, apply_lock: threading.Lock,
                 mode: UpdateMode) -> None:
        """``counts``: the member's counts (``pushes_applied`` among them); ``dedup``: its dedup table (each
        process's applied count); ``apply_lock``: the lock an async or ssp push is applied and recorded under;
        ``mode``: the task's update mode (its sync aggregator)."""
        self._counts, self._dedup, self._apply_lock, self._mode = counts, dedup, apply_lock, mode

    @contextmanager
    def holding(self) -> Iterator[HeldPushes]:
        """No push is applied while held; gives the count of those applied, in all and per client process."""
        aggregator = self._mode.aggregator
        # A sync step is applied, and its pushes counted, under the aggregator's lock (SyncAggregator._apply).
        lock = aggregator._cond if aggregator is not None else self._apply_lock
        with lock:
            yield HeldPushes(self._counts["pushes_applied"], self._dedup.applied_by())

    def restored(self, count: int, by_process: list[list[Any]] | None) -> None:
        """The shard was restored within the run from a checkpoint holding ``count`` pushes, ``by_process``
        of each client process (None: an older checkpoint without them)."""
        self._counts["pushes_applied"] = count
        self._dedup.restore_applied(by_process)
