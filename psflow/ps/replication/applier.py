"""A backup's in-order applier: entries are written strictly in sequence order.

Entries may arrive out of order (a batch resent after a timeout, two batches served by two threads); an
entry whose predecessors are missing is buffered until they arrive. An entry already applied (``seq`` at or
below :attr:`InOrderApplier.applied_seq`) is ignored, so resending is harmless. After :meth:`expect_snapshot`
(a member joining) only a ``full`` entry is applied first, at whatever sequence number: it replaces the state,
and the entries after it follow in order. A ``full`` entry newer than the one applied is applied at once too
(it is the primary's whole state as of its seq, so the entries between are in it): a member that took a
snapshot from a sender the primary has since replaced (a call held up across a restart) takes the new
sender's later snapshot, whose predecessors would never come.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from psflow.ps.protocol import ReplicaEntry

__all__ = ["InOrderApplier"]


class InOrderApplier:
    """Applies entries with ``apply`` in sequence order. Thread-safe: one entry is applied at a time."""

    def __init__(self, apply: Callable[[ReplicaEntry], None]) -> None:
        self._apply = apply
        self._cond = threading.Condition()
        self._applied: int | None = None  # None: waiting for a snapshot
        self._buffer: dict[int, ReplicaEntry] = {}

    @property
    def applied_seq(self) -> int:
        """The newest entry applied (every earlier one is applied too); 0 while none is."""
        return self._applied or 0

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def expect_snapshot(self) -> None:
        """Drops what is buffered; the next full entry is applied first, at any sequence number."""
        with self._cond:
            self._applied, self._buffer = None, {}
            self._cond.notify_all()

    def offer(self, entries: Sequence[ReplicaEntry], wait: float = 0.0) -> int:
        """Takes ``entries``, applies every one that is next in order (with the buffered ones that follow),
        waits up to ``wait`` seconds for the predecessors of the newest one offered; returns the newest seq
        applied."""
        with self._cond:
            for entry in entries:
                if self._applied is None:
                    if entry.full:
                        self._buffer = {s: e for s, e in self._buffer.items() if s > entry.seq}
                        self._apply(entry)
                        self._applied = entry.seq
                    elif entry.seq not in self._buffer:
                        self._buffer[entry.seq] = entry
                    continue
                if entry.full and entry.seq > self._applied:  # the whole state as of entry.seq
                    self._buffer = {s: e for s, e in self._buffer.items() if s > entry.seq}
                    self._apply(entry)
                    self._applied = entry.seq
                elif entry.seq > self._applied:
                    self._buffer[entry.seq] = entry
            self._drain()
            newest = max((e.seq for e in entries), default=0)
            if wait > 0 and self._applied is not None and newest > self._applied:
                self._cond.wait_for(lambda: self._applied is not None and self._applied >= newest, timeout=wait)
            return self.applied_seq

    def _drain(self) -> None:  # holds _cond
        if self._applied is None:
            return
        while self._applied + 1 in self._buffer:
            entry = self._buffer.pop(self._applied + 1)
            self._apply(entry)
            self._applied = entry.seq
        for seq in [s for s in self._buffer if s <= self._applied]:
            del self._buffer[seq]
        self._cond.notify_all()
