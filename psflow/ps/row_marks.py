"""Row marks: which rows of a static partition changed since a given checkpoint snapshot (incremental checkpoints).

Every ps task has one :class:`MarkClock`: a token naming this task's marks (fresh in every process, so marks
are never compared across processes: a restarted task or a promoted backup has another token) and a save
counter, the *mark epoch*. Each static partition has :class:`RowMarks`: per row, the mark epoch at which the
row was last changed (0: never since the task started). The apply paths (sparse: the rows pushed; dense: every
row; ``LoadShard``: every row loaded) stamp the rows they change with the clock's current epoch, under the
partition's lock.

A checkpoint snapshot calls :meth:`MarkClock.advance` once before it snapshots any partition: it returns the
snapshot's epoch ``E`` and every later change is stamped ``E + 1`` or more. So the rows a snapshot at epoch
``E`` may lack are exactly those stamped above ``E``; an increment based on that snapshot holds
:meth:`RowMarks.changed_since` ``(E)`` (rows changed while it was taken may be held twice: harmless).

Nothing is ever cleared: the chief names the base snapshot (its token and epoch, read from the base
checkpoint's manifest) in each incremental save, and it advances its base only when a checkpoint is complete
(manifest written, pointer switched). So a save that failed leaves the next increment holding every row
changed since the last complete checkpoint. Guarantees: a task whose token is not the base's, a partition
without row structure (a 0-d value) and an averaged partition (its moving average moves every row every
step) are saved whole; a row built by a read of a lazy partition but never updated is not marked (it still
holds its initial value, which the base holds too).

Memory: 4 bytes per row (uint32), zero-filled arrays the OS commits on first write, in small pages
(:func:`psflow.ps.memory.use_small_pages`: the rows a sparse update stamps commit the pages around them, not
2 MiB each).
"""

from __future__ import annotations

import threading
import uuid

import numpy as np

from psflow.native.loader import load_extension
from psflow.ps.memory import use_small_pages

__all__ = ["MarkClock", "RowMarks"]

#: The C pass that stamps rows (``psflow.ps._kernels.touch_rows``; it also claims a lazy partition's new rows,
#: :meth:`psflow.ps.lazy_rows.LazyRows.ensure`), or None: numpy's ``changed_at[rows] = epoch`` then (the same
#: marks). One C call costs ~1 us against ~4 us for numpy's fancy assignment, which W&D's 52 tables pay per push.
_TOUCH_ROWS = getattr(load_extension("psflow.ps._kernels"), "touch_rows", None)


class MarkClock:
    """One ps task's mark token and epoch; thread-safe."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._epoch = 1

    @property
    def epoch(self) -> int:
        """The epoch changes are stamped with now."""
        return self._epoch

    def advance(self) -> int:
        """A snapshot begins: returns its epoch; changes from now on are stamped with a later one."""
        with self._lock:
            epoch = self._epoch
            self._epoch = epoch + 1
            return epoch


class RowMarks:
    """Per row of one static partition, the mark epoch of its last change. The caller holds the partition's lock."""

    def __init__(self, clock: MarkClock, rows: int, *, whole: bool = False) -> None:
        """Args:
            clock: the task's clock.
            rows: the partition's rows.
            whole: the partition is always saved whole (a 0-d value, a moving average): no per-row marks.
        """
        self.clock = clock
        self.whole = whole
        self.changed_at = np.zeros(0 if whole else rows, dtype=np.uint32)
        use_small_pages(self.changed_at)

    def mark(self, rows: np.ndarray | None) -> None:
        """Rows ``rows`` (local, valid; None: every row) changed now."""
        if self.whole:
            return
        if rows is None:
            self.changed_at.fill(self.clock.epoch)
        elif _TOUCH_ROWS is not None and rows.dtype == np.int64 and rows.ndim == 1 and rows.flags.c_contiguous:
            _TOUCH_ROWS(None, self.changed_at, self.clock.epoch, rows, None)
        else:
            self.changed_at[rows] = self.clock.epoch

    @property
    def per_row(self) -> np.ndarray | None:
        """The array of per-row epochs that :meth:`mark` writes (None: a partition saved whole, nothing to
        stamp): for a pass that stamps rows itself as :meth:`mark` would, with :attr:`clock`'s epoch."""
        return None if self.whole else self.changed_at

    def changed_since(self, token: str | None, epoch: int | None) -> np.ndarray | None:
        """The local rows (sorted int64) changed after the snapshot at ``epoch`` of the marks ``token``;
        None: the whole partition must be saved (another task's token, no base, or a partition saved whole)."""
        if self.whole or token != self.clock.token or epoch is None:
            return None
        return np.flatnonzero(self.changed_at > epoch).astype(np.int64)
