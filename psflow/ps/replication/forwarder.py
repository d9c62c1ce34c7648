"""The primary's ordered forwarding: every state change gets the next sequence number and goes, in order, to
every backup; the call that made it returns once every backup of the view acknowledged it.

One :class:`BackupSender` per member: it sends every entry it has not seen acknowledged, batched (all that
queued up while the previous call was out: several pushes' entries in one call), and reads the member's
acknowledged sequence number from the reply. Pushes never hold a lock across the call: they record their
entry (:meth:`Forwarder.record`, a short lock that orders sequence numbers with the capture of the rows) and
then wait (:meth:`Forwarder.wait`), so many pushes are in flight at once. A waiting push whose backup has no
call out sends the queued entries itself (:meth:`BackupSender.pump`): on a busy 2-core machine, waking the
sender's thread for each entry and being woken back by it cost more than the call (py-spy: the wake-up was
16% of the primary's GIL time). The sender's thread sends the rest (a joining member's, retries). A waiting call may hand
:meth:`Forwarder.wait` work of its own that does not need the acknowledgement (a PushPull's read of the rows it
returns): it runs once, while the call to the backup is out (between sending the entries and reading the reply),
so the backup's receipt and that work overlap instead of adding up; the call still returns only after the
acknowledgement.

Guarantees:

* Entries reach a member in sequence order within a call, and a member applies them strictly in order
  (:mod:`psflow.ps.replication.applier`); an entry is resent until acknowledged.
* :meth:`Forwarder.wait` returns when every backup of the current view acknowledged the entry; after
  ``replica_timeout`` it raises UNAVAILABLE naming the backup and the shard. The sender keeps trying; the
  primary never drops a backup on its own (only ``DropBackup`` or the backup's ``Join`` change the view).
  A sender given ``on_let_go`` (a joining member's, :mod:`~psflow.ps.replication.joins`) reports, while its
  member is no backup of the view, that the member answered nothing for ``silent_limit`` seconds (after a
  failed call), or that more than its :class:`QueueBound` is queued after its first entry (the snapshot; at
  the entry that passed it, in :meth:`Forwarder.record`, outside the lock): its owner stops it, which frees its
  queue (else a member gone for good, or one that applies slower than the primary records, kept every new
  entry until the primary ran out of memory). A backup of the view is bounded by the calls waiting for it.
* A member that refuses the entries by the epoch's fence (ABORTED, :class:`~psflow.rpc.api.FencedOffError`: it
  knows a higher epoch, :meth:`~psflow.ps.replication.view.ViewState.check_entries`) is reported through
  ``on_deposed``, without the retry's warning (the deposed member logs its one line); any other refusal (one whose
  text says "deposed" too: the member was itself deposed and rebuilds from this primary) is retried, with one
  warning.
* :meth:`Forwarder.hold` (a member joining is within a few entries of the newest) makes new entries wait,
  for at most the seconds given, so the member can ack the newest one and enter the view even under
  continuous pushes; :meth:`Forwarder.release` (it entered) lets them go.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

from psflow.ps.protocol import ReplicaEntry, ReplicateReply, ReplicateRequest
from psflow.ps.replication.chunks import entry_bytes, split
from psflow.ps.replication.join_queue import JoinQueue, QueueBound
from psflow.rpc.api import Channel, FencedOffError, PreconditionFailed, RpcError, Unavailable

__all__ = ["BackupSender", "Forwarder", "QueueBound"]

log = logging.getLogger("psflow.ps.replication")

#: Entries in one Replicate call at most.
_BATCH = 256
#: Seconds between tries to reach a member that did not answer, growing to _BACKOFF_MAX.
_BACKOFF, _BACKOFF_MAX = 0.05, 1.0
#: Seconds a backup's entry waits for a waiting call to send it (:meth:`BackupSender.pump`) before the
#: sender's thread does (it looks this often).
_PUMP_GRACE = 0.02


class BackupSender:
    """Sends entries to one member, in order, until each is acknowledged.

    One Replicate call to the member is out at a time. For a backup of the view (:attr:`pumped`), the calls
    waiting for its acknowledgement send it themselves (:meth:`pump`, from :meth:`Forwarder.wait`): the entries
    queued, in the waiting call's thread, with no wake-up of another thread on the way out or back. The
    sender's own thread sends what nobody pumps: a joining member's entries at once, a backup's entries that
    waited ``_PUMP_GRACE`` seconds with no call out (an entry no call waits for), and every retry after a
    failure (``_BACKOFF`` seconds, doubling to ``_BACKOFF_MAX``).

    A call carries at most ``chunk_bytes`` of arrays (the carriers refuse a message over 512 MiB): a batch
    stops before an entry that would pass it, and an entry bigger than that alone (a full entry of a big
    shard) goes in chunks, one call each, in order (:mod:`~psflow.ps.replication.chunks`); a failed call is
    retried with the same chunk, and if the member did not apply the entry after its last chunk (it lost the
    first ones), the entry is sent again from chunk 0.
    """

    def __init__(self, member: str, channel: Callable[[], Channel], request: Callable[[str, list[ReplicaEntry]],
                 ReplicateRequest], on_ack: Callable[[], None], on_deposed: Callable[[str, str], None],
                 rpc_timeout: float, chunk_bytes: int = 64 << 20,
                 on_let_go: Callable[[BackupSender, str], None] | None = None, silent_limit: float = 0.0,
                 clock: Callable[[], float] = time.monotonic, bound: QueueBound | None = None) -> None:
        """``on_let_go``: called (outside any lock) with this sender and a reason, while not :attr:`pumped`: after
        a failed call when the member answered no call for ``silent_limit`` seconds (by ``clock``) since this
        sender started or its last answer; and by :meth:`Forwarder.record` once more than ``bound`` is queued
        after the first entry (the snapshot, whose size fixes the bound's bytes: :meth:`QueueBound.for_snapshot`)
        (None: never)."""
        self.member = member
        self._channel, self._request, self._on_ack, self._on_deposed = channel, request, on_ack, on_deposed
        self._rpc_timeout, self._chunk_bytes = rpc_timeout, chunk_bytes
        self._on_let_go, self._silent_limit, self._clock = on_let_go, silent_limit, clock
        self._answered_at = clock()  # when this sender started, then when the member last answered (clock)
        self._cond = threading.Condition()
        # entry, when queued, its arrays' bytes, what it was counted for in the tally (held_bytes while joining)
        self._queue: deque[tuple[ReplicaEntry, float, int, int]] = deque()
        #: The entries after the first one queued (a Join's snapshot), what they hold, the bound and the peaks.
        self.tally = JoinQueue(bound)
        self._chunks: list[ReplicaEntry] = []  # the chunks of the queue's first entry, when it is split
        self._next_chunk = 0
        self.acked = 0
        #: Whether the member answered a call yet (then :attr:`acked` counts: its snapshot is applied).
        self.answered = False
        self.last_error: str | None = None
        #: Whether the calls waiting for this member send its entries (:meth:`pump`): a backup of the view.
        self.pumped = False
        self._busy = False  # a call is out
        self._kicked = False  # send what is queued now (kick)
        self._retry_at, self._backoff = 0.0, _BACKOFF
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"psflow-replicate-{member}", daemon=True)
        self._thread.start()

    def enqueue(self, entry: ReplicaEntry) -> str | None:
        """Queues ``entry``; returns why to let this sender go when that put more than its ``bound`` in the queue
        after the first entry while it is not :attr:`pumped` (:meth:`Forwarder.record` reports it), else None."""
        with self._cond:
            size = entry_bytes(entry)
            weigh = self._on_let_go is not None and not self.pumped and not self._stopped
            self._queue.append((entry, time.monotonic(), size, self.tally.add(entry, size, weigh)))
            if not self.pumped:
                self._cond.notify()
            return None if self.pumped or self._stopped else self.tally.past_bound()

    def figures(self) -> str:
        """What queued for this sender's member (:meth:`JoinQueue.figures`): its join's log line."""
        with self._cond:
            return self.tally.figures()

    def let_go(self, why: str) -> None:
        """Reports ``why`` to ``on_let_go`` (outside any lock)."""
        if self._on_let_go is not None:
            self._on_let_go(self, why)

    def set_pumped(self, pumped: bool) -> None:
        """Sets :attr:`pumped` and wakes the thread, which then looks every ``_PUMP_GRACE`` seconds (a backup's
        entries queue without waking it): a thread idle since before the member became a backup slept on."""
        with self._cond:
            self.pumped = pumped
            self._cond.notify()

    def pending(self) -> tuple[int, float]:
        """Entries queued and not acknowledged, and the age in seconds of the oldest (0.0: none)."""
        with self._cond:
            if not self._queue:
                return 0, 0.0
            return len(self._queue), time.monotonic() - self._queue[0][1]

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._queue.clear()
            self.tally.clear()
            self._cond.notify_all()

    def kick(self) -> None:
        """The sender's thread sends what is queued now (an entry no call waits for, which should not wait)."""
        with self._cond:
            self._kicked = True
            self._cond.notify()

    def pump(self, timeout: float, meanwhile: Callable[[], object] | None = None) -> bool:
        """Sends the queued entries in the calling thread (one call, at most ``timeout`` seconds), unless a call
        is out, none is queued or a retry is not due yet; True if it sent (the call may have failed).
        ``meanwhile`` (which must not raise) runs once the entries are sent, before the reply is read."""
        with self._cond:
            if self._stopped or self._busy or not self._queue or time.monotonic() < self._retry_at:
                return False
            self._busy = True
        self._send(min(self._rpc_timeout, max(timeout, 0.05)), meanwhile)
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped:
                    # a backup's entries queue without waking this thread: it looks every _PUMP_GRACE seconds
                    now, wait = time.monotonic(), _PUMP_GRACE if self.pumped else None
                    if self._queue and not self._busy:
                        grace = self.pumped and not self._kicked
                        due = max(self._retry_at, self._queue[0][1] + _PUMP_GRACE if grace else 0.0)
                        if now >= due:
                            break
                        wait = due - now
                    self._cond.wait(wait)
                if self._stopped:
                    return
                self._busy, self._kicked = True, False
            self._send(self._rpc_timeout)

    def _silent(self, error: str) -> str | None:
        """(under ``_cond``, after a failed call) Why to give this sender up (see ``on_let_go``), else None."""
        if self._on_let_go is None:
            return None
        silent = self._clock() - self._answered_at
        if self.pumped or self._stopped or silent < self._silent_limit:
            return None
        return (f"it answered no call for {silent:.0f} s (limit {self._silent_limit:g} s), {len(self._queue)} "
                f"entries unacknowledged; last error: {error}")

    def _batch(self) -> tuple[list[ReplicaEntry], int | None]:
        """(under ``_cond``) The entries of the next call, within ``chunk_bytes``; and the seq of the entry it
        ends (a last chunk), else None."""
        head, _, size, _ = self._queue[0]
        if size > self._chunk_bytes:  # alone, in chunks
            if not self._chunks or self._chunks[0].seq != head.seq:
                self._chunks, self._next_chunk = split(head, self._chunk_bytes), 0
            last = self._next_chunk == len(self._chunks) - 1
            return [self._chunks[self._next_chunk]], head.seq if last else None
        batch: list[ReplicaEntry] = []
        total = 0
        for entry, _, size, _ in self._queue:
            total += size
            if len(batch) == _BATCH or total > self._chunk_bytes:
                break
            batch.append(entry)
        return batch, None

    def _send(self, timeout: float, meanwhile: Callable[[], object] | None = None) -> None:
        """One Replicate call with the queued entries (the caller set ``_busy``); ``meanwhile`` runs while it is
        out, if it was sent."""
        with self._cond:
            batch, ends = self._batch() if self._queue else ([], None)
            chunked = bool(batch) and bool(self._chunks) and batch[0] is self._chunks[self._next_chunk]
        error: str | None = None
        deposed = False
        try:
            frame = self._request(self.member, batch).to_frame()
            if meanwhile is None:
                answer = self._channel().call(ReplicateRequest.METHOD, frame.meta, frame.arrays, timeout=timeout)
            else:
                pending = self._channel().call_async(ReplicateRequest.METHOD, frame.meta, frame.arrays, timeout=timeout)
                meanwhile()
                answer = pending.result()
            reply = ReplicateReply.from_frame(answer)
        except FencedOffError as e:  # the epoch's fence, told by its status: the one line this primary logs says so
            error, deposed = str(e), True
        except (RpcError, OSError) as e:
            error = str(e)
        silent: str | None = None
        with self._cond:
            self._busy = False
            if error is None:
                self._answered_at = self._clock()
                self.last_error, self.answered = None, True
                self._retry_at, self._backoff = 0.0, _BACKOFF
                self.acked = max(self.acked, reply.applied_seq)
                if chunked:  # a chunk went: the next one; after the last, done or sent again
                    self._next_chunk = 0 if ends is not None else self._next_chunk + 1
                    if ends is not None and self.acked < ends:
                        log.info("%s did not apply entry %d after its last chunk: sending it again", self.member, ends)
                while self._queue and self._queue[0][0].seq <= self.acked:
                    done, _, _, held = self._queue.popleft()
                    self.tally.remove(done.seq, held)
                if self._chunks and (not self._queue or self._queue[0][0].seq != self._chunks[0].seq):
                    self._chunks = []
            else:
                if self.last_error is None and not deposed and not self._stopped:  # stopped: replaced, quiet
                    log.warning("replication to %s failed (retrying): %s", self.member, error)
                self.last_error = error
                self._retry_at = time.monotonic() + self._backoff
                self._backoff = min(_BACKOFF_MAX, self._backoff * 2)
                silent = self._silent(error)
            if self._queue and not self.pumped:
                self._cond.notify()  # the thread sends what queued meanwhile, or retries when due
        if silent is not None:
            self.let_go(silent)
        if deposed and error is not None:
            self._on_deposed(self.member, error)
        elif error is None:
            self._on_ack()


class Forwarder:
    """Sequence numbers, the senders, and the wait for acknowledgements of one primary. Thread-safe."""

    def __init__(self, shard: int, replica_timeout: float, first_seq: int = 0) -> None:
        self.shard, self.replica_timeout = shard, replica_timeout
        #: Orders sequence numbers with the capture of what each entry holds.
        self.lock = threading.Lock()
        self._cond = threading.Condition()
        self.last_seq = first_seq
        self.senders: dict[str, BackupSender] = {}
        self._waited: tuple[str, ...] = ()
        self._failure: str | None = None
        self._gate = threading.Condition(threading.Lock())
        self._held_until: float | None = None

    def record(self, build: Callable[[int], ReplicaEntry | None]) -> int:
        """Builds entry ``last_seq + 1`` with ``build(seq)`` (under :attr:`lock`, so the rows it copies are
        ordered like the sequence numbers) and queues it for every sender; returns its seq. ``build`` returning
        None (the call changed nothing): no entry, and the newest seq is returned (what the caller may have
        seen). While :meth:`hold` holds, waits first (never holding :attr:`lock` meanwhile). A sender the entry put
        past its bound is reported (:meth:`BackupSender.let_go`) once :attr:`lock` is released, before this returns."""
        if self._held_until is not None:
            self._pass_gate()
        behind: list[tuple[BackupSender, str]] = []
        with self.lock:
            seq = self.last_seq + 1
            entry = build(seq)
            if entry is None:
                return self.last_seq
            self.last_seq = seq
            for sender in self.senders.values():
                if (why := sender.enqueue(entry)) is not None:
                    behind.append((sender, why))
        for sender, why in behind:
            sender.let_go(why)
        return seq

    def hold(self, seconds: float) -> None:
        """New entries wait (in :meth:`record`) until :meth:`release`, or ``seconds`` from now at most."""
        with self._gate:
            self._held_until = time.monotonic() + seconds

    def release(self) -> None:
        """New entries go on (see :meth:`hold`)."""
        with self._gate:
            self._held_until = None
            self._gate.notify_all()

    @property
    def held(self) -> bool:
        return self._held_until is not None

    def _pass_gate(self) -> None:
        with self._gate:
            while self._held_until is not None:
                left = self._held_until - time.monotonic()
                if left <= 0:
                    self._held_until = None
                    self._gate.notify_all()
                    break
                self._gate.wait(left)

    def kick(self) -> None:
        """Every sender sends what is queued now (:meth:`BackupSender.kick`)."""
        with self.lock:
            senders = list(self.senders.values())
        for sender in senders:
            sender.kick()

    def set_waited(self, backups: tuple[str, ...]) -> None:
        """The backups of the view: those :meth:`wait` waits for."""
        with self._cond:
            self._waited = backups
            for member, sender in list(self.senders.items()):
                sender.set_pumped(member in backups)
            self._cond.notify_all()

    def fail(self, reason: str) -> None:
        """Every wait, now and later, raises PreconditionFailed(``reason``) (this primary was deposed)."""
        with self._cond:
            self._failure = reason
            self._cond.notify_all()

    def notify(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def wait(self, seq: int, timeout: float | None = None, meanwhile: Callable[[], None] | None = None) -> None:
        """Returns once every backup of the view acknowledged entry ``seq``.

        ``meanwhile``: work of the caller's that does not need the acknowledgement, run exactly once before
        this returns, while the entries are out where this call sends them (:meth:`BackupSender.pump`) or
        another call is out; an error it raises is raised once the wait is over (the wait's own error first).

        Raises:
            Unavailable: a backup did not within ``timeout`` (default ``replica_timeout``; names it and the shard).
            PreconditionFailed: this primary was deposed meanwhile (:meth:`fail`).
        """
        limit = self.replica_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        once = _Once(meanwhile)
        while True:
            with self._cond:
                behind = self._behind(seq, deadline, limit)
                if not behind:
                    break
            # send them in this thread where no call is out (BackupSender.pump); else wait for the acks
            if any([sender.pump(deadline - time.monotonic(), once.run) for sender in behind]):
                continue
            if once.run():  # a call is out: the caller's work overlaps it
                continue
            with self._cond:
                behind = self._behind(seq, deadline, limit)
                if not behind:
                    break
                self._cond.wait(timeout=min(deadline - time.monotonic(), 0.5))
        once.run()
        once.raise_error()

    def _behind(self, seq: int, deadline: float, limit: float) -> list[BackupSender]:
        """(under ``_cond``) The senders of the view's backups that have not acknowledged ``seq``; raises as
        :meth:`wait` says."""
        if self._failure is not None:
            raise PreconditionFailed(self._failure)
        senders = [(b, self.senders.get(b)) for b in self._waited]  # .get: one removed meanwhile is not waited for
        behind = [(b, sender) for b, sender in senders if sender is not None and sender.acked < seq]
        if behind and time.monotonic() >= deadline:
            member, sender = behind[0]
            error = sender.last_error
            raise Unavailable(f"shard {self.shard}: backup {member} did not acknowledge entry {seq} within "
                              f"{limit:g} s" + (f" ({error})" if error else ""))
        return [sender for _, sender in behind]

    def lag(self) -> dict[str, tuple[int, float]]:
        """Member -> (entries not acknowledged, seconds of the oldest): every sender at one moment (taken under
        :attr:`lock`, under which senders are added and removed)."""
        with self.lock:
            senders = list(self.senders.items())
        return {member: sender.pending() for member, sender in senders}

    def stop(self) -> None:
        self.release()
        with self.lock:
            for sender in self.senders.values():
                sender.stop()
            self.senders = {}


class _Once:
    """Work run at most once (:meth:`run`), its error kept for :meth:`raise_error`."""

    def __init__(self, work: Callable[[], None] | None) -> None:
        self._work = work
        self._error: Exception | None = None

    def run(self) -> bool:
        """Runs the work if it has not run; True if it ran now."""
        work, self._work = self._work, None
        if work is None:
            return False
        try:
            work()
        except Exception as e:  # noqa: BLE001 - the caller's error, raised once the wait is over
            self._error = e
        return True

    def raise_error(self) -> None:
        if self._error is not None:
            raise self._error
