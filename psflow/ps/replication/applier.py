"""A backup's in-order applier: entries are written strictly in sequence order.

Entries may arrive out of order (a batch resent after a timeout, two batches served by two threads); an
entry whose predecessors are missing is buffered until they arrive. An entry already applied (``seq`` at or
below :attr:`InOrderApplier.applied_seq`) is ignored, so resending is harmless. After :meth:`expect_snapshot`
(a member joining) only a ``full`` entry is applied first, at whatever sequence number: it replaces the state,
and the entries after it follow in order. A ``full`` entry newer than the one applied is applied at once too
(it is the primary's whole state as of its seq, so the entries between are in it): a member that took a
snapshot from a sender the primary has since replaced (a call held up across a restart) takes the new
sender's later snapshot, whose predecessors would never come.

Entries may also be *promised* (:meth:`InOrderApplier.promise`): taken now, acknowledged as received, and
written after the reply (:meth:`InOrderApplier.apply_promised`, the carrier's after-reply work,
:mod:`psflow.rpc.after_reply`), so the backup's write is off the push's round trip. Only entries that continue
exactly what is applied or promised are promised; anything else (a snapshot, a gap) is offered at once.
Promised entries are written together, with ``apply_many`` (coalesced: :func:`~psflow.ps.replication.snapshot.
write_entries`), once ``coalesce`` of them wait (or ``_PENDING_BYTES`` of arrays), and before anything else
touches the state: an offer, a :meth:`InOrderApplier.settle` (a promotion, SaveShard, Stats), a snapshot
expected. An entry whose rows would not merge with others' (:func:`~psflow.ps.replication.deltas.
merges_little`: sparse LR's) is written at once, with those waiting, by its own call's after-reply work: kept
back, ``coalesce`` of them were written by one call's (~1.6 ms for LR) while the connection's next call waited.
Entries due to be written are kept, up to ``2 * coalesce``, while the connection's next request has arrived
already (:func:`psflow.rpc.after_reply.request_waiting`): that call's work, or a read, writes them.
The member's state holds every promised entry once :meth:`InOrderApplier.settle` returns True.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from psflow.ps.protocol import ReplicaEntry
from psflow.ps.replication.chunks import entry_bytes
from psflow.ps.replication.deltas import merges_little
from psflow.rpc import after_reply
from psflow.rpc.api import Handler, Reply
from psflow.rpc.framing import Frame

__all__ = ["InOrderApplier"]

#: Promised entries written together (at most; fewer when a read or an offer comes first): W&D's pushes
#: repeat hot rows, so 8 entries' rows are ~0.7 of their sum, and the per-partition work is done once.
COALESCE = 8
#: Bytes of arrays of promised entries that are written at once, however few the entries.
_PENDING_BYTES = 64 << 20
#: Entries due to be written are kept while the connection's next request waits (the write would hold that
#: call up), up to this many times ``coalesce`` of them.
_PUT_OFF = 2


class InOrderApplier:
    """Applies entries with ``apply`` in sequence order. Thread-safe: one entry is applied at a time."""

    def __init__(self, apply: Callable[[ReplicaEntry], None],
                 apply_many: Callable[[list[ReplicaEntry]], None] | None = None, coalesce: int = COALESCE) -> None:
        """``apply``: writes one entry; ``apply_many``: writes consecutive entries to the same effect as
        ``apply`` of each in order (default: that); ``coalesce``: promised entries written together."""
        self._apply = apply
        self._apply_many = apply_many or self._each
        self._coalesce = max(1, coalesce)
        self._cond = threading.Condition()
        self._applied: int | None = None  # None: waiting for a snapshot
        self._buffer: dict[int, ReplicaEntry] = {}
        self._promised = 0  # the newest entry promised (0: none beyond the applied ones)
        self._pending: list[ReplicaEntry] = []  # promised, handed over, not written yet (they follow _applied)
        self._pending_bytes = 0
        self._failed: Callable[[Exception], None] | None = None  # what a failed write of _pending calls

    @property
    def applied_seq(self) -> int:
        """The newest entry applied (every earlier one is applied too); 0 while none is."""
        return self._applied or 0

    @property
    def received_seq(self) -> int:
        """The newest entry applied or promised (every earlier one is too); 0 while none is."""
        return max(self._applied or 0, self._promised)

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def promise(self, entries: Sequence[ReplicaEntry]) -> int | None:
        """Takes ``entries`` to be applied by :meth:`apply_promised` (after the reply) if they continue exactly
        what is applied or promised, in order, none of them full; returns the newest seq promised, or None (the
        caller offers them now)."""
        with self._cond:
            if self._applied is None or not entries or any(e.full for e in entries):
                return None
            if entries[0].seq != max(self._applied, self._promised) + 1 or any(
                    b.seq != a.seq + 1 for a, b in zip(entries, entries[1:], strict=False)):
                return None
            self._promised = entries[-1].seq
            return self._promised

    def apply_promised(self, entries: Sequence[ReplicaEntry], failed: Callable[[Exception], None]) -> None:
        """Takes promised ``entries`` to be written with those waiting (at once when ``coalesce`` of them wait,
        or one of them has rows that would not merge, unless the connection's next request waits (up to twice
        ``coalesce`` of them); else by a later call, :meth:`settle` or :meth:`offer`); if
        they cannot be written, ``failed`` is called with the error (the member's state lacks entries it
        acknowledged: it must stop counting as holding the state and rebuild), and the promise is dropped."""
        with self._cond:
            tail = self._pending[-1].seq if self._pending else self._applied
            if tail is not None and entries and entries[0].seq == tail + 1:  # else a snapshot was expected since
                self._pending.extend(entries)
                self._pending_bytes += sum(entry_bytes(e) for e in entries)
                self._failed = failed
                due = len(self._pending) >= self._coalesce or any(merges_little(e.parts) for e in entries)
                if (due and not after_reply.request_waiting()) or len(self._pending) >= _PUT_OFF * self._coalesce \
                        or self._pending_bytes >= _PENDING_BYTES:
                    self._flush()
                self._cond.notify_all()  # a settle() waiting for these entries writes them
                return
        try:
            self.offer(entries)
        except Exception as e:  # noqa: BLE001 - acknowledged already: the member must learn it, not the caller
            failed(e)
            with self._cond:
                self._promised = 0
                self._cond.notify_all()

    def _each(self, entries: list[ReplicaEntry]) -> None:
        for entry in entries:
            self._apply(entry)

    def _flush(self) -> None:  # holds _cond
        """Writes the pending entries together; a failure is reported to their ``failed`` and drops the promise
        (the member rebuilds)."""
        entries, self._pending, self._pending_bytes = self._pending, [], 0
        if not entries:
            return
        try:
            self._apply_many(entries)
        except Exception as e:  # noqa: BLE001 - acknowledged already: the member must learn it, not the caller
            self._promised = 0
            if self._failed is not None:
                self._failed(e)
        else:
            self._applied = entries[-1].seq
        self._cond.notify_all()

    def settle(self, timeout: float) -> bool:
        """Writes the promised entries handed over, and waits up to ``timeout`` seconds for the rest (their
        call's after-reply work) until every promised entry is applied; True if it is."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                self._flush()
                if self._promised <= (self._applied or 0):
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)

    def settled(self, handler: Handler, timeout: float) -> Handler:
        """``handler``, served once every entry promised before the call is applied (at most ``timeout``
        seconds' wait): a read of a backup's state (SaveShard, Stats) holds every entry it acknowledged."""
        def call(frame: Frame) -> Reply:
            self.settle(timeout)
            return handler(frame)
        return call

    def expect_snapshot(self) -> None:
        """Drops what is buffered; the next full entry is applied first, at any sequence number."""
        with self._cond:
            self._applied, self._buffer, self._promised = None, {}, 0
            self._pending, self._pending_bytes = [], 0
            self._cond.notify_all()

    def offer(self, entries: Sequence[ReplicaEntry], wait: float = 0.0) -> int:
        """Takes ``entries``, applies every one that is next in order (with the buffered ones that follow),
        waits up to ``wait`` seconds for the predecessors of the newest one offered; returns the newest seq
        applied."""
        with self._cond:
            self._flush()  # the promised entries first: they precede these
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
