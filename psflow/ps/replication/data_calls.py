"""A replicated shard primary's data calls: ``Push``, ``PushPull`` (and ``PushPullAckLater`` with its ``Acked``)
and ``Pull``, each push applied once.

:class:`DataCalls` serves them on a :class:`~psflow.ps.replication.member.ShardReplication`. Each is served
as an unreplicated task serves it (:class:`~psflow.ps.push_apply.PushApplier`, the service's reads), then
what it changed is recorded as the member's next entry (the rows it wrote, the small state, the dedup table;
:meth:`ShardReplication._record`). Guarantees:

* **Primary only.** A call on a member that is not the primary of its view, or is deposed, is refused with
  FAILED_PRECONDITION naming the primary it knows, before anything is applied; so is a call routed by a
  newer epoch than this primary's (it then asks the other members whether it was deposed, in the background).
* **Acknowledged before the reply.** A call returns once every backup of the view acknowledged the entry
  holding its change (blocking up to ``replica_timeout``, then UNAVAILABLE), so a promoted backup holds
  every update a client saw acknowledged. An async PushPull reads the rows it returns while its entry is out
  to the backups (:meth:`~psflow.ps.replication.forwarder.Forwarder.wait`'s ``meanwhile``), not after: the
  read needs no acknowledgement, and the reply still waits for it. The exception: an async
  ``PushPullAckLater`` (a worker at one step in flight) replies with the rows at once, its entry marked
  ``ack_pending``; the worker's ``Acked`` call then returns once every backup acknowledged it (the same wait
  and errors), and only then does the worker count the push acknowledged or return its step.
* **Once.** A push already applied for its (worker, incarnation, push_id) -- a resend after a failover, or a
  late reply -- is not applied again: it gets the reply recorded with it, once that record's entry is
  acknowledged (:mod:`~psflow.ps.replication.dedup`).
* **An entry never holds half a push.** async and ssp: the dedup check, the apply and the recording happen
  under :attr:`DataCalls.apply_lock`, so no entry holds a push's rows, step or reader position without its
  dedup record (which a resend would apply twice); :class:`~psflow.ps.replication.checkpoint_count.CheckpointCount`
  takes the same lock. ssp's wait for the slowest worker comes after, outside the lock, once the entry is
  acknowledged (:meth:`~psflow.ps.push_apply.PushApplier.wait_for_slowest`); a push answered from its record
  (a resend) waits the same way, so the bound holds on a promoted backup too. sync: a step's rows, the
  averages it moved and the records of every push it applied are one entry (:meth:`DataCalls.step_applied`,
  under the step's lock); a push counted at its step returns once that entry is acknowledged, a refused one
  records its own.
* **Held during a chief's save** (:mod:`psflow.ps.save_hold`). A sync push whose step a saving chief holds past
  ``--sync-timeout`` is answered held and recorded nowhere yet (its gradient is in the step, recorded with the
  step's entry once applied); an ssp push held while the slowest worker saves is recorded as any push and
  answered held after it, its wait not over. Either way the client sends it again: a sync one waits on in its
  step (or gets its step's record), an ssp one is answered from its record and waits again.
* **Rows a lookup admits are state.** A ``Pull`` or ``PushPull`` with ``create`` that reads a dynamic table
  records the tables' rows as an entry and returns once it is acknowledged.

Thread-safe: the member's forwarder orders the entries; :attr:`DataCalls.apply_lock` as above.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from psflow.ps.protocol import (
    AckedRequest,
    PartDelta,
    PullReply,
    PullRequest,
    PushPullAckLater,
    PushPullAckLaterReply,
    PushPullReply,
    PushPullRequest,
    PushReply,
    PushRequest,
)
from psflow.ps.ready_read import ready_read
from psflow.ps.replication.deltas import capture, capture_averages, capture_table
from psflow.ps.replication.view import PRIMARY
from psflow.ps.staleness import Waited
from psflow.ps.store import PartitionState
from psflow.ps.sync import AppliedStep
from psflow.rpc.api import Handler, PreconditionFailed, Reply
from psflow.rpc.framing import Frame

if TYPE_CHECKING:
    from psflow.ps.replication.forwarder import Forwarder
    from psflow.ps.replication.member import ShardReplication

__all__ = ["DataCalls"]


class DataCalls:
    """The ``Push``, ``PushPull`` and ``Pull`` handlers of one shard member (the module docstring)."""

    def __init__(self, member: ShardReplication) -> None:
        self._member = member
        #: An async or ssp push's dedup check, apply and entry, together (and a checkpoint's count,
        #: CheckpointCount).
        self.apply_lock = threading.Lock()

    def handlers(self) -> dict[str, Handler]:
        """Method -> handler of the data calls."""
        return {PushRequest.METHOD: self.push, PullRequest.METHOD: self.pull, PushPullRequest.METHOD: self.push_pull,
                PushPullAckLater.METHOD: self.push_pull_ack_later, AckedRequest.METHOD: self.acked}

    def push(self, frame: Frame) -> Reply:
        request = PushRequest.from_frame(frame)
        return _reply(self._push(request, lambda: []))

    def _push(self, request: PushRequest, more: Callable[[], list[PartDelta]],
              meanwhile: Callable[[], None] | None = None) -> PushReply:
        """``meanwhile``: (a PushPull's read) run while an async push's entry is out to the backups, if it is."""
        member = self._member
        forwarder = member._check_primary(request.shard_epoch)
        tag, mode, pushes = request.worker, member.service.mode, member.service.pushes
        on_arrival = mode.config.mode in ("async", "ssp")  # (sync records at the step)
        if on_arrival:  # ssp: what the call does next waits for the slowest worker first
            seq, reply = self._apply_once(forwarder, request, more)
            forwarder.wait(seq, meanwhile=meanwhile if mode.config.mode == "async" else None)
            return _waited(reply, pushes.wait_for_slowest(request))
        recorded = member.dedup.check(tag.worker, tag.incarnation, tag.push_id)
        if recorded is not None:  # applied before (a resend after a failover or a late reply): not again
            forwarder.wait(recorded.seq)
            return PushReply.from_frame(Frame(recorded.reply))
        reply = pushes.apply(request)
        if reply.held:  # its step waits for a saving chief (psflow.ps.save_hold): the gradient is in the step, recorded
            return reply  # with it once applied (step_applied); the client sends the push again, nothing recorded yet
        if mode.counts_at_step and reply.accepted:  # recorded with its step's rows (step_applied)
            mine = member.dedup.get(tag.worker, tag.incarnation, tag.push_id)
            if mine is not None:
                forwarder.wait(mine.seq)
                return reply
        sync = mode.aggregator is not None  # the step's rows went with the step (step_applied)
        seq = member._record(forwarder, lambda: more() + ([] if sync else self._push_parts(request)),
                             [(request, reply)])
        forwarder.wait(seq)
        return reply

    def _apply_once(self, forwarder: Forwarder, request: PushRequest,
                    more: Callable[[], list[PartDelta]]) -> tuple[int, PushReply]:
        """(async, ssp) ``request`` checked, applied and recorded as one, under :attr:`apply_lock` (an entry
        recorded in between would hold its rows without its dedup record: a resend would apply it twice); or,
        applied before (a resend after a failover, a late reply), not again. Returns the seq of the entry
        holding it and its reply (as recorded)."""
        tag, member = request.worker, self._member
        with self.apply_lock:
            recorded = member.dedup.check(tag.worker, tag.incarnation, tag.push_id)
            if recorded is None:
                reply = member.service.pushes.apply(request, wait=False)
                seq = member._record(forwarder, lambda: more() + self._push_parts(request), [(request, reply)])
                return seq, reply
        return recorded.seq, PushReply.from_frame(Frame(recorded.reply))

    def _push_parts(self, request: PushRequest) -> list[PartDelta]:
        variables = self._member.service.variables
        parts = [capture(variables.part(key), rows, averages=False) for key, _, rows in request.grads]
        return parts + capture_averages(variables.partitions, set())

    def step_applied(self, applied: AppliedStep) -> None:
        """(sync mode, under the step's lock) The step's rows, the averages it moved and the records of the
        pushes it applied (their examples and reader positions, dedup records, count): the next entry."""
        member = self._member
        pushes = []
        for contribution in applied.contributions:
            request = contribution.push
            if isinstance(request, PushRequest):
                member.service.pushes.count(request, list(contribution.grads))
                pushes.append((request, PushReply(applied.step, True, contribution is applied.completer,
                                                  aggregated=True)))
        forwarder = member.forwarder
        if forwarder is None or member.view.view.role != PRIMARY:
            return
        store = member.service.variables.partitions
        member._record(forwarder, lambda: [capture(part, rows, averages=False) for part, rows in applied.written]
                       + capture_averages(store, set()), pushes)

    def pull(self, frame: Frame) -> Reply:
        request = PullRequest.from_frame(frame)
        member = self._member
        forwarder = member._check_primary(request.shard_epoch)
        service = member.service
        service.clock.hear(request.step_hint)
        with ready_read(service.gate, request.require_ready):  # an evaluation's: of a ready task only
            wanted = service._pull_entries(request)
            step, out = service._read(wanted, create=request.create, averages=request.averages)
        tables = _tables(wanted) if request.create else []
        if tables:  # a training lookup admitted rows: they are state
            forwarder.wait(member._record(forwarder, lambda: [capture_table(part) for part in tables]))
        return _reply(PullReply(step, out, request.stack))

    def push_pull_ack_later(self, frame: Frame) -> Reply:
        """async: the push applied and recorded, the rows read after it, and the reply sent at once, its entry
        ``ack_pending`` (the worker's ``Acked`` call waits for it); otherwise (ssp, sync, or a lookup that
        admitted dynamic rows) a PushPull's reply, acknowledged before it."""
        request = PushPullAckLater.from_frame(frame)
        member = self._member
        service = member.service
        if service.mode.config.mode != "async":
            return self._push_pull(request)
        forwarder = member._check_primary(request.push.shard_epoch)
        wanted = service._pull_entries(request.pull)
        seq, pushed = self._apply_once(forwarder, request.push, lambda: [])
        step, out = service._read(wanted, create=request.pull.create)
        pulled = PullReply(step, out, request.pull.stack)
        tables = _tables(wanted) if request.pull.create else []
        if tables:  # the rows the lookup admitted: acknowledged before the reply, with the push (an earlier entry)
            forwarder.wait(member._record(forwarder, lambda: [capture_table(part) for part in tables]))
            return _reply(PushPullReply(pushed, pulled))
        return _reply(PushPullAckLaterReply(PushPullReply(pushed, pulled), seq))

    def acked(self, frame: Frame) -> Reply:
        """Acked: once every backup of the view acknowledged the push's recorded entry, its reply as recorded."""
        request = AckedRequest.from_frame(frame)
        member = self._member
        forwarder = member._check_primary(request.shard_epoch)
        recorded = member.dedup.get(request.worker, request.incarnation, request.push_id)
        if recorded is None:
            raise PreconditionFailed(f"{member.task}: push {request.push_id} of {request.worker} is not the last "
                                     f"one recorded on shard {member.shard}: nothing to acknowledge")
        forwarder.wait(recorded.seq)
        return _reply(PushReply.from_frame(Frame(recorded.reply)))

    def push_pull(self, frame: Frame) -> Reply:
        return self._push_pull(PushPullRequest.from_frame(frame))

    def _push_pull(self, request: PushPullRequest) -> Reply:
        member = self._member
        service = member.service
        forwarder = member._check_primary(request.push.shard_epoch)
        wanted = service._pull_entries(request.pull)
        read: list[tuple[int | None, dict[str, np.ndarray]]] = []
        # async: the rows are read while the push's entry is out to the backups, not after their acknowledgement
        # (the read does not need it; the reply still waits for it): the two overlap instead of adding up
        pushed = self._push(request.push, lambda: [],
                            meanwhile=lambda: read.append(service._read(wanted, create=request.pull.create)))
        if pushed.held:  # a chief's save holds it: the same call comes again, read then (psflow.ps.save_hold)
            return _reply(PushPullReply(pushed, PullReply(None, {}, request.pull.stack)))
        step, out = read[0] if read else service._read(wanted, create=request.pull.create)
        tables = _tables(wanted) if request.pull.create else []
        if tables:  # the rows the lookup admitted
            forwarder.wait(member._record(forwarder, lambda: [capture_table(part) for part in tables]))
        return _reply(PushPullReply(pushed, PullReply(step, out, request.pull.stack)))


def _waited(reply: PushReply, waited: Waited | None) -> PushReply:
    """``reply`` with the slowest worker's clock its ssp wait ended at (None: no wait); held: the wait is not over
    (a saving worker holds it), the client sends the push again, which its dedup record keeps from being applied
    again (:mod:`psflow.ps.staleness`)."""
    return reply if waited is None else dataclasses.replace(reply, min_clock=waited.min_clock, held=waited.held)


def _tables(wanted: list[tuple[PartitionState, np.ndarray | None]]) -> list[PartitionState]:
    return [part for part, _ in wanted if part.table is not None]


def _reply(message: Any) -> Reply:
    frame = message.to_frame()
    return frame.meta, frame.arrays
