"""Static partitions whose rows are built on first touch (issue 29: start-up O(1) in the table size).

A large static partition (:data:`LAZY_MIN_BYTES` of value or more) is created with its value, its
optimizer slots and its moving average as zero-filled arrays (:func:`unbuilt_array`: memory the OS
reserves and commits page by page on first write, in small pages, so it follows the rows touched) and
one "materialized" mark per row, all False. Before any code
reads or writes rows, it materializes those not yet marked (:meth:`LazyRows.ensure`): each gets its
initial value (:func:`psflow.ps.initializers.initial_rows`, a function of the variable, the row and the
seed alone), its optimizer slots' initial values (``Optimizer.create_slots`` of those rows, so Adagrad's
initial accumulator too) and, when averaged, a shadow equal to that value.

Invariant: the content of an unmarked row in the value, the slots and the average is meaningless (zeros,
or whatever a whole-array pass such as the moving averages' wrote into it); its true content is the
initial one, which is what the row of an eager partition holds (an untouched row is never updated, and a
moving average of an unchanged value stays at it exactly). So every path either materializes the rows it
touches (reads, sparse and dense updates: :class:`psflow.ps.store.ParameterStore`) or substitutes the
initial content for unmarked rows in a copy (:meth:`LazyRows.initial_copy`: checkpoints, replica
snapshots), and a lazy partition reads, updates and saves bit-equal to an eager one.

Which partitions are lazy (:func:`lazy_eligible`): a static one of :data:`LAZY_MIN_BYTES` or more whose
optimizer updates only the rows of a sparse gradient. Smaller ones (dense layers, biases) are created
eagerly: they take milliseconds to build, and their hot path then carries no check at all. An optimizer
whose sparse update moves every row (non-lazy Adam) would materialize the whole table on the first push,
so its partitions are eager too.

Cost on the hot path: one pass over the rows a request touches that finds and marks those not built yet
(the C kernel ``first_touch``: ~8 us for 5,000 rows; without it numpy's ``~marks[rows]`` test, then
``np.unique`` of the new ones); once every row is materialized the partition drops its :class:`LazyRows`
and the check is gone. A sparse update's pass (the C kernel ``touch_rows``) also stamps the rows it changes in
the incremental checkpoints' row marks (:mod:`psflow.ps.row_marks`, a byte a row): one walk over the pushed
rows for both kinds of marks, each new row stamped only once it is built. Building a row of a constant
initializer (zeros, ones, constant: sparse LR's weights,
W&D's wide tables) writes one row computed at creation into the value and each slot, broadcast; a random one
computes the rows from their indices. A Zipf-like workload may never get there (sparse LR's 2^20-row table: 35% of its
rows touched after an epoch, a few hundred new ones in each request of ~5,300 rows), so the pass stays
cheap. A ps task's read of many partitions builds their new rows together first (:func:`ensure_together`,
called by :meth:`psflow.ps.store.ParameterStore.materialize_together`): one
:func:`~psflow.ps.initializers.initial_rows_many` call for all the random tables' new rows instead of one
per table (W&D's 26 deep tables: ~1.05 -> ~0.31 ms of numpy per request). What is left of a build is the
kernel committing the fresh pages the new rows land in (~1.3 us a 4 KiB page here), which only a layout
storing rows in touch order would cut. Thread safety: the caller holds the partition's lock around every
method here (:func:`ensure_together`: every job's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from psflow.native.loader import load_extension
from psflow.ps.initializers import CONSTANT_INITIALIZERS, initial_rows, initial_rows_many
from psflow.ps.memory import use_small_pages
from psflow.ps.optimizers import Optimizer
from psflow.ps.row_marks import RowMarks

__all__ = ["LAZY_MIN_BYTES", "LazyRows", "ensure_together", "lazy_eligible", "unbuilt_array"]

#: Partitions whose value takes at least this many bytes are created lazily. At the ~70 MB/s an eager
#: random initialization runs at (value, slots), 1 MiB costs ~15-30 ms of start-up: below it laziness
#: saves nothing worth a check per access; every embedding table of a CTR model (2^16 rows x 4 floats
#: and up) is above it, every dense layer of the built-in models below.
LAZY_MIN_BYTES = 1 << 20

#: Rows materialized (or substituted) at a time by the whole-partition paths: bounds their temporaries.
_CHUNK_ELEMENTS = 1 << 18

#: The C loop that finds and marks a request's rows not built yet (``psflow.ps._kernels.first_touch``), or
#: None: numpy's mark test and ``np.unique`` then (the same rows, sorted instead of in order of appearance).
_FIRST_TOUCH = getattr(load_extension("psflow.ps._kernels"), "first_touch", None)

#: The C loop that does ``first_touch``'s claim and stamps the rows already built as changed (incremental
#: checkpoints' row marks) in the same pass: a sparse update's one walk over its rows (``psflow.ps._kernels.
#: touch_rows``), or None: the claim as above, then :meth:`psflow.ps.row_marks.RowMarks.mark` of every row.
_TOUCH_ROWS = getattr(load_extension("psflow.ps._kernels"), "touch_rows", None)


def unbuilt_array(shape: tuple[int, ...], dtype: str | np.dtype[Any]) -> np.ndarray:
    """A lazy partition's value, slot or average before any row is built: zero-filled memory the OS commits
    page by page on first write, backed by small pages (:func:`psflow.ps.memory.use_small_pages`), so the
    memory committed follows the rows touched (a 4 KiB page per touched row at most, not numpy's 2 MiB)."""
    array = np.zeros(shape, dtype=dtype)
    use_small_pages(array)
    return array


def lazy_eligible(shape: tuple[int, ...], dtype: str, optimizer: Optimizer | None) -> bool:
    """Whether a static partition of ``shape`` and ``dtype`` under ``optimizer`` is created lazily."""
    nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if len(shape) < 1 or shape[0] < 2 or nbytes < LAZY_MIN_BYTES:
        return False
    return optimizer is None or not optimizer.sparse_touches_all_rows


@dataclass
class LazyRows:
    """The materialized marks of one lazy partition and what builds its rows.

    Args:
        initializer: the variable's initializer spec.
        full_shape: the whole variable's shape.
        row_start: the partition's first row in the variable.
        rows: the partition's number of rows.
        dtype: the value's dtype name.
        optimizer: the partition's optimizer (its slots' initial values), or None.
    """

    initializer: Mapping[str, Any]
    full_shape: tuple[int, ...]
    row_start: int
    rows: int
    dtype: str
    optimizer: Optimizer | None

    def __post_init__(self) -> None:
        self.marks = np.zeros(self.rows, dtype=np.bool_)  # one byte a row, committed as rows are touched
        self.count = 0  # rows marked
        row_size = int(np.prod(self.full_shape[1:], dtype=np.int64)) if len(self.full_shape) > 1 else 1
        self._chunk_rows = max(1, _CHUNK_ELEMENTS // max(1, row_size))  # rows a whole-partition path takes at a time
        # A constant initializer's (zeros, ones, constant) row, the same for every row of the partition; None for
        # a random one (each row then built from its index).
        self._constant_row = (initial_rows(self.initializer, self.full_shape, np.array([self.row_start], np.int64),
                                           self.dtype)[0]
                              if self.initializer.get("name") in CONSTANT_INITIALIZERS else None)
        # Each slot's initial row: Optimizer.create_slots fills a slot with one constant whatever the value
        # (only its shape is read), so a built row gets this row, broadcast.
        row_shape = (1, *self.full_shape[1:])
        self._slot_rows = ({name: slot[0] for name, slot in
                            self.optimizer.create_slots(np.zeros(row_shape, np.float32)).items()
                            if name in self.optimizer.slot_names} if self.optimizer is not None else {})

    @property
    def slot_rows(self) -> Mapping[str, np.ndarray]:
        """Each optimizer slot's initial row (what a built row's slot gets), by slot name."""
        return self._slot_rows

    @property
    def complete(self) -> bool:
        """Every row is materialized (the partition may drop this object)."""
        return self.count >= self.rows

    def _write_initial(self, rows: np.ndarray, value: np.ndarray, slots: Mapping[str, np.ndarray],
                       average: np.ndarray | None) -> None:
        """Writes the initial content of local ``rows`` into ``value``/``slots``/``average``."""
        initial = (self._constant_row if self._constant_row is not None  # one row, broadcast: the same bits
                   else initial_rows(self.initializer, self.full_shape, rows + self.row_start, self.dtype))
        self._write_built(rows, initial, value, slots, average)

    def _write_built(self, at: np.ndarray, initial: np.ndarray, value: np.ndarray, slots: Mapping[str, np.ndarray],
                     average: np.ndarray | None) -> None:
        """Writes the ``initial`` rows (or one row, broadcast) into ``value`` (and ``average``) at ``at``, and each
        slot's initial row there."""
        value[at] = initial
        if average is not None:
            average[at] = initial
        for name, slot_row in self._slot_rows.items():
            if name in slots:
                slots[name][at] = slot_row

    def ensure(self, rows: np.ndarray, value: np.ndarray, slots: Mapping[str, np.ndarray],
               average: np.ndarray | None, *, changed: RowMarks | None = None) -> None:
        """Materializes those of the valid local ``rows`` (int64, repeats allowed) not yet marked.

        With the C kernel, one pass over ``rows`` finds and marks them (no sort: a request's rows arrive
        unsorted, and on a Zipf-like workload a few hundred of its thousands are new at every step); the
        rows are built in order of first appearance, which gives the same content (a row's initial value is
        a function of its index alone). If building them fails, their marks are cleared again.

        ``changed``: the partition's row marks, where the caller is about to change ``rows`` (a sparse
        update): every one of ``rows`` is stamped changed now (:meth:`RowMarks.mark`), those built already in
        the same pass that finds the new ones (the C kernel ``touch_rows``), the new ones once they are built.
        So a row is never marked changed before it is built (an incremental checkpoint saves a changed row's
        content as it is): a build that fails leaves its rows unmarked both ways (the rows built before are
        stamped already where the C pass ran, and not at all without it: either is harmless, the update is not
        applied).
        """
        if changed is None:
            new, unstamped = self._claim(rows), None
        else:
            new, unstamped = self._claim_stamping(rows, changed)
        if new is not None:
            try:
                self._write_chunks(new, value, slots, average)
            except BaseException:
                self._unclaim(new)
                raise
            self.count += int(new.size)
        if changed is not None and unstamped is not None:
            changed.mark(unstamped)

    def _claim_stamping(self, rows: np.ndarray, changed: RowMarks) -> tuple[np.ndarray | None, np.ndarray | None]:
        """:meth:`_claim`, and the rows already built stamped changed in the same pass where the C kernel runs.
        Returns (the new rows or None, the rows the caller still stamps once the new ones are built, or None)."""
        stamp = changed.stamp_now()
        if _TOUCH_ROWS is None or stamp is None or rows.dtype != np.int64 or rows.ndim != 1:
            return self._claim(rows), rows
        found = np.empty(rows.shape[0], dtype=np.int64)
        n = _TOUCH_ROWS(self.marks, stamp[0], stamp[1], np.ascontiguousarray(rows), found)
        new = found[:n] if n else None
        return new, new

    def _claim(self, rows: np.ndarray) -> np.ndarray | None:
        """Marks those of the valid local ``rows`` not marked yet and returns them (None: none); the caller builds
        them, or clears their marks again (:meth:`_unclaim`) if it cannot. :attr:`count` is not changed."""
        if _FIRST_TOUCH is not None and rows.dtype == np.int64 and rows.ndim == 1:
            found = np.empty(rows.shape[0], dtype=np.int64)
            new = found[:_FIRST_TOUCH(self.marks, np.ascontiguousarray(rows), found)]
        else:
            missing = ~self.marks[rows]
            if not missing.any():
                return None
            new = np.unique(rows[missing])
            self.marks[new] = True
        return new if new.size else None

    def _unclaim(self, new: np.ndarray) -> None:
        self.marks[new] = False

    def _write_chunks(self, new: np.ndarray, value: np.ndarray, slots: Mapping[str, np.ndarray],
                      average: np.ndarray | None) -> None:
        step = self._chunk_rows
        for lo in range(0, new.size, step):
            self._write_initial(new[lo:lo + step], value, slots, average)

    def forget(self, rows: np.ndarray) -> None:
        """Marks local ``rows`` (built, distinct) not built again: their content no longer counts (a restore from a
        checkpoint that did not save them, where they hold their initial content); a later touch builds them."""
        self.marks[rows] = False
        self.count -= int(rows.size)

    def ensure_all(self, value: np.ndarray, slots: Mapping[str, np.ndarray], average: np.ndarray | None) -> None:
        """Materializes every row not yet marked, a chunk of rows at a time."""
        step = self._chunk_rows
        for lo in range(0, self.rows, step):
            missing = np.flatnonzero(~self.marks[lo:lo + step])
            if missing.size:
                self.ensure(missing + lo, value, slots, average)

    def mark(self, rows: np.ndarray | None) -> None:
        """Marks local ``rows`` (None: all; repeats allowed) materialized: their content was written whole from
        elsewhere (a restore, a replica's entry). Only the rows not marked before are counted (the C loop
        ``first_touch``, one pass; without it, sorted distinct rows as a push's, and other rows are recounted): a
        backup marks every push's rows, and recounting the whole partition's marks each time cost more than
        writing the rows (W&D's 52 tables)."""
        if rows is None:
            self.marks[:] = True
            self.count = self.rows
            return
        if _FIRST_TOUCH is not None and rows.dtype == np.int64 and rows.ndim == 1 and rows.flags.c_contiguous:
            # one C pass: marks each row not marked yet, once (repeats too), and counts them
            self.count += int(_FIRST_TOUCH(self.marks, rows, np.empty(rows.size, np.int64)))
            return
        if rows.size > 1 and not bool(np.all(rows[1:] > rows[:-1])):  # repeats possible: recount
            self.marks[rows] = True
            self.count = int(np.count_nonzero(self.marks))
            return
        marked = int(np.count_nonzero(self.marks[rows]))  # a push's rows come sorted and distinct
        if marked < rows.size:
            self.marks[rows] = True
            self.count += rows.size - marked

    def initial_copy(self, marks: np.ndarray, value: np.ndarray, slots: Mapping[str, np.ndarray],
                     average: np.ndarray | None) -> None:
        """Writes the initial content into the rows of copies ``value``/``slots``/``average`` that ``marks``
        (a copy of :attr:`marks` taken with them) leaves unmarked: the copies then hold what an eager
        partition holds. The partition itself is not touched; temporaries stay a chunk in size."""
        step = self._chunk_rows
        for lo in range(0, self.rows, step):
            missing = np.flatnonzero(~marks[lo:lo + step]) + lo
            if missing.size:
                self._write_initial(missing, value, slots, average)


def ensure_together(jobs: Sequence[tuple[LazyRows, np.ndarray, np.ndarray, Mapping[str, np.ndarray], np.ndarray | None]]
                    ) -> None:
    """:meth:`LazyRows.ensure` of each ``(lazy, rows, value, slots, average)`` of ``jobs`` (a partition may come
    twice; the caller holds every one's lock), the new rows of all the random ones computed in one
    :func:`~psflow.ps.initializers.initial_rows_many` call per dtype: the same content, bit for bit, as one
    :meth:`~LazyRows.ensure` per partition, for one call's numpy overhead instead of one per table (W&D's 26 deep
    tables gain a few dozen new rows each in a step). All or nothing: if building fails, every job's new rows
    are unmarked again and no count changes."""
    claimed: list[tuple[LazyRows, np.ndarray, np.ndarray, Mapping[str, np.ndarray], np.ndarray | None]] = []
    try:
        for lazy, rows, value, slots, average in jobs:
            new = lazy._claim(rows)
            if new is not None:
                claimed.append((lazy, new, value, slots, average))
        by_dtype: dict[str, list[tuple[LazyRows, np.ndarray, np.ndarray, Mapping[str, np.ndarray],
                                       np.ndarray | None]]] = {}
        for job in claimed:
            lazy, new, value, slots, average = job
            if lazy._constant_row is not None or new.size > lazy._chunk_rows:  # constant, or too many for one pass
                lazy._write_chunks(new, value, slots, average)
            else:
                by_dtype.setdefault(lazy.dtype, []).append(job)
        for dtype, group in by_dtype.items():
            built = initial_rows_many([(lazy.initializer, lazy.full_shape, new + lazy.row_start)
                                       for lazy, new, _, _, _ in group], dtype)
            for (lazy, new, value, slots, average), initial in zip(group, built, strict=True):
                lazy._write_built(new, initial, value, slots, average)
    except BaseException:
        for lazy, new, _, _, _ in claimed:
            lazy._unclaim(new)
        raise
    for lazy, new, _, _, _ in claimed:
        lazy.count += int(new.size)
