"""The id -> slot index of a dynamic table: an open-addressing hash table over two numpy arrays.

Two int64 arrays (keys, values) of a power-of-two number of buckets, at most
half full, so it costs 16 bytes per bucket and at most
:data:`INDEX_BYTES_PER_ROW` per live row once it has grown past
:data:`MIN_BUCKETS`. Not thread-safe (the table's lock covers it).

Its loops (find, touch, place, remove) exist twice: in C, in the ps kernels
extension ``psflow.ps._kernels`` (one pass per batch, the GIL released), and
vectorized with numpy here, used when the extension was not built or
``PSFLOW_NATIVE=0`` is set (:func:`psflow.native.loader.load_extension`). The
numpy loops cost a few dozen numpy calls per batch, which dominates small
batches (on this project's 2-core machine, finding 200 ids among 5,000 takes
~120 us in numpy, ~6 us in C; removing and re-inserting them ~600 us and
~17 us). Both keep the
same invariants on the same arrays, so either can work on an index the other
built, and :meth:`IdIndex.find` gives the same slots for the same content.
Which bucket holds an id may differ: the C loops place ids one at a time in
the first empty bucket from their home, the numpy loops a batch at a time
(ids that compete for a bucket end up in another order). Nothing outside the
index depends on buckets (the table passes :meth:`IdIndex.find`'s buckets
straight to :meth:`IdIndex.remove`).
"""

from __future__ import annotations

import numpy as np

from psflow.native.loader import load_extension
from psflow.placement.hashing import IdArray, mix64

__all__ = ["INDEX_BYTES_PER_ROW", "MIN_BUCKETS", "IdIndex", "buckets_for"]

# The index holds 16-byte buckets and doubles at half full, so it is at least a quarter full.
INDEX_BYTES_PER_ROW = 64
MIN_BUCKETS = 64
_WINDOW = 8  # buckets an index probe reads per round: one 64-byte line of keys, one of values
_MAX_WINDOW = 64
_EMPTY = -1  # an empty index bucket: ends a probe
_INDEX_SALT = np.uint64(0x5851F42D4C957F2D)

#: The C index loops (``psflow.ps._kernels.index_*``), or None: the numpy loops below are then used.
_KERNELS = load_extension("psflow.ps._kernels")
if _KERNELS is not None and not all(hasattr(_KERNELS, f"index_{n}") for n in ("find", "touch", "place", "remove")):
    # a build older than the index loops
    _KERNELS = None


