"""One ps task's share of a dynamic table: rows keyed by id, with admission, eviction and checkpoints.

:class:`DynamicTable` holds its rows, optimizer slots and per-row metadata
(id, last use, lookup count, live flag) in preallocated numpy arrays, grown
geometrically up to its row limit; freed slots are reused. The guarantees are
those of the package docstring (:mod:`psflow.ps.dynamic`).

Replicated shards (:mod:`psflow.ps.replication`): :meth:`DynamicTable.take_changes` gives what changed
since its previous call -- the rows (values, slots, id, last use, lookup count) of every id a lookup admitted
or touched or an update wrote, and the ids removed -- and :meth:`DynamicTable.apply_changes` writes them on
a backup, which then holds the same rows, slots and metadata as the primary. Its first call (and the first
after a :meth:`DynamicTable.load`) returns the whole table and starts the record: a table that never
replicates records nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from psflow.placement.hashing import IdArray, check_ids
from psflow.ps.dynamic.eviction import eviction_keys, lowest, pick_victims
from psflow.ps.dynamic.id_index import MIN_BUCKETS, IdIndex, buckets_for
from psflow.ps.dynamic.rows import initial_rows, sum_by_id, unique_ids
from psflow.ps.dynamic.sizes import row_bytes
from psflow.ps.dynamic.sketch import CountMinSketch
from psflow.ps.dynamic.snapshots import COUNTED, check_counts, check_snapshot, counts_array
from psflow.ps.dynamic.spec import BoolArray, DynamicTableError, DynamicTableSpec, DynamicTableStats, FloatArray
from psflow.ps.optimizers import make_optimizer

__all__ = ["DynamicTable"]


class DynamicTable:
    """One ps task's share of a dynamic table: rows, slots, admission, eviction (see :mod:`psflow.ps.dynamic`).

    Every public method takes the table's lock, validates its arguments before
    touching state (a refused call changes nothing) and returns when done.
    """

    def __init__(self, spec: DynamicTableSpec) -> None:
        """Raises DynamicTableError: ``capacity_bytes`` cannot hold one row."""
        self.spec = spec
        self.name = spec.name
        self._lock = threading.Lock()
        self._optimizer = make_optimizer(spec.optimizer) if spec.optimizer is not None else None
        template = self._optimizer.create_slots(np.zeros((1, spec.dim), np.float32)) if self._optimizer else {}
        self._slot_names: tuple[str, ...] = self._optimizer.slot_names if self._optimizer else ()
        self._slot_init = {name: template[name][0].copy() for name in self._slot_names}
        self._state = {name: template[name] for name in (self._optimizer.state_names if self._optimizer else ())}
        self._row_limit = self._limit()
        self._sketch = (CountMinSketch(spec.sketch_width, spec.sketch_depth, seed=spec.seed)
                        if spec.admit_after is not None and spec.admit_after > 1 else None)
        self._admit_rng = np.random.default_rng([spec.seed, 1]) if spec.admit_probability is not None else None
        self._evict_rng = np.random.default_rng([spec.seed, 2])
        self._step = 0
        self._ttl_cursor = 0
        self._counts = dict.fromkeys(COUNTED, 0)
        self._index = IdIndex(buckets_for(min(spec.initial_rows, self._row_limit)))
        self._reset_rows(min(spec.initial_rows, self._row_limit))
        # (a replicated primary's) ids changed and removed since take_changes; None: not recording
        self._changed: list[IdArray] | None = None
        self._removed: list[IdArray] = []

    def _limit(self) -> int:
        limit = self.spec.capacity_rows if self.spec.capacity_rows is not None else 1 << 62
        if self.spec.capacity_bytes is not None:
            per_row = row_bytes(self.spec)
            if self.spec.capacity_bytes < per_row:
                raise DynamicTableError(f"dynamic table {self.name!r}: capacity_bytes {self.spec.capacity_bytes} "
                                        f"is less than one row ({per_row} bytes with slots, metadata and index)")
            limit = min(limit, self.spec.capacity_bytes // per_row)
        return limit

    def _reset_rows(self, size: int) -> None:
        """Empty storage for ``size`` rows (>= 1)."""
        dim = self.spec.dim
        self._values: FloatArray = np.zeros((size, dim), np.float32)
        self._slots: dict[str, FloatArray] = {name: np.zeros((size, dim), np.float32) for name in self._slot_names}
        self._ids: IdArray = np.zeros(size, np.int64)
        self._last: IdArray = np.zeros(size, np.int64)
        self._freq: IdArray = np.zeros(size, np.int64)
        self._live: BoolArray = np.zeros(size, bool)
        self._free: IdArray = np.zeros(size, np.int64)
        self._nfree = 0
        self._top = 0  # slots [0, top) were used at least once; the rest were never used

    # ---- public API --------------------------------------------------------
    def __len__(self) -> int:
        return self._index.live

    @property
    def step(self) -> int:
        """The latest global step the table has seen (lookups, updates, evictions)."""
        return self._step

    @property
    def row_limit(self) -> int:
        """The most rows this table holds (from capacity_rows and capacity_bytes; 2**62 without either)."""
        return self._row_limit

    def lookup(self, ids: IdArray, *, step: int | None = None, create: bool = True) -> tuple[FloatArray, BoolArray]:
        """Rows of ``ids``, and which ids have one.

        Args:
            ids: 1-D int64, any values, may repeat.
            step: the global step of this lookup (last use of the rows, for
                TTL and LRU); None: the latest step the table has seen.
            create: count the sighting, admit and create rows (training). False:
                only read (predict, export, eval): nothing changes, ids without
                a row read as zeros.

        Returns:
            ``(rows, found)``: float32 ``[len(ids), dim]`` (a new array; zeros
            where not found) and bool ``[len(ids)]``.

        Raises:
            DynamicTableError: ids not a 1-D int64 array, or a bad step.

        A creating lookup may evict other rows to make room (see the package
        docstring), never a row it returns.
        """
        check_ids(ids, f"dynamic table {self.name!r}: lookup")
        self._check_step(step)
        with self._lock:
            if step is not None:
                self._step = max(self._step, int(step))
            unique, inverse = unique_ids(ids)
            if create:
                # last use = the largest step seen, so never earlier than a row's last use
                slots, absent_rows = self._index.touch(unique, self._freq, self._last, self._step, lookup=True)
                if absent_rows:
                    missing = np.flatnonzero(slots < 0)
                    slots[missing] = self._admit(unique[missing], protect=slots[slots >= 0])
                if self._changed is not None:
                    self._changed.append(unique.copy())
            else:
                slots, _ = self._index.find(unique)
            per_id = slots if unique is ids else slots[inverse]
            has_row = per_id >= 0
            absent = ids.size - int(np.count_nonzero(has_row))
            rows: FloatArray = np.take(self._values, np.where(has_row, per_id, 0) if absent else per_id, axis=0)
            if absent:
                rows[~has_row] = 0.0
            self._counts["rejected_lookups" if create else "absent_reads"] += absent
        return rows, has_row

    def apply_gradients(self, ids: IdArray, grads: FloatArray, step: int) -> int:
        """Applies the optimizer to the rows of ``ids`` that exist; returns how many gradient rows it applied.

        Duplicate ids are summed first, in call order; gradients of ids
        without a row (not admitted, or evicted since the lookup) are dropped
        and counted; no row is created here. The rows' last use becomes at
        least ``step``, and a learning-rate schedule is read at ``step``.

        Raises:
            DynamicTableError: not trainable; ids not 1-D int64; grads not
                float32 ``[len(ids), dim]`` or not finite; a bad step. Nothing
                changes then.
        """
        where = f"dynamic table {self.name!r}: apply_gradients"
        check_ids(ids, where)
        self._check_step(step)
        self._check_grads(ids, grads, where)
        if self._optimizer is None:
            raise DynamicTableError(f"{where}: the table is not trainable (no optimizer)")
        with self._lock:
            self._step = max(self._step, int(step))
            unique, inverse = unique_ids(ids)
            slots, absent_rows = self._index.touch(unique, self._freq, self._last, int(step), lookup=False)
            per_id = slots if unique is ids else slots[inverse]
            applied = int(ids.size) if not absent_rows else int(np.count_nonzero(per_id >= 0))
            self._counts["dropped_gradients"] += int(ids.size) - applied
            rows, values = (per_id, grads) if unique.size == ids.size else (slots, sum_by_id(grads, inverse))
            if absent_rows:
                rows, values = rows[rows >= 0], values[rows >= 0]
            top = self._top
            if self._changed is not None:
                self._changed.append(self._ids[:top][self._live[:top]] if self._optimizer.sparse_touches_all_rows
                                     else unique.copy())
            slot_views = {name: array[:top] for name, array in self._slots.items()}
            # Distinct slots (one per distinct id), in the call's order: no sort needed to find duplicates.
            self._optimizer.apply_sparse(self._values[:top], {**slot_views, **self._state}, rows, values, distinct=True,
                                         step=int(step))
        return applied

    def evict(self, step: int, *, full: bool = False) -> int:
        """Drops rows last used before ``step - ttl_steps``; returns how many.

        ``step`` counts as the larger of it and the latest step the table saw.
        Scans at most ``ttl_scan_rows`` slots from where the previous call
        stopped (all of them with ``full``), so a sweep of the whole table takes
        ``ceil(slots / ttl_scan_rows)`` calls. No-op without ``ttl_steps``.

        Raises:
            DynamicTableError: a bad step.
        """
        self._check_step(step)
        with self._lock:
            self._step = max(self._step, int(step))
            if self.spec.ttl_steps is None or self._top == 0:
                return 0
            lo = 0 if full or self._ttl_cursor >= self._top else self._ttl_cursor
            hi = self._top if full else min(self._top, lo + self.spec.ttl_scan_rows)
            stale = self._live[lo:hi] & (self._last[lo:hi] < self._step - self.spec.ttl_steps)
            victims = np.flatnonzero(stale) + lo
            self._ttl_cursor = 0 if hi >= self._top else hi
            self._drop(victims)
            self._counts["evicted_ttl"] += int(victims.size)
            return int(victims.size)

    def memory_bytes(self) -> int:
        """Exact bytes of the table's numpy arrays: rows, slots, metadata, free list, index, sketch, state."""
        with self._lock:
            return self._memory_bytes()

    def overhead_bytes(self) -> int:
        """What :meth:`memory_bytes` may exceed ``capacity_bytes`` by: sketch, 0-d state, the index's minimum."""
        sketch = self._sketch.nbytes if self._sketch is not None else 0
        return sketch + sum(int(a.nbytes) for a in self._state.values()) + 16 * MIN_BUCKETS

    def stats(self) -> DynamicTableStats:
        """A consistent copy of the counters, row count and memory."""
        with self._lock:
            return DynamicTableStats(
                rows=self._index.live, row_limit=self._row_limit, index_rebuilds=self._index.rebuilds,
                memory_bytes=self._memory_bytes(), sketch_bytes=self._sketch.nbytes if self._sketch else 0,
                **self._counts)

    def admission_sketch(self) -> CountMinSketch | None:
        """The sketch behind ``admit_after`` (None without it); read it under no other guarantee."""
        return self._sketch

    # ---- checkpoints -------------------------------------------------------
    def snapshot(self, *, counts: bool = False) -> dict[str, np.ndarray]:
        """Every row, sorted by id: a consistent copy taken under the lock.

        Returns:
            ``ids`` int64 [n], ``values`` float32 [n, dim], ``slot/NAME`` float32
            [n, dim] per optimizer slot, ``state/NAME`` float32 0-d (Adam's beta
            powers), ``last_step`` and ``frequency`` int64 [n], ``step`` int64 0-d
            (the latest step the table saw); with ``counts`` (a checkpoint's, a replica's), also the counters,
            :meth:`take_changes`' ``counts``.
        """
        with self._lock:
            return self._snapshot(counts)

    def _snapshot(self, counts: bool = False) -> dict[str, np.ndarray]:
        slots = np.flatnonzero(self._live[:self._top])
        slots = slots[np.argsort(self._ids[slots], kind="stable")]
        out: dict[str, np.ndarray] = {"ids": self._ids[slots], "values": self._values[slots],
                                      "last_step": self._last[slots], "frequency": self._freq[slots],
                                      "step": np.array(self._step, np.int64)}
        out.update({f"slot/{name}": array[slots] for name, array in self._slots.items()})
        out.update({f"state/{name}": array.copy() for name, array in self._state.items()})
        return {**out, "counts": counts_array(self._counts)} if counts else out

    def check_snapshot(self, arrays: Mapping[str, np.ndarray]) -> int:
        """The row count of ``arrays`` if :meth:`load` would take it; changes nothing.

        Raises:
            DynamicTableError: as :meth:`load`.
        """
        return check_snapshot(arrays, name=self.name, dim=self.spec.dim, slot_names=self._slot_names,
                              state_names=self._state)

    def load(self, arrays: Mapping[str, np.ndarray]) -> int:
        """Replaces every row with those of a :meth:`snapshot`; returns how many it evicted to fit.

        Rows beyond the row limit are evicted by policy (exactly, not sampled)
        and counted. The counters become the snapshot's ``counts`` where it has
        them (a checkpoint's), else they stay; the admission sketch and the generators stay.

        Raises:
            DynamicTableError: keys, dtypes or shapes differ from this table's
                snapshot, or ids are not strictly increasing. Nothing changes then.
        """
        n = check_snapshot(arrays, name=self.name, dim=self.spec.dim, slot_names=self._slot_names,
                           state_names=self._state)
        with self._lock:
            self._changed, self._removed = None, []  # a replicated primary sends the whole table next
            keep = np.arange(n)
            if n > self._row_limit:
                keys = eviction_keys(arrays["frequency"], arrays["last_step"], self.spec.policy)
                keep = np.sort(lowest(keys, n - self._row_limit, complement=True))
            size = max(keep.size, min(self.spec.initial_rows, self._row_limit))
            self._reset_rows(size)
            used = slice(0, keep.size)
            self._values[used], self._ids[used] = arrays["values"][keep], arrays["ids"][keep]
            self._last[used], self._freq[used] = arrays["last_step"][keep], arrays["frequency"][keep]
            for name, array in self._slots.items():
                array[used] = arrays[f"slot/{name}"][keep]
            for name, array in self._state.items():
                array[...] = arrays[f"state/{name}"]
            self._live[used] = True
            self._top = keep.size
            self._index.clear(keep.size)
            self._index.insert(self._ids[used], np.arange(keep.size, dtype=np.int64))
            self._step = max(self._step, int(arrays["step"]))
            self._ttl_cursor = 0
            if "counts" in arrays:
                self._counts = check_counts(arrays["counts"], self.name)
            self._counts["evicted_capacity"] += n - keep.size
            return n - int(keep.size)

    # ---- replicated shards -------------------------------------------------
    def take_changes(self) -> tuple[bool, dict[str, np.ndarray]]:
        """What changed since the previous call, read under the lock: ``(False, changes)``, or ``(True, whole)``
        (a :meth:`snapshot`) on the first call and the first after :meth:`load`, which start the record.

        ``changes``: ``ids`` (int64, sorted) with their ``values``, ``slot/NAME``, ``last_step`` and
        ``frequency`` as they are now; ``removed``, the ids evicted since and not admitted again; ``step``
        and ``state/NAME`` as in a snapshot. Both carry ``counts``: :meth:`stats`' counters now (int64, ``COUNTED``'s order).
        """
        with self._lock:
            if self._changed is None:
                self._changed, self._removed = [], []
                return True, self._snapshot(counts=True)
            changed = np.unique(np.concatenate(self._changed)) if self._changed else np.zeros(0, np.int64)
            removed = np.unique(np.concatenate(self._removed)) if self._removed else np.zeros(0, np.int64)
            self._changed, self._removed = [], []
            slots, _ = self._index.find(changed)
            present = slots >= 0
            slots = slots[present]
            if removed.size:
                removed = removed[self._index.find(removed)[0] < 0]
            out: dict[str, np.ndarray] = {"ids": changed[present], "values": self._values[slots],
                                          "last_step": self._last[slots], "frequency": self._freq[slots],
                                          "removed": removed, "step": np.array(self._step, np.int64)}
            out.update({f"slot/{name}": array[slots] for name, array in self._slots.items()})
            out.update({f"state/{name}": array.copy() for name, array in self._state.items()}, counts=counts_array(self._counts))
            return False, out

    def apply_changes(self, changes: Mapping[str, np.ndarray]) -> None:
        """Writes a :meth:`take_changes` of the primary's table: drops ``removed``, then writes the rows of
        ``ids`` (creating those it lacks, with no admission or eviction), ``step`` and the state.

        Raises:
            DynamicTableError: an array is missing or does not fit this table (names it); nothing changes then.
        """
        ids = changes.get("ids")
        names = ["values", "last_step", "frequency", "removed", "step", *(f"slot/{n}" for n in self._slot_names),
                 *(f"state/{n}" for n in self._state)]
        missing = [n for n in names if n not in changes]
        if ids is None or missing:
            raise DynamicTableError(f"dynamic table {self.name!r}: replicated rows lack {missing or ['ids']}")
        check_ids(ids, f"dynamic table {self.name!r}: replicated rows")
        rows = (ids.size, self.spec.dim)
        for name in ["values", *(f"slot/{n}" for n in self._slot_names)]:
            if changes[name].shape != rows or changes[name].dtype != np.float32:
                raise DynamicTableError(f"dynamic table {self.name!r}: replicated {name} has shape "
                                        f"{changes[name].shape} ({changes[name].dtype}), want float32 {rows}")
        with self._lock:
            self._changed, self._removed = None, []
            removed = changes["removed"]
            if removed.size:
                gone, _ = self._index.find(removed)
                self._drop(gone[gone >= 0])
            slots, _ = self._index.find(ids)
            new = slots < 0
            if new.any():
                slots[new] = self._allocate(ids[new])
            self._values[slots] = changes["values"]
            for name, array in self._slots.items():
                array[slots] = changes[f"slot/{name}"]
            self._last[slots], self._freq[slots] = changes["last_step"], changes["frequency"]
            for name, array in self._state.items():
                array[...] = changes[f"state/{name}"]
            self._step = int(changes["step"])

    def set_counts(self, counts: Mapping[str, int]) -> None:
        """Sets :meth:`stats`' counters (a backup: the primary's, carried by each change as ``counts``)."""
        with self._lock:
            self._counts.update(counts)

    @classmethod
    def restore(cls, spec: DynamicTableSpec, arrays: Mapping[str, np.ndarray]) -> DynamicTable:
        """A new table of ``spec`` holding the rows of ``arrays`` (see :meth:`load`)."""
        table = cls(spec)
        table.load(arrays)
        return table

    # ---- internals (called with the lock held) --------------------------------
    def _memory_bytes(self) -> int:
        arrays: list[npt.NDArray[Any]] = [self._values, self._ids, self._last, self._freq, self._live, self._free,
                                          *self._slots.values(), *self._state.values()]
        sketch = self._sketch.nbytes if self._sketch is not None else 0
        return sum(int(a.nbytes) for a in arrays) + self._index.nbytes + sketch

    def _check_step(self, step: object) -> None:
        if step is not None and (isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0):
            raise DynamicTableError(f"dynamic table {self.name!r}: step must be an int >= 0, got {step!r}")

    def _check_grads(self, ids: IdArray, grads: object, where: str) -> None:
        want = (ids.size, self.spec.dim)
        if not isinstance(grads, np.ndarray) or grads.dtype != np.float32 or grads.shape != want:
            kind = f"{grads.dtype} {grads.shape}" if isinstance(grads, np.ndarray) else type(grads).__name__
            raise DynamicTableError(f"{where}: gradients must be float32 {want} (table dim {self.spec.dim}), got {kind}")
        if not np.isfinite(grads).all():
            bad = np.flatnonzero(~np.isfinite(grads).all(axis=1))
            raise DynamicTableError(f"{where}: {bad.size} gradient rows are not finite (first: id {int(ids[bad[0]])}); "
                                    "nothing was applied")

    def _admit(self, missing: IdArray, protect: IdArray) -> IdArray:
        """Slots for ``missing`` (distinct ids without rows): new rows for the admitted, -1 for the rest."""
        if self._sketch is not None:
            admit = self._sketch.add(missing) >= int(self.spec.admit_after or 1)
        elif self._admit_rng is not None:
            admit = self._admit_rng.random(missing.size) < float(self.spec.admit_probability or 1.0)
        else:
            admit = np.ones(missing.size, bool)
        chosen = np.flatnonzero(admit)
        chosen = chosen[:self._make_room(chosen.size, protect)]
        out = np.full(missing.size, -1, np.int64)
        if chosen.size:
            out[chosen] = self._create(missing[chosen])
            self._counts["admitted"] += int(chosen.size)
        return out

    def _make_room(self, wanted: int, protect: IdArray) -> int:
        """Evicts rows (not ``protect``) so ``wanted`` more fit under the limit; returns how many fit."""
        excess = self._index.live + wanted - self._row_limit
        if excess > 0:
            victims = pick_victims(excess, protect, live=self._live, freq=self._freq, last=self._last, top=self._top,
                                   rows=self._index.live, spec=self.spec, rng=self._evict_rng)
            self._drop(victims)
            self._counts["evicted_capacity"] += int(victims.size)
        return min(wanted, self._row_limit - self._index.live)

    def _create(self, ids: IdArray) -> IdArray:
        """New rows for ``ids`` (distinct, absent, room checked); returns their slots."""
        slots = self._allocate(ids)
        self._values[slots] = initial_rows(self.spec.initializer, ids, self.spec.dim)
        for name, array in self._slots.items():
            array[slots] = self._slot_init[name]
        self._freq[slots] = 1
        self._last[slots] = self._step
        return slots

    def _allocate(self, ids: IdArray) -> IdArray:
        """Slots for ``ids`` (distinct, absent), live and indexed, their values and slots not yet written."""
        take = min(self._nfree, ids.size)
        reused = self._free[self._nfree - take:self._nfree].copy()
        self._nfree -= take
        fresh = ids.size - take
        self._grow(self._top + fresh)
        slots = np.concatenate([reused, np.arange(self._top, self._top + fresh, dtype=np.int64)])
        self._top += fresh
        self._ids[slots] = ids
        self._live[slots] = True
        self._index.insert(ids, slots)
        return slots

    def _grow(self, needed: int) -> None:
        """Grows storage (x2, capped at the row limit) to at least ``needed`` slots."""
        size = self._ids.size
        if needed <= size:
            return
        new_size = max(needed, min(2 * size, self._row_limit))
        top, nfree = self._top, self._nfree

        def grown(old: npt.NDArray[Any], used: int) -> npt.NDArray[Any]:
            new = np.zeros((new_size, *old.shape[1:]), old.dtype)
            new[:used] = old[:used]
            return new

        self._values = grown(self._values, top)
        self._slots = {name: grown(array, top) for name, array in self._slots.items()}
        self._ids, self._last, self._freq = grown(self._ids, top), grown(self._last, top), grown(self._freq, top)
        self._live, self._free = grown(self._live, top), grown(self._free, nfree)

    def _drop(self, slots: IdArray) -> None:
        """Removes the rows in ``slots`` (distinct, live) and frees their slots."""
        if not slots.size:
            return
        if self._changed is not None:
            self._removed.append(self._ids[slots].copy())
        _, where = self._index.find(self._ids[slots])
        self._index.remove(where)
        self._live[slots] = False
        self._free[self._nfree:self._nfree + slots.size] = slots
        self._nfree += int(slots.size)

