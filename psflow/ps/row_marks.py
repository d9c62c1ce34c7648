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

Memory: one byte per row, a zero-filled array the OS commits on first write, in small pages
(:func:`psflow.ps.memory.use_small_pages`: the rows a sparse update stamps commit the pages around them, not
2 MiB each). A byte holds a row's epoch relative to the partition's *base* (0: not changed after the base;
1-255: changed at base + the byte). When the clock outgrows a byte, the marks are rebased (the nonzero ones
rewritten, every row's epoch minus the shift, floored at 0) so that the last :data:`KEPT_EPOCHS` epochs stay
exact; an increment whose base snapshot is older than the partition's base saves the partition whole. An
increment's base is the previous complete checkpoint, so that happens only after 128 failed saves in a row,
whatever the run's length. A stamp costs a quarter of the uint32 it replaced in memory, page faults and cache
misses (W&D's 52 tables: a push stamps ~7,000 rows).
"""

from __future__ import annotations

import threading
import uuid

import numpy as np

from psflow.native.loader import load_extension
from psflow.ps.memory import use_small_pages

__all__ = ["KEPT_EPOCHS", "MarkClock", "RowMarks"]

#: The epochs a partition's marks tell apart exactly after a rebase (the newest ones); a byte holds 255.
KEPT_EPOCHS = 128
_BYTE_MAX = 255

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
    """Per row of one static partition, the mark epoch of its last change (one byte, relative to :attr:`base`).
    The caller holds the partition's lock."""

    def __init__(self, clock: MarkClock, rows: int, *, whole: bool = False) -> None:
        """Args:
            clock: the task's clock.
            rows: the partition's rows.
            whole: the partition is always saved whole (a 0-d value, a moving average): no per-row marks.
        """
        self.clock = clock
        self.whole = whole
        self.changed_at = np.zeros(0 if whole else rows, dtype=np.uint8)
        use_small_pages(self.changed_at)
        #: The epoch a byte of 0 stands for (a row not changed after it); a byte b > 0: changed at base + b.
        self.base = 0

    def stamp_now(self) -> tuple[np.ndarray, int] | None:
        """(the per-row marks, the byte that stamps a row changed now), for a pass that stamps rows itself as
        :meth:`mark` does; None where the partition is saved whole (nothing to stamp). Rebases the marks first
        where the clock has moved past what a byte holds."""
        if self.whole:
            return None
        relative = self.clock.epoch - self.base
        if relative > _BYTE_MAX:
            self._rebase(relative - KEPT_EPOCHS)
            relative = KEPT_EPOCHS
        return self.changed_at, relative

    def _rebase(self, shift: int) -> None:
        """Moves :attr:`base` ``shift`` epochs on: each mark becomes its epoch minus the shift, floored at 0 (the
        rows changed at or before the new base are then told apart from unchanged ones no more). Only the
        nonzero marks are written, so the pages of rows never stamped stay uncommitted."""
        changed = np.flatnonzero(self.changed_at)
        if changed.size:
            moved = self.changed_at[changed].astype(np.int64) - shift
            self.changed_at[changed] = np.maximum(moved, 0).astype(np.uint8)
        self.base += shift

    def mark(self, rows: np.ndarray | None) -> None:
        """Rows ``rows`` (local, valid; None: every row) changed now."""
        stamp = self.stamp_now()
        if stamp is None:
            return
        changed_at, byte = stamp
        if rows is None:
            changed_at.fill(byte)
        elif _TOUCH_ROWS is not None and rows.dtype == np.int64 and rows.ndim == 1 and rows.flags.c_contiguous:
            _TOUCH_ROWS(None, changed_at, byte, rows, None)
        else:
            changed_at[rows] = byte

    def changed_since(self, token: str | None, epoch: int | None) -> np.ndarray | None:
        """The local rows (sorted int64) changed after the snapshot at ``epoch`` of the marks ``token``;
        None: the whole partition must be saved (another task's token, no base, a partition saved whole, or a
        snapshot older than the marks' :attr:`base`, which they no longer tell apart)."""
        if self.whole or token != self.clock.token or epoch is None or epoch < self.base:
            return None
        relative = epoch - self.base
        if relative >= _BYTE_MAX:
            return np.zeros(0, dtype=np.int64)  # no mark is above it
        return np.flatnonzero(self.changed_at > relative).astype(np.int64)