class IdIndex:
    """id -> slot map: open addressing with linear probing over two int64 arrays, a C loop or numpy per batch.

    A bucket's value is a slot (>= 0) or _EMPTY. Invariants: the bucket count
    is a power of two; live entries fill at most half of it; no empty bucket
    lies between an id's home bucket and the bucket holding it. Removal keeps
    the last one without tombstones: it empties the buckets, then takes out and
    re-inserts every entry of the runs of full buckets that follow them
    (Knuth's deletion for linear probing, batched), so misses stay as cheap as
    in a fresh table and the index never needs a clean-up pass.
    """

    def __init__(self, buckets: int) -> None:
        self.rebuilds = 0
        self._allocate(buckets)

    def _allocate(self, buckets: int) -> None:
        self._keys = np.zeros(buckets, dtype=np.int64)
        self._vals = np.full(buckets, _EMPTY, dtype=np.int64)
        self._mask = buckets - 1
        self.live = 0

    @property
    def nbytes(self) -> int:
        return int(self._keys.nbytes + self._vals.nbytes)

    def clear(self, rows: int) -> None:
        self._allocate(buckets_for(rows))

    def _home(self, ids: IdArray) -> IdArray:
        return (mix64(ids.view(np.uint64) ^ _INDEX_SALT) & np.uint64(self._mask)).astype(np.int64)

    def _windows(self, pos: IdArray, width: int) -> IdArray:
        return (pos[:, None] + np.arange(width, dtype=np.int64)) & self._mask

    def find(self, ids: IdArray) -> tuple[IdArray, IdArray]:
        """(slot, bucket) of each id; -1 for both where the id is absent.

        numpy: probes the home bucket, then windows of buckets that double each
        round (8, 16, ... 64), so a long run costs few numpy rounds. A window
        holding an empty bucket and no hit ends the search.
        """
        if _KERNELS is not None:
            ids = np.ascontiguousarray(ids)
            slots, where = np.empty(ids.size, np.int64), np.empty(ids.size, np.int64)
            _KERNELS.index_find(self._keys, self._vals, ids, slots, where)
            return slots, where
        home = self._home(ids)
        vals = self._vals[home]  # one bucket first: most ids sit in their home bucket
        hit = (self._keys[home] == ids) & (vals >= 0)
        slots, where = np.where(hit, vals, -1), np.where(hit, home, -1)
        more = ~hit & (vals != _EMPTY)
        pending, pos, width = np.flatnonzero(more), (home[more] + 1) & self._mask, _WINDOW
        while pending.size:
            window = self._windows(pos, width)
            vals = self._vals[window]
            hit = (self._keys[window] == ids[pending][:, None]) & (vals >= 0)
            found = np.flatnonzero(hit.any(axis=1))
            column = hit[found].argmax(axis=1)
            slots[pending[found]] = vals[found, column]
            where[pending[found]] = window[found, column]
            more = ~(hit | (vals == _EMPTY)).any(axis=1)
            pending, pos = pending[more], (pos[more] + width) & self._mask
            width = min(2 * width, _MAX_WINDOW)
        return slots, where

    def touch(self, ids: IdArray, freq: IdArray, last: IdArray, step: int, *, lookup: bool) -> tuple[IdArray, int]:
        """Each id's slot (-1 where absent) and how many are absent; marks the rows found as used.

        ``ids`` are distinct. ``lookup``: a training lookup, ``freq[slot] += 1``
        and ``last[slot] = step``; else an update, ``last[slot] = max(last[slot],
        step)``. C: one pass over the ids (find and marks together); numpy:
        :meth:`find` and then the marks, with the same result.
        """
        if _KERNELS is not None:
            slots = np.empty(ids.size, np.int64)
            missing = _KERNELS.index_touch(self._keys, self._vals, np.ascontiguousarray(ids), slots, freq, last,
                                           int(step), lookup)
            return slots, int(missing)
        slots, _ = self.find(ids)
        found = slots[slots >= 0]
        if lookup:
            freq[found] += 1
            last[found] = step
        else:
            last[found] = np.maximum(last[found], step)
        return slots, int(ids.size - found.size)

    def insert(self, ids: IdArray, slots: IdArray) -> None:
        """Maps ``ids`` (distinct, none present) to ``slots``, doubling the buckets first where needed."""
        buckets = self._mask + 1
        if 2 * (self.live + ids.size) > buckets:
            keep = self._vals >= 0
            keys, vals = self._keys[keep], self._vals[keep]
            self._allocate(buckets_for(self.live + ids.size))
            self.rebuilds += 1
            self._place(keys, vals)
        self._place(ids, slots)

    def _place(self, ids: IdArray, slots: IdArray) -> None:
        """Puts each id in the first empty bucket from its home (room checked by the caller).

        C: one id at a time, in order. numpy: windows double each round (up to
        _MAX_WINDOW) for ids that found no empty bucket yet; an id that lost a
        bucket to another retries right after it.
        """
        if _KERNELS is not None:
            _KERNELS.index_place(self._keys, self._vals, np.ascontiguousarray(ids),
                                 np.ascontiguousarray(slots, np.int64))
            self.live += int(ids.size)
            return
        pos, pending, width = self._home(ids), np.arange(ids.size), _WINDOW
        while pending.size:
            window = self._windows(pos, width)
            free = self._vals[window] == _EMPTY
            has_free = free.any(axis=1)
            target = window[np.arange(pending.size), free.argmax(axis=1)]
            claimers = np.flatnonzero(has_free)
            claim_pos, claim_ids = target[claimers], ids[pending[claimers]]
            self._keys[claim_pos] = claim_ids  # several ids may claim one bucket: the one written wins
            won = claimers[self._keys[claim_pos] == claim_ids]
            self._vals[target[won]] = slots[pending[won]]
            keep = np.ones(pending.size, dtype=bool)
            keep[won] = False
            pos = np.where(has_free, target + 1, pos + width) & self._mask  # losers retry after their bucket
            pending, pos = pending[keep], pos[keep]
            width = min(2 * width, _MAX_WINDOW)
        self.live += int(ids.size)

    def remove(self, where: IdArray) -> None:
        """Removes the entries in buckets ``where`` (distinct, full); other entries may move."""
        if _KERNELS is not None:
            _KERNELS.index_remove(self._keys, self._vals, np.ascontiguousarray(where, np.int64))
            self.live -= int(where.size)
            return
        self._vals[where] = _EMPTY
        self.live -= int(where.size)
        run = self._runs_after(where)
        if run.size:
            keys, vals = self._keys[run], self._vals[run]
            self._vals[run] = _EMPTY
            self.live -= int(run.size)
            self._place(keys, vals)

    def _runs_after(self, where: IdArray) -> IdArray:
        """The full buckets from each of ``where`` (now empty) up to the next empty bucket; disjoint runs."""
        runs, pos = [], (where + 1) & self._mask
        while pos.size:
            window = self._windows(pos, _WINDOW)
            empty = self._vals[window] == _EMPTY
            ends = np.where(empty.any(axis=1), empty.argmax(axis=1), _WINDOW)
            runs.append(window[np.arange(_WINDOW) < ends[:, None]])
            pos = (pos[ends == _WINDOW] + _WINDOW) & self._mask
        return np.concatenate(runs) if runs else np.zeros(0, np.int64)


def buckets_for(rows: int) -> int:
    """The smallest power of two >= 2 * rows (and >= MIN_BUCKETS)."""
    return max(MIN_BUCKETS, 1 << max(0, 2 * rows - 1).bit_length())

