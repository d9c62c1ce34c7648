"""What queues on a primary for a joining member after its snapshot, what it weighs, and how much may.

A joining member's sender (:class:`~psflow.ps.replication.forwarder.BackupSender`) keeps every entry its member
has not acknowledged: its snapshot (a full entry), then each entry recorded since. :class:`JoinQueue` tallies
the entries after the snapshot and what they hold in this process's memory (:func:`held_bytes`), their peak,
and says when they passed the sender's :class:`QueueBound` (its owner then lets the member go:
:mod:`~psflow.ps.replication.joins`).

Guarantees:

* **An entry weighs what it holds.** :func:`held_bytes` counts an entry's arrays (their bytes, as
  :func:`~psflow.ps.replication.chunks.entry_bytes`, plus each array object) and its small state: the JSON-like
  tree every entry carries (the dedup table, the workers, the clock: 2-10 KB of Python objects at 2-32 workers,
  built for each entry), its containers walked (``sys.getsizeof``; its scalars are the shared names and ids
  of the tables it was read from). The recorded replies an entry shares with others are counted in each: it
  errs high, never low; tests/unit/ps/replication/test_join_queue.py checks it against tracemalloc (measured:
  2.4 KB of state an entry at 2 client processes, weighed 1.07x; 7.9 KB at 32, weighed 1.48x).
* **Weighed while a member joins only, and cheaply.** A sender whose member is a backup of the view (``weigh``
  False) counts arrays' bytes alone, as before. A joining member's tally walks an entry's state every
  ``_REWEIGH`` entries and reuses that weight between (its shape changes only when client processes come or
  go), and counts the objects around the arrays by a constant each: 47-85 us a W&D-sized entry (60 partitions;
  2-32 client processes), measured on 2 cores at a load of 20 (the walk of every entry cost 0.4-1.7 ms there).
* **Peaks are kept** (:meth:`JoinQueue.figures`): the join's log line, when its member caught up or was let go,
  says its snapshot's weight, how long it took and the most that queued after it.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from psflow.ps.protocol import PartDelta, ReplicaEntry

__all__ = ["JoinQueue", "QueueBound", "held_bytes", "state_bytes"]

#: What an array object costs beside its data (numpy's header; an array that owns its data).
_ARRAY = sys.getsizeof(np.empty(0, np.float32))
#: What a partition's delta costs beside its arrays: the object, its key, its dict of arrays (two of them).
_PART = (sys.getsizeof(PartDelta("x" * 8, None, {})) + sys.getsizeof("x" * 15)
         + sys.getsizeof({"value": None, "slots": None}))
#: A joining member's tally walks an entry's state every this many entries, and reuses that weight between: its
#: shape (what the walk counts) changes only when client processes come or go; the walk costs ~0.1 ms at 32.
_REWEIGH = 32


@dataclass(frozen=True)
class QueueBound:
    """How much may queue for a joining member after its snapshot (its sender's first entry) before it is let go:
    more than ``entries`` entries, or more bytes held (:func:`held_bytes`: arrays and each entry's state) than
    ``bytes`` or ``snapshots`` times the snapshot's, whichever is more (a big shard's snapshot travels longer,
    while pushes queue). A limit on the primary's memory, not on time."""

    entries: int
    bytes: int
    snapshots: float = 2.0

    def for_snapshot(self, snapshot_bytes: int) -> QueueBound:
        """This bound for a sender whose snapshot holds ``snapshot_bytes`` bytes: its bytes fixed."""
        return QueueBound(self.entries, max(self.bytes, int(self.snapshots * snapshot_bytes)), 0.0)

    def passed(self, entries: int, size: int) -> bool:
        return entries > self.entries or size > self.bytes

    def __str__(self) -> str:
        return f"{self.entries:,} entries or {self.bytes:,} bytes after its snapshot"


def held_bytes(entry: ReplicaEntry, arrays: int | None = None, state: int | None = None) -> int:
    """Bytes ``entry`` holds in this process: its arrays (``arrays``: their data's bytes, when known), its state
    (``state``: its weight, when known: :func:`state_bytes`) and the objects around them (the module docstring)."""
    objects = sys.getsizeof(entry) + sys.getsizeof(entry.parts) + _PART * len(entry.parts)
    data = 0
    for delta in entry.parts:
        objects += _ARRAY * (len(delta.arrays) + (delta.rows is not None))
        if arrays is None:
            data += (delta.rows.nbytes if delta.rows is not None else 0) + sum(a.nbytes for a in delta.arrays.values())
    weight = state_bytes(entry.state) if state is None else state
    return objects + weight + (data if arrays is None else arrays)


def state_bytes(state: object) -> int:
    """Bytes of an entry's state (its containers: :func:`_tree`)."""
    return _tree(state, set())


def _tree(obj: object, seen: set[int]) -> int:
    """Bytes of the containers of a JSON-like tree (dicts, lists, tuples; a dataclass by its fields): built for
    each entry. Its scalars are not counted: names, keys and ids are the shared objects of the tables the state
    was read from (a worker's name, its incarnation), so counting them made an entry of 32 processes' state
    weigh twice what tracemalloc measures."""
    if id(obj) in seen:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return _ARRAY + obj.nbytes
    if isinstance(obj, dict):
        return sys.getsizeof(obj) + sum(_tree(v, seen) for v in obj.values())
    if isinstance(obj, list | tuple | set | frozenset):
        return sys.getsizeof(obj) + sum(_tree(x, seen) for x in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sys.getsizeof(obj) + sum(_tree(getattr(obj, f.name), seen) for f in dataclasses.fields(obj))
    return 0


class JoinQueue:
    """The entries queued after a sender's first one (its snapshot) and their weight; the bound and the peaks.
    Not thread-safe: its sender's lock guards it."""

    def __init__(self, bound: QueueBound | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.bound = bound
        self._clock = clock
        self.started = clock()
        self.first: int | None = None  # the seq of the first entry (a Join's snapshot)
        self.snapshot = 0  # what it holds (bytes)
        self.entries, self.bytes = 0, 0  # after it
        self.peak_entries, self.peak_bytes = 0, 0
        #: When its member acknowledged the snapshot (seconds after :attr:`started`), and what was queued then.
        self.snapshot_acked: tuple[float, int, int] | None = None
        self._weighed, self._state = 0, 0  # entries weighed, and the state's weight last walked

    def add(self, entry: ReplicaEntry, arrays: int, weigh: bool) -> int:
        """Counts ``entry`` (``arrays``: its arrays' bytes); returns what it was counted for (give it back to
        :meth:`remove`): :func:`held_bytes` when ``weigh``, else ``arrays``. The first entry fixes the bound's
        bytes (:meth:`QueueBound.for_snapshot`)."""
        held = arrays
        if weigh:
            if self._weighed % _REWEIGH == 0:
                self._state = state_bytes(entry.state)
            self._weighed += 1
            held = held_bytes(entry, arrays, self._state)
        if self.first is None:
            self.first, self.snapshot = entry.seq, held
            if self.bound is not None:
                self.bound = self.bound.for_snapshot(held)
            return held
        self.entries += 1
        self.bytes += held
        self.peak_entries = max(self.peak_entries, self.entries)
        self.peak_bytes = max(self.peak_bytes, self.bytes)
        return held

    def remove(self, seq: int, held: int) -> None:
        """Entry ``seq``, counted for ``held`` bytes, was acknowledged."""
        if seq != self.first:
            self.entries -= 1
            self.bytes -= held
        elif self.snapshot_acked is None:
            self.snapshot_acked = (self._clock() - self.started, self.entries, self.bytes)

    def clear(self) -> None:
        self.entries, self.bytes = 0, 0

    def past_bound(self) -> str | None:
        """Why to let the member go when more than the bound is queued after the snapshot, else None."""
        if self.bound is None or not self.bound.passed(self.entries, self.bytes):
            return None
        return (f"{self.entries:,} entries ({self.bytes:,} bytes held) queued after its snapshot and not acknowledged, "
                f"past the bound of {self.bound} (it acknowledges slower than this primary records)")

    def figures(self) -> str:
        """The join so far, for its log line: time since its sender started, the snapshot, the peak after it."""
        acked = self.snapshot_acked
        return (f"{self._clock() - self.started:.1f} s since its sender started, from a snapshot of "
                f"{self.snapshot / 1e6:,.1f} MB; "
                + (f"it acknowledged the snapshot after {acked[0]:.1f} s, with {acked[1]:,} entries "
                   f"({acked[2] / 1e6:,.1f} MB) queued after it; " if acked is not None else "")
                + f"at most {self.peak_entries:,} entries ({self.peak_bytes / 1e6:,.1f} MB) queued after it"
                + (f", bound {self.bound}" if self.bound is not None else ""))
