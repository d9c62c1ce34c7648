"""The variable store of one ps task: partitions, their optimizer slots, locks.

Guarantees:
    * Each partition has its own lock; a pull or an update of a partition sees
      or makes a whole update, never half of one. Different partitions are
      updated independently (asynchronous, Hogwild-style across partitions).
    * Every validation happens before any partition is touched, so a refused
      request changes nothing.
    * Optimizer state lives in numpy arrays beside the variable (``slots``), so
      a checkpoint can save and restore it.
    * A dynamic table's share (:mod:`psflow.ps.dynamic`) is a partition whose
      ``table`` holds its rows (keyed by id) and slots; ``value`` is then an
      empty ``[0, dim]`` placeholder. Its rows are read by id (a training pull
      creates admitted rows), updated sparsely, never densely or whole.
    * A large static partition is lazy (:mod:`psflow.ps.lazy_rows`): created in
      O(1), its rows built on first touch. :meth:`ParameterStore.read`,
      :meth:`~ParameterStore.apply_sparse` and :meth:`~ParameterStore.apply_dense`
      materialize the rows they touch first (whole reads and dense updates: every
      row), so every value they read or return is the one an eager partition has.
    * Every static partition has row marks (:mod:`psflow.ps.row_marks`): the
      apply paths stamp the rows they change, so a checkpoint can hold only the
      rows changed since a previous one (an incremental checkpoint).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from psflow.errors import StoreError  # defined below the ps: placement's owner_of raises its subclass
from psflow.native.ids import scan_ids
from psflow.native.loader import load_extension
from psflow.ps.initializers import initial_value, validate_initializer
from psflow.ps.lazy_rows import LazyRows, ensure_together, lazy_eligible, unbuilt_array
from psflow.ps.memory import exclude_from_fork
from psflow.ps.optimizers import Optimizer
from psflow.ps.row_marks import MarkClock, RowMarks

#: The C row gather (``psflow.ps._kernels.gather``), or None: numpy's fancy indexing then.
_GATHER = getattr(load_extension("psflow.ps._kernels"), "gather", None)

if TYPE_CHECKING:
    from psflow.ps.dynamic.table import DynamicTable

__all__ = ["PartitionState", "ParameterStore", "partition_key", "StoreError"]


#: What :meth:`ParameterStore.materialize_together` returns when it builds nothing.
_NONE_BUILT: frozenset[str] = frozenset()


def partition_key(var_name: str, index: int) -> str:
    """The name a partition has on the wire and in the store: ``w/part_0``."""
    return f"{var_name}/part_{index}"


@dataclass
class PartitionState:
    """One partition of a variable, held by this ps task."""

    var_name: str
    index: int
    row_start: int
    value: np.ndarray
    optimizer: Optimizer | None
    slots: dict[str, np.ndarray]
    lock: threading.Lock = field(default_factory=threading.Lock)
    table: DynamicTable | None = None  # a dynamic table's share (value is then an empty [0, dim] placeholder)
    # The moving average (shadow) of the value and its decay, when the variable is averaged (psflow.ps.averages).
    average: np.ndarray | None = None
    average_decay: float | None = None
    # The rows not built yet of a lazy partition (psflow.ps.lazy_rows); None: every row is (an eager one).
    lazy: LazyRows | None = None
    # Which rows changed since a checkpoint (psflow.ps.row_marks); None: a dynamic table's share (saved whole).
    marks: RowMarks | None = None
    key: str = field(init=False)  # partition_key(var_name, index), computed once (it names every request entry)

    def __post_init__(self) -> None:
        self.key = partition_key(self.var_name, self.index)

    def materialize(self, rows: np.ndarray | None, *, changed: RowMarks | None = None) -> bool:
        """Builds the initial content of those of the valid local ``rows`` (None: every row) not built yet;
        a no-op on an eager partition. The caller holds :attr:`lock`.

        ``changed`` (with ``rows``): the row marks to stamp ``rows`` into, as the caller is about to change
        them (:meth:`LazyRows.ensure`: in the pass that finds the new rows).

        Returns:
            Whether ``rows`` were stamped into ``changed`` (False on an eager partition: the caller stamps them).
        """
        lazy = self.lazy
        if lazy is None:
            return False
        if rows is None:
            lazy.ensure_all(self.value, self.slots, self.average)
        else:
            lazy.ensure(rows, self.value, self.slots, self.average, changed=changed)
        if lazy.complete:
            self.lazy = None  # every row built: the checks are gone
        return rows is not None and changed is not None

    @property
    def describe(self) -> str:
        if self.table is not None:
            return f"dynamic table {self.var_name!r} partition {self.index}"
        rows = self.value.shape[0]
        return f"variable {self.var_name!r} partition {self.index} (rows {self.row_start}-{self.row_start + rows - 1})"


class ParameterStore:
    """The partitions one ps task holds, by key."""

    def __init__(self) -> None:
        self._parts: dict[str, PartitionState] = {}
        #: This store's mark token and epoch (a fresh store, a fresh token: see psflow.ps.row_marks).
        self.marks = MarkClock()

    def __contains__(self, key: str) -> bool:
        return key in self._parts

    def keys(self) -> list[str]:
        return list(self._parts)

    def create(
        self,
        var_name: str,
        index: int,
        full_shape: tuple[int, ...],
        row_start: int,
        row_stop: int,
        dtype: str,
        initializer: dict[str, object],
        optimizer: Optimizer | None,
        *,
        average_decay: float | None = None,
    ) -> PartitionState:
        """Creates a partition from its initializer; the caller serializes creation. ``average_decay``: keep a
        moving average of it (:mod:`psflow.ps.averages`), starting at the initial value. A large partition
        is created lazily (:func:`~psflow.ps.lazy_rows.lazy_eligible`): zero-filled arrays the OS commits on
        first write, in small pages (:func:`~psflow.ps.lazy_rows.unbuilt_array`), rows built on first touch."""
        shape = (row_stop - row_start, *full_shape[1:])
        lazy: LazyRows | None = None
        if lazy_eligible(shape, dtype, optimizer):
            validate_initializer(initializer)  # a bad spec is refused at creation, as an eager one is
            lazy = LazyRows(dict(initializer), tuple(full_shape), row_start, shape[0], dtype, optimizer)
            value = unbuilt_array(shape, dtype)
            slots = optimizer.create_slots(value[:0]) if optimizer is not None else {}
            for name in (optimizer.slot_names if optimizer is not None else ()):
                slots[name] = unbuilt_array(shape, slots[name].dtype)
            average = unbuilt_array(shape, dtype) if average_decay is not None else None
        else:
            value = initial_value(initializer, full_shape, row_start, row_stop, dtype)
            slots = optimizer.create_slots(value) if optimizer is not None else {}
            average = value.copy() if average_decay is not None else None
        for array in (value, *slots.values(), *(() if average is None else (average,))):
            exclude_from_fork(array)  # a forked input reader would split their huge pages (psflow.ps.memory)
        state = PartitionState(var_name, index, row_start, value, optimizer, slots, average=average,
                               average_decay=average_decay, lazy=lazy,
                               marks=RowMarks(self.marks, shape[0] if value.ndim else 1,
                                              whole=value.ndim == 0 or average is not None))
        self._parts[state.key] = state
        return state

    def create_dynamic(self, table: DynamicTable, index: int, optimizer: Optimizer | None) -> PartitionState:
        """Adds a dynamic table's share as partition ``index`` of its variable; the caller serializes creation."""
        placeholder = np.zeros((0, table.spec.dim), dtype=np.float32)
        state = PartitionState(table.name, index, 0, placeholder, optimizer, {}, table=table)
        self._parts[state.key] = state
        return state

    def get(self, key: str) -> PartitionState:
        """Returns the partition.

        Raises:
            StoreError: no such partition on this task.
        """
        part = self._parts.get(key)
        if part is None:
            raise StoreError(f"unknown variable partition {key!r}")
        return part

    # ---- validation (no state touched) ------------------------------------
    def check_rows(self, part: PartitionState, rows: np.ndarray, what: str) -> None:
        """Raises StoreError unless ``rows`` is a 1-D int64 array of valid local rows."""
        if rows.dtype != np.int64 or rows.ndim != 1:
            raise StoreError(f"{part.describe}: {what} must be a 1-D int64 array, got {rows.dtype} of shape {rows.shape}")
        if part.table is not None:
            return  # any id
        n = part.value.shape[0]
        first, _ = scan_ids(rows, n)
        if first >= 0:
            bad = rows[first]
            raise StoreError(f"{part.describe}: {what} {int(bad)} out of range (partition has {n} rows)")

    def check_dense(self, part: PartitionState, grad: np.ndarray) -> None:
        if part.optimizer is None:
            raise StoreError(f"{part.describe} is not trainable")
        if part.table is not None:
            raise StoreError(f"{part.describe} is updated by ids only (a sparse gradient), not densely")
        if grad.dtype != part.value.dtype or grad.shape != part.value.shape:
            raise StoreError(
                f"{part.describe} has shape {part.value.shape} ({part.value.dtype}); "
                f"pushed gradient has {grad.shape} ({grad.dtype})"
            )

    def check_sparse(self, part: PartitionState, rows: np.ndarray, values: np.ndarray) -> None:
        if part.optimizer is None:
            raise StoreError(f"{part.describe} is not trainable")
        self.check_rows(part, rows, "gradient row")
        want = (rows.shape[0], *part.value.shape[1:])
        if values.dtype != part.value.dtype or values.shape != want:
            raise StoreError(
                f"{part.describe}: sparse gradient for {rows.shape[0]} rows must have shape {want} "
                f"({part.value.dtype}); got {values.shape} ({values.dtype})"
            )
        if part.table is not None and values.size and not bool(np.isfinite(values).all()):
            bad = int(np.flatnonzero(~np.isfinite(values).all(axis=1))[0])
            raise StoreError(f"{part.describe}: the gradient of id {int(rows[bad])} is not finite")

    # ---- data path ---------------------------------------------------------
    @staticmethod
    def read(part: PartitionState, rows: np.ndarray | None, *, step: int | None = None, create: bool = False,
             average: bool = False, built: bool = False) -> np.ndarray:
        """A copy of the whole partition or of ``rows`` (validated by the caller).

        ``built``: the caller knows every one of ``rows`` is built (:meth:`materialize_together` named the
        partition, and a built row never becomes unbuilt again): the pass that would look for new rows is skipped.

        A dynamic table's share: the rows of the ids ``rows`` (zeros for ids
        without one), as of global step ``step``; ``create``: a training
        lookup, which counts the sighting and creates admitted rows.
        ``average``: read the partition's moving average where it has one
        (evaluation with moving averages), else its value.
        """
        if part.table is not None:
            if rows is None:
                raise StoreError(f"{part.describe} is read by ids, never whole")
            return part.table.lookup(rows, step=step, create=create)[0]
        with part.lock:
            if not built:
                part.materialize(rows)
            value: np.ndarray = part.average if average and part.average is not None else part.value
            if rows is None:
                return value.copy()
            out: np.ndarray
            if _GATHER is not None and value.ndim >= 1 and value.flags.c_contiguous:
                # One C loop holding the GIL: numpy's gather releases it for each table, and the ps's
                # threads answering two workers then hand it back and forth (~2x the read time in sync mode).
                out = np.empty((rows.shape[0], *value.shape[1:]), dtype=value.dtype)
                _GATHER(value, rows, out)
            elif value.ndim == 2 and value.shape[1] == 1 and value.flags.c_contiguous:
                # [n, 1] tables: a 1-d gather is ~30 % cheaper than [k, 1] fancy indexing; same values.
                out = value.reshape(-1)[rows].reshape(-1, 1)
            else:
                out = value[rows]
            return out

    @staticmethod
    def materialize_together(wanted: Sequence[tuple[PartitionState, np.ndarray | None]]) -> frozenset[str]:
        """Builds, in one pass (:func:`~psflow.ps.lazy_rows.ensure_together`), the rows not built yet that the
        reads of ``wanted`` (partition, valid local rows or None) will touch, for the lazy partitions among
        them whose lock is free: what the reads then find is built (the same content they would build one
        partition at a time). Never waits: a lock another thread holds is skipped (that partition's read builds
        its rows itself), so holding the others cannot deadlock. A partition ``wanted`` also reads whole is left
        to that read (it builds every row). Fewer than two lazy partitions: nothing to gain, nothing done.
        Blocks the partitions' other users for the build's duration.

        Returns:
            The keys of the partitions whose rows in ``wanted`` are all built now (a read of them may pass
            ``built=True``).
        """
        whole = {id(part) for part, rows in wanted if rows is None}
        by_rows = [(part, rows) for part, rows in wanted
                   if rows is not None and part.lazy is not None and id(part) not in whole]
        if len(by_rows) < 2:
            return _NONE_BUILT
        held: dict[int, PartitionState] = {}  # by id(): a partition named twice is locked once, built for both
        try:
            jobs = []
            for part, rows in by_rows:
                if id(part) not in held:
                    if not part.lock.acquire(blocking=False):
                        continue
                    held[id(part)] = part
                lazy = part.lazy  # read again under the lock
                if lazy is not None:
                    jobs.append((lazy, rows, part.value, part.slots, part.average))
            ensure_together(jobs)
            for part in held.values():
                if part.lazy is not None and part.lazy.complete:
                    part.lazy = None  # every row built: the checks are gone
            return frozenset(part.key for part in held.values())
        finally:
            for part in held.values():
                part.lock.release()

    @staticmethod
    def apply_dense(part: PartitionState, grad: np.ndarray, *, step: int | None = None) -> None:
        """Applies the optimizer to the whole partition at global step ``step`` (read before the step's
        increment: a learning-rate schedule's step; None only where the rate is a constant)."""
        if part.optimizer is None:  # pragma: no cover - checked before
            raise StoreError(f"{part.describe} is not trainable")
        with part.lock:  # grad was validated on arrival (check_dense); the slots are the optimizer's own
            part.materialize(None)
            part.optimizer.apply_dense(part.value, part.slots, grad, checked=True, step=step)
            if part.marks is not None:
                part.marks.mark(None)

    @staticmethod
    def apply_sparse(part: PartitionState, rows: np.ndarray, values: np.ndarray, *, step: int | None = None) -> None:
        """Applies the optimizer to ``rows`` at global step ``step`` (as :meth:`apply_dense`; a dynamic
        table: to the ids that have a row, as of ``step``; None: the latest step the table saw)."""
        if part.optimizer is None:  # pragma: no cover - checked before
            raise StoreError(f"{part.describe} is not trainable")
        if part.table is not None:
            part.table.apply_gradients(rows, values, part.table.step if step is None else step)
            return
        with part.lock:  # rows and values were validated on arrival (check_sparse); the slots are the optimizer's own
            every_row = part.optimizer.sparse_touches_all_rows  # (such an optimizer's partitions are never lazy)
            # A lazy partition's rows are stamped changed in the pass that finds the new ones (built first):
            # before the update, so an update that raised leaves built rows marked changed, which an
            # incremental checkpoint then saves as they are (harmless).
            stamped = part.materialize(rows, changed=None if every_row else part.marks)
            part.optimizer.apply_sparse(part.value, part.slots, rows, values, checked=True, step=step)
            if part.marks is not None and not stamped:
                part.marks.mark(None if every_row else rows)

    def parameter_bytes(self) -> int:
        """Bytes of variables plus optimizer slots (and moving averages) held by this task."""
        return sum(p.table.memory_bytes() if p.table is not None else p.value.nbytes + sum(s.nbytes for s in p.slots.values())
                   + (p.average.nbytes if p.average is not None else 0) for p in self._parts.values())

    def partitions(self) -> Sequence[PartitionState]:
        return list(self._parts.values())
