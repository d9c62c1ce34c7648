"""A replicated shard primary's senders: a member's ``Join``, its start from a snapshot, its entry into the view.

:class:`Joins` serves ``Join`` on a :class:`~psflow.ps.replication.member.ShardReplication` and makes every
sender of its forwarder (:meth:`Joins.add_sender`: a Join's, and each backup's when the member becomes primary).
Guarantees:

* **Primary only.** A Join on a member that is not the primary of its view (or is deposed) is refused with
  FAILED_PRECONDITION naming the primary it knows; one naming another shard, or not another member of this
  one, is refused as invalid.
* **From a snapshot.** A sender's first entry is the whole state as of the newest seq (a full entry); every
  entry after it follows in order. A new sender to a member stops its old one.
* **The newest Join alone.** Joins are served one at a time. A Join of the same process (incarnation) whose id
  is not above one served already (held up in the network, or arriving twice) is refused: its sender would
  replace the newer one's, whose calls alone the member takes. A backup of the view that joins (its own
  return) leaves the view's backups until it caught up: no call waits for it meanwhile.
* **Into the view once caught up.** A joining member that acknowledged the newest entry enters the view's
  backups (each call waits for it from then on), and an entry tells the members the new view. One within
  ``_JOIN_NEAR`` entries of the newest holds new entries back (at most ``_JOIN_HOLD`` s, then not again for
  ``_JOIN_HOLD`` s) until it acknowledged the newest: so it enters under any load.
* **A joining member gone is let go.** A member that is no backup of the view and answered none of its
  sender's calls for ``_SILENT_CALLS`` Replicate deadlines (``max(replica_timeout, 5)`` s each: 30 s by default)
  loses its sender, and with it the queue of every entry since its snapshot (else it grew with every push
  until the primary ran out of memory), with one warning naming it. A healthy joiner, however slow to catch
  up (a big snapshot in chunks), answers each call within its deadline, so it is never let go; its queue holds
  what it is behind (up to the bound below). A backup of the view is never let go this way (``DropBackup`` alone drops one). The
  member, reachable again (:func:`~psflow.ps.replication.startup.watch_view` sees no sender to it) or
  restarted, Joins again (a new snapshot).
* **A joining member too far behind is let go.** One that answers but applies slower than this primary records
  entries (a slow or starved host, a snapshot it never finishes applying) would make its queue grow with every
  push, as a silent one did: once more than :attr:`Joins.bound` waits for it after its snapshot
  (:data:`JOIN_QUEUE_BOUND`: 100,000 entries, or 1 GiB or three times its snapshot's bytes, whichever is more;
  an entry's bytes are what it holds, its arrays and its small state: :mod:`~psflow.ps.replication.join_queue`),
  its sender stops at that entry, its queue is freed, and one warning names the member and the bound; it
  Joins again from a new snapshot (as a silent one, above). So a joining member costs this primary at most
  its snapshot plus the bound. A member that keeps up (applies at least as fast as the primary records)
  stays under it: what queues is the pushes of the time its snapshot travels and is applied (the bound grows
  with the snapshot; measured on a Wide & Deep shard at 0.38-0.94 times it, benchmarks/RESULTS.md), and it
  shrinks after. One that never keeps up is let go again after each new snapshot. Its line when it caught up
  (INFO) or was let go (the warning) says its snapshot, when it acknowledged it and the most that queued. A backup
  of the view is never let go this way: every call waits for its acknowledgement (and fails UNAVAILABLE after
  ``replica_timeout``; a worker's push is resent with its push number, waiting for the same entry), so what
  queues for it is bounded by the calls waiting (a few per worker: its steps in flight), plus the rare
  entries no call waits for (a view's change).

Thread-safe: Joins under their own lock, the senders and the view's backups under the forwarder's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from psflow.ps.protocol import JoinReply, JoinRequest, ReplicaEntry, ReplicateRequest
from psflow.ps.replication.forwarder import BackupSender, Forwarder
from psflow.ps.replication.join_queue import QueueBound
from psflow.ps.replication.view import PRIMARY
from psflow.rpc.api import InvalidRequest, PreconditionFailed, Reply
from psflow.rpc.framing import Frame

if TYPE_CHECKING:
    from psflow.ps.replication.member import ShardReplication

__all__ = ["JOIN_QUEUE_BOUND", "Joins"]

log = logging.getLogger("psflow.ps.replication")

#: A joining member this few entries behind the newest: new entries wait (at most _JOIN_HOLD seconds, then
#: not again for _JOIN_HOLD) until it acked the newest and entered the view; so it enters under any load.
_JOIN_NEAR, _JOIN_HOLD = 64, 1.0
#: A joining member that answered none of its sender's calls for this many Replicate deadlines loses its sender.
_SILENT_CALLS = 6
#: What may queue for a joining member after its snapshot before it is let go (a bound on this primary's memory).
#: Bytes (held: arrays and each entry's state): 1 GiB holds ~700 of the heaviest pushes measured (W&D's 1.45 MB),
#: and three times the snapshot (a bigger shard's snapshot travels longer) more than what queues while it travels
#: and is applied: measured on a W&D shard (532 MB snapshot, 2-4 workers, a busy 2-core host), 0.38-0.94 times the
#: snapshot at its peak (benchmarks/RESULTS.md); twice left a healthy joiner on a faster host with more workers
#: little room. Entries: 100,000 is about 100 s of the fastest pushes (sparse LR, two workers).
JOIN_QUEUE_BOUND = QueueBound(entries=100_000, bytes=1 << 30, snapshots=3.0)


class Joins:
    """The ``Join`` handler and the forwarder's senders of one shard member (the module docstring)."""

    def __init__(self, member: ShardReplication) -> None:
        self._member = member
        self._lock = threading.Lock()  # Joins served one at a time (join)
        self._newest: dict[str, tuple[int, int]] = {}  # member -> (incarnation, id) of its newest Join served
        self._held_at = 0.0  # when the last hold for a joining member began (monotonic)
        #: The senders' clock for their members' silence (a test's fake clock lets one go without waiting).
        self.clock: Callable[[], float] = time.monotonic
        #: What may queue for a joining member after its snapshot (read when its sender starts; a test's smaller).
        self.bound = JOIN_QUEUE_BOUND

    def join(self, frame: Frame) -> Reply:
        """``Join``: a sender to the member that asks, from a snapshot; replies the view's epoch and its seq."""
        member = self._member
        request = JoinRequest.from_frame(frame)
        member._check_shard(request.shard)
        if request.member not in member.members or request.member == member.task:
            raise InvalidRequest(f"{member.task}: {request.member} is not another member of shard {member.shard}")
        forwarder = member._check_primary()
        with self._lock:  # one Join at a time: the newest one's sender is the one that stays
            self._refuse_older(request)
            view = member.view.view
            if request.member in view.backups:  # its own return: it catches up before it is waited for again
                view = member.view.set(replace(view, backups=tuple(b for b in view.backups if b != request.member)))
                forwarder.set_waited(view.backups)
            seq = self.add_sender(forwarder, request.member, request.incarnation, request.join_id)
        log.info("%s: %s joins shard %d from snapshot %d", member.task, request.member, member.shard, seq)
        return _reply(JoinReply(view.epoch, seq))

    def _refuse_older(self, request: JoinRequest) -> None:
        """Records ``request`` as its member's newest Join (under ``_lock``).

        Raises:
            PreconditionFailed: a Join of the same process was served with this id or a higher one (this one
                was held up in the network, or arrived twice): its sender would replace the newer one's,
                whose calls alone the member takes.
        """
        if request.join_id is None:
            return
        newest = self._newest.get(request.member)
        if newest is not None and newest[0] == request.incarnation and request.join_id <= newest[1]:
            raise PreconditionFailed(f"{self._member.task}: Join {request.join_id} of {request.member} (process "
                                     f"{request.incarnation}) refused: its Join {newest[1]} was served already")
        self._newest[request.member] = (request.incarnation, request.join_id)

    def add_sender(self, forwarder: Forwarder, member: str, incarnation: int | None = None,
                   join_id: int | None = None) -> int:
        """A sender to ``member`` whose first entry is the whole state as of the newest seq; returns that seq.
        ``incarnation``: the member's process that asked (Join), which alone takes its calls (None: any);
        ``join_id``: that Join's id, which its calls carry (the member takes only its newest Join's)."""
        owner = self._member
        rpc_timeout = max(owner.config.replica_timeout, 5.0)
        with forwarder.lock:
            old = forwarder.senders.pop(member, None)
            if old is not None:
                old.stop()
            seq = forwarder.last_seq
            sender = BackupSender(member, lambda: owner.channels.get(member, data=True),
                                  lambda to, entries: self._request(to, entries, incarnation, join_id),
                                  self.on_ack,
                                  owner._on_refused, rpc_timeout=rpc_timeout,
                                  chunk_bytes=owner.config.chunk_bytes,
                                  on_let_go=lambda s, why: self._let_go(forwarder, s, why),
                                  silent_limit=_SILENT_CALLS * rpc_timeout, clock=self.clock, bound=self.bound)
            sender.enqueue(owner._full_entry(seq))
            forwarder.senders[member] = sender
        return seq

    def _let_go(self, forwarder: Forwarder, sender: BackupSender, why: str) -> None:
        """A joining member silent too long or too far behind (the module docstring): stops its sender, unless it is no longer the
        member's or the member is a backup of the view (checked under the forwarder's lock, as :meth:`on_ack`
        puts a member into the view)."""
        owner = self._member
        with forwarder.lock:
            if forwarder.senders.get(sender.member) is not sender or sender.member in owner.view.view.backups:
                return
            del forwarder.senders[sender.member]
            sender.stop()
        log.warning("%s: stopped replicating shard %d to joining member %s: %s; it Joins again (a new snapshot) "
                    "(%s)", owner.task, owner.shard, sender.member, why, sender.figures())

    def _request(self, member: str, entries: list[ReplicaEntry], incarnation: int | None,
                 join_id: int | None) -> ReplicateRequest:
        view = self._member.view.view
        return ReplicateRequest(view.epoch, self._member.task, member, view.backups, entries, incarnation, join_id)

    def on_ack(self) -> None:
        """A sender's member acknowledged: wake the waiting calls; a joining member caught up enters the view."""
        owner = self._member
        forwarder = owner.forwarder
        if forwarder is None:
            return
        forwarder.notify()
        view = owner.view.view
        joined: list[str] = []
        figures: list[str] = []
        near = False
        with forwarder.lock:
            for member, sender in forwarder.senders.items():
                if member in view.backups or not sender.answered:
                    continue
                if sender.acked >= forwarder.last_seq:
                    joined.append(member)
                    figures.append(f"{member} {sender.figures()}")
                elif forwarder.last_seq - sender.acked <= _JOIN_NEAR:
                    near = True
            if joined and owner.view.view.role == PRIMARY:
                view = owner.view.set(replace(view, backups=view.backups + tuple(joined)))
        if joined:
            forwarder.release()
            forwarder.set_waited(view.backups)
            log.info("%s: %s caught up: shard %d's backups are %s (%s)", owner.task, ", ".join(joined), owner.shard,
                     ", ".join(view.backups), "; ".join(figures))
            owner._record(forwarder, lambda: [])  # tells the members the view (each Replicate carries it)
            forwarder.kick()  # now: no call waits for that entry
        elif near and not forwarder.held and time.monotonic() - self._held_at > 2 * _JOIN_HOLD:
            self._held_at = time.monotonic()  # a barrier: the newest entry stays the newest until it acks it
            forwarder.hold(_JOIN_HOLD)


def _reply(message: Any) -> Reply:
    frame = message.to_frame()
    return frame.meta, frame.arrays
