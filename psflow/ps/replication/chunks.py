"""Entries bigger than one message: split into chunks on the primary, joined into one entry on a backup.

The carriers refuse a message over :data:`psflow.rpc.api.MAX_MESSAGE_BYTES` (512 MiB). A full entry -- the
snapshot a joining member starts from, LoadShard's entry after a checkpoint restore -- holds every partition
whole with its slots: about 520 MB for a W&D-sized shard. :func:`split` cuts an entry whose arrays exceed
``limit`` bytes into chunks of at most ``limit`` bytes of arrays each (by partition and array, and by row
range within an array bigger than ``limit``); the primary sends them one Replicate call each, in order
(:class:`~psflow.ps.replication.forwarder.BackupSender`). :class:`ChunkAssembler` on the backup puts the
pieces back into arrays of the original shape and hands the applier ONE entry, equal to the one split, once
every chunk arrived; so the member acknowledges the entry's seq only then.

Wire form: chunk ``i`` of ``n`` is a :class:`~psflow.ps.protocol.ReplicaEntry` of the entry's seq (not
``full``) whose state is ``{"chunk": {"index": i, "count": n, "pieces": [...]}}``; chunk 0's also says what
the whole entry is (``"entry"``: its state, ``full``, its partitions and their array names). Piece ``j`` of a
chunk is its part ``j``: ``[part, name, start, shape, dtype]`` (rows ``start`` on of array ``name`` of the
entry's partition ``part``; ``name`` None: the partition's delta whole, rows and all).

Guarantees: chunk 0 starts a new assembly (a resend from the start replaces what was held); a chunk of an
assembly this member does not hold (it restarted, or lost chunk 0) is dropped, and the primary, whose last
chunk was then not acknowledged by seq, sends the entry again from chunk 0. Every chunk of ``split`` fits
``limit`` unless one row of an array is bigger than ``limit``.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from psflow.ps.protocol import PartDelta, ReplicaEntry
from psflow.rpc.api import InvalidRequest

__all__ = ["ChunkAssembler", "entry_bytes", "split"]

_CHUNK = "chunk"


def entry_bytes(entry: ReplicaEntry) -> int:
    """Bytes of the arrays ``entry`` carries (what a carrier's message limit counts, less the JSON)."""
    total = 0
    for delta in entry.parts:
        if delta.rows is not None:
            total += delta.rows.nbytes
        for array in delta.arrays.values():
            total += array.nbytes
    return total


def split(entry: ReplicaEntry, limit: int) -> list[ReplicaEntry]:
    """``entry`` as chunks of at most ``limit`` bytes of arrays each (see the module docstring)."""
    pieces: list[tuple[list[Any], PartDelta, int]] = []  # (descriptor, delta, bytes)
    described: list[list[Any]] = []
    for i, delta in enumerate(entry.parts):
        if delta.rows is not None:  # a delta of rows (not a full entry's): whole
            described.append([delta.key, None])
            size = delta.rows.nbytes + sum(a.nbytes for a in delta.arrays.values())
            pieces.append(([i, None, 0, [], ""], delta, size))
            continue
        described.append([delta.key, list(delta.arrays)])
        for name, array in delta.arrays.items():
            shape, dtype = list(array.shape), array.dtype.str
            if array.ndim == 0 or array.nbytes <= limit or array.shape[0] <= 1:
                pieces.append(([i, name, 0, shape, dtype], PartDelta(delta.key, None, {name: array}), array.nbytes))
                continue
            step = max(1, limit // max(1, array.nbytes // array.shape[0]))
            for start in range(0, array.shape[0], step):
                rows = array[start:start + step]
                pieces.append(([i, name, start, shape, dtype], PartDelta(delta.key, None, {name: rows}), rows.nbytes))
    groups: list[list[tuple[list[Any], PartDelta, int]]] = [[]]
    size = 0
    for piece in pieces:
        if groups[-1] and size + piece[2] > limit:
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += piece[2]
    chunks = []
    for index, group in enumerate(groups):
        state: dict[str, Any] = {"index": index, "count": len(groups), "pieces": [d for d, _, _ in group]}
        if index == 0:
            state["entry"] = {"state": dict(entry.state), "full": entry.full, "pieces": described}
        chunks.append(ReplicaEntry(entry.seq, {_CHUNK: state}, tuple(delta for _, delta, _ in group)))
    return chunks


class _Assembly:
    """The chunks of one entry received so far."""

    def __init__(self, seq: int, count: int, whole: dict[str, Any]) -> None:
        self.seq, self.count, self.got = seq, count, set[int]()
        state, parts = whole.get("state"), whole.get("pieces")
        if not isinstance(state, dict) or not isinstance(parts, list):
            raise InvalidRequest(f"entry {seq}: chunk 0 does not describe the entry")
        self.state, self.full, self.described = state, whole.get("full") is True, parts
        self.arrays: dict[tuple[int, str], np.ndarray] = {}
        self.deltas: dict[int, PartDelta] = {}

    def add(self, index: int, chunk: ReplicaEntry, pieces: list[Any]) -> None:
        if len(pieces) != len(chunk.parts):
            raise InvalidRequest(f"entry {self.seq}: chunk {index} lists {len(pieces)} pieces for "
                                 f"{len(chunk.parts)} partitions")
        for piece, delta in zip(pieces, chunk.parts, strict=True):
            if not (isinstance(piece, list) and len(piece) == 5 and isinstance(piece[0], int)
                    and 0 <= piece[0] < len(self.described)):
                raise InvalidRequest(f"entry {self.seq}: chunk {index}: piece {piece!r:.80} is not "
                                     "[part, name, start, shape, dtype] of the entry")
            part, name, start, shape, dtype = piece
            if name is None:
                self.deltas[part] = delta
                continue
            array = delta.arrays.get(name)
            if array is None or not isinstance(start, int) or not isinstance(shape, list):
                raise InvalidRequest(f"entry {self.seq}: chunk {index}: piece {name!r:.40} of {delta.key!r:.80} "
                                     "missing or not described")
            target = self.arrays.get((part, name))
            if target is None:
                target = self.arrays[(part, name)] = np.empty(tuple(shape), np.dtype(dtype))
            if target.ndim == 0 or (start == 0 and array.shape == target.shape):
                target[...] = array
            elif array.shape[1:] == target.shape[1:] and 0 <= start and start + array.shape[0] <= target.shape[0]:
                target[start:start + array.shape[0]] = array
            else:
                raise InvalidRequest(f"entry {self.seq}: chunk {index}: rows {start}.. of {name!r:.40} of "
                                     f"{delta.key!r:.80} ({array.shape}) do not fit its shape {tuple(shape)}")
        self.got.add(index)

    def entry(self) -> ReplicaEntry:
        parts = []
        for i, (key, names) in enumerate(self.described):
            if names is None:
                parts.append(self.deltas[i])
            else:
                parts.append(PartDelta(key, None, {n: self.arrays[(i, n)] for n in names}))
        return ReplicaEntry(self.seq, self.state, tuple(parts), self.full)


class ChunkAssembler:
    """A backup's assembly of chunked entries (at most one at a time). Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._assembly: _Assembly | None = None

    def whole(self, entries: Sequence[ReplicaEntry]) -> Sequence[ReplicaEntry]:
        """``entries`` with their chunks replaced by the entry they complete (none while chunks are missing)."""
        if not any(_CHUNK in entry.state for entry in entries):
            return entries
        out = []
        for entry in entries:
            chunk = entry.state.get(_CHUNK)
            if chunk is None:
                out.append(entry)
                continue
            done = self._add(entry, chunk)
            if done is not None:
                out.append(done)
        return out

    def _add(self, entry: ReplicaEntry, chunk: Any) -> ReplicaEntry | None:
        if not (isinstance(chunk, dict) and isinstance(chunk.get("index"), int) and isinstance(chunk.get("count"), int)
                and isinstance(chunk.get("pieces"), list)):
            raise InvalidRequest(f"entry {entry.seq}: chunk {chunk!r:.80} must say its index, count and pieces")
        index, count = chunk["index"], chunk["count"]
        with self._lock:
            if index == 0:
                self._assembly = _Assembly(entry.seq, count, chunk.get("entry") or {})
            assembly = self._assembly
            if assembly is None or assembly.seq != entry.seq or assembly.count != count:
                return None  # chunk 0 of it was not received here: the primary sends the entry again
            assembly.add(index, entry, chunk["pieces"])
            if len(assembly.got) < assembly.count:
                return None
            self._assembly = None
            return assembly.entry()
