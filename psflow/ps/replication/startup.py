"""Where a member of a replicated shard stands when its process starts, and its rebuild from a primary.

* :func:`find_place`: the member asks the others' ReplicaStatus. Some member is primary with state -> it
  rebuilds from it (:func:`rebuild`); some member has state and names this very task as primary (its dead
  predecessor) -> it promotes the first of them in member order, then rebuilds from the winner; none has
  state and it is member 0 -> it is primary at epoch 1 with every other member as a backup (a fresh
  cluster: once every other member answered, or after 30 s); else it asks again every 0.2 s. On shard 0 a
  fresh shard's primary first raises its global_step floor to the highest its members' journals hold for its
  run (:func:`adopt_floors`; a member answering later counts while its counter is still 0): else a restore
  after the whole shard was lost would go on from member 0's own floor and hand out again the values a
  promoted backup handed out above it.
* :func:`rebuild`: ``Join`` the primary (retried until it answers); its snapshot and every entry after it
  follow through ``Replicate`` (:mod:`psflow.ps.replication.applier`). :func:`rebuild_unwritten`: the same,
  at once, for a backup that could not write an entry it had acknowledged (it stops counting as holding
  the state first).
* :func:`watch_view`: then, for as long as the process serves, a backup asks its primary's ReplicaStatus every
  second; a primary at a higher epoch whose view no longer holds this member (a client that could not reach it
  had it dropped, ``DropBackup``, while it was alive: e.g. restarted an instant before) gets it back, as a
  returning member: it rebuilds from that primary (Join). A primary never sends a dropped member anything, so
  without this a backup restarted after every replica of its shard was lost could stay out of the view for the
  rest of the run. Likewise a primary asks the other members: one that says primary at a higher epoch (a
  client promoted it over this one, e.g. over a restarted empty primary it could not reach) deposes it. And a
  joining member (its Join answered) whose primary counts it among its backups at two looks in a row (same
  epoch and process, its own view unchanged) Joins it again: the primary's sender is not its Join's, whose
  entries it refuses for good (the primary's process was lost while it joined and restarted as a fresh shard's
  primary with it as a backup: every push waited for it); one that caught up hears the view within milliseconds.
  So does one its primary has no sender to at two looks (it let it go while it answered nothing).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from psflow.ps.global_step import StepJournalError
from psflow.ps.protocol import JoinReply, JoinRequest, PromoteRequest, ReplicaStatusReply
from psflow.ps.replication.view import BACKUP, JOINING, PRIMARY, View
from psflow.rpc.api import FailedPreconditionError, RpcError

if TYPE_CHECKING:
    from psflow.ps.replication.member import ShardReplication

__all__ = ["adopt_floors", "find_place", "rebuild", "rebuild_unwritten", "watch_view"]

log = logging.getLogger("psflow.ps.replication")

#: Seconds a member waits for every other member's answer before it starts a fresh shard without them.
_FRESH_WAIT = 30.0
#: Seconds between a backup's checks that its primary still counts it in the view (:func:`watch_view`).
_WATCH_EVERY = 1.0


def find_place(self: ShardReplication) -> None:
    """Finds member ``self``'s place in its shard (the module docstring), retrying until it has one; then
    watches that a backup stays in its primary's view (:func:`watch_view`) until the member stops."""
    _place(self)
    watch_view(self)


def _place(self: ShardReplication) -> None:
    began = time.monotonic()
    while not self._stopped.is_set():
        statuses: dict[str, ReplicaStatusReply] = {}
        for member in self.members:
            if member != self.task:
                try:
                    statuses[member] = self._status_of(member)
                except RpcError:
                    pass
        if self.view.view.role != JOINING or self.applier.applied_seq > 0:
            return  # a primary's snapshot (a fresh cluster) or a promotion reached this member meanwhile
        primaries = [s for s in statuses.values() if s.role == PRIMARY and s.has_state]
        if primaries:
            rebuild(self, max(primaries, key=lambda s: s.epoch).task)
            return
        with_state = [s for s in statuses.values() if s.has_state]
        if with_state and any(s.primary == self.task for s in with_state):
            _promote_successor(self, with_state)  # this task's dead predecessor was primary
        elif not with_state and self.members[0] == self.task and (
                len(statuses) == len(self.members) - 1 or time.monotonic() - began > _FRESH_WAIT):
            adopt_floors(self, list(statuses.values()))
            with self.view.becoming:  # a call its view brings here waits until the forwarder is made (member.py)
                view = self.view.start_primary(1, tuple(m for m in self.members if m != self.task))
                log.info("%s: primary of shard %d at epoch 1 (a fresh shard; backups %s)", self.task, self.shard,
                         ", ".join(view.backups) or "none")
                self._become_primary(view)
            return
        self._stopped.wait(0.2)


def adopt_floors(self: ShardReplication, statuses: list[ReplicaStatusReply], *, late: bool = False) -> None:
    """Member ``self`` of shard 0, becoming primary of a fresh shard (or, ``late``, primary already and its counter
    still at 0: nothing handed out, no restore's load yet), raises its global_step floor to the highest ``step_floor``
    of ``statuses`` (other members' journals) that names its journal's run (its own journal empty: the highest one's,
    run and all; another run's is kept, a later claim of that run starts at it):
    :meth:`~psflow.ps.global_step.GlobalStep.adopt`. A floor naming no run counts only where its own journal names
    none: a member's journal names the run of the first entry it follows (entries carry the primary's run, which
    ``psflow train``'s every chief Register names, a restore's too), so one that names none handed out none of a
    named run's values (written before runs were named, or by a run without an id). A journal that could not be
    written is logged: the floor is raised in this process only. Late, a restore whose ``BeginRestore`` read the floor already (the
    counter stays 0 until its load) goes on from the lower one: docs/replication.md, what still loses data."""
    step = self.service.global_step
    if step is None or late and step.value != 0:
        return
    for status in sorted(statuses, key=lambda s: s.step_floor or 0, reverse=True):
        if status.step_floor is None:
            continue
        try:
            raised = step.adopt(status.step_floor, status.step_run)
        except StepJournalError as e:
            log.error("%s: global_step floor raised to %d, run %s (%s's journal), in this process only: %s",
                      self.task, status.step_floor, status.step_run, status.task, e)
            continue
        if raised:
            log.warning("%s: global_step floor raised to %d, run %s: %s's journal bounds the values handed out "
                        "there", self.task, status.step_floor, status.step_run, status.task)


def _promote_successor(self: ShardReplication, with_state: list[ReplicaStatusReply]) -> None:
    order = {m: i for i, m in enumerate(self.members)}
    first = min(with_state, key=lambda s: order.get(s.task, len(order)))
    try:
        frame = PromoteRequest(self.shard, first.epoch, self.task).to_frame()
        self._channel(first.task).call(PromoteRequest.METHOD, frame.meta, timeout=self.config.status_timeout * 5)
        log.warning("%s: restarted; promoted %s (epoch %d -> %d) and rebuilds from it", self.task, first.task,
                    first.epoch, first.epoch + 1)
    except RpcError as e:
        log.info("%s: promoting %s: %s", self.task, first.task, e)


def rebuild_unwritten(self: ShardReplication, error: Exception) -> None:
    """An entry this member acknowledged (promised, :meth:`InOrderApplier.promise`) could not be written: it no
    longer holds the primary's state, so it stops counting as a backup (never promoted) and rebuilds."""
    primary = self.view.view.primary
    log.error("%s: could not write an entry it acknowledged (%s); rebuilding from %s", self.task, error, primary)
    if primary is None or primary == self.task:
        return
    self.view.begin_join(primary)
    threading.Thread(target=rebuild, args=(self, primary), name="psflow-replica-rebuild", daemon=True).start()


def rebuild(self: ShardReplication, primary: str) -> None:
    """Rebuilds member ``self`` from ``primary``'s snapshot (Join), retrying until it answers; a Join refused
    as not the primary's (deposed since it was read) goes to the member that says primary now. From the first
    try on, ``primary``'s entries count only from the sender the newest try started (each try has its own id:
    :meth:`ViewState.check_sender`)."""
    self.view.begin_join(primary)
    self.applier.expect_snapshot()
    while not self._stopped.is_set():
        try:
            # each try a new id: a try whose reply was lost may still have started a sender (refused then)
            frame = JoinRequest(self.shard, self.task, self.incarnation, self.view.next_join_id()).to_frame()
            reply = JoinReply.from_frame(self._channel(primary).call(JoinRequest.METHOD, frame.meta,
                                                                      timeout=self.config.status_timeout * 5))
        except FailedPreconditionError as e:  # not the primary (deposed meanwhile), or an older try's refusal
            log.info("%s: joining %s: %s", self.task, primary, e)
            self._stopped.wait(0.5)
            primary = _primary_now(self, primary)
            continue
        except RpcError as e:
            log.info("%s: joining %s: %s", self.task, primary, e)
            self._stopped.wait(0.5)
            continue
        self.view.joined(reply.epoch, primary)  # keeps what the Join's sender told it meanwhile
        self.deposal.rebuilt()
        log.info("%s: rebuilding shard %d from %s (epoch %d, snapshot %d)", self.task, self.shard, primary,
                 reply.epoch, reply.snapshot_seq)
        return


def _primary_now(self: ShardReplication, primary: str) -> str:
    """(:func:`rebuild`, its Join refused) The member that says it is the shard's primary at the highest epoch:
    ``primary`` itself where it does (an older try's Join refused: the next try's id is higher) or none answers;
    else the one it was deposed by (a Join read its status, then a client promoted another), which this member
    Joins instead, where it retried one that refuses every Join for ever (its Join in flight: no look again)."""
    statuses: list[ReplicaStatusReply] = []
    for member in self.members:
        if member != self.task:
            try:
                statuses.append(self._status_of(member))
            except RpcError:
                pass
    primaries = [s for s in statuses if s.role == PRIMARY]
    found = max(primaries, key=lambda s: s.epoch).task if primaries else primary
    if found == primary:
        return primary
    log.warning("%s: %s refused its Join (not shard %d's primary): joining %s", self.task, primary, self.shard,
                found)
    self.view.begin_join(found)
    return found


def watch_view(self: ShardReplication) -> None:
    """(Until the member stops) Every :data:`_WATCH_EVERY` s, a backup whose primary is at a higher epoch and
    counts it no more among its backups rebuilds from it (the module docstring); a primary that another member
    says it replaced at a higher epoch is deposed and rebuilds from it; a joining member its primary counts among
    its backups twice in a row Joins it again (:func:`_joining`). Other roles: nothing."""
    counted: tuple[str, int, int] | None = None  # (primary, epoch, its process) that counted it joining, last look
    while not self._stopped.wait(_WATCH_EVERY):
        view = self.view.view
        if view.role == PRIMARY:
            self._check_deposed()  # a backup promoted over it that no call told it of: deposed, it rebuilds
            continue
        if view.role == JOINING and view.primary is not None:
            counted = _joining(self, view, counted)
            continue
        counted = None
        if view.role != BACKUP or view.primary is None:
            continue
        try:
            status = self._status_of(view.primary)
        except RpcError:
            continue  # gone or slow: the clients promote a backup, whose entries tell this one
        if status.role != PRIMARY or status.epoch <= view.epoch or self.task in status.backups:
            continue
        if self.view.view != view:
            continue  # an entry or a view change came meanwhile: look again
        log.warning("%s: %s is shard %d's primary at epoch %d without this member (dropped at epoch %d while "
                    "unreachable): rejoining", self.task, status.task, self.shard, status.epoch, view.epoch)
        rebuild(self, status.task)


def _joining(self: ShardReplication, view: View, counted: tuple[str, int, int] | None) -> tuple[str, int, int] | None:
    """(:func:`watch_view`) A joining member whose primary counts it among its backups at this look and the last
    one, at the same epoch and process, its own view unchanged, Joins it again: that primary's sender was not
    started by this member's Join, which the member refuses for good (a primary process lost while the member
    joined it, restarted as a fresh shard's primary with it as a backup: every push waited for it). A member
    that caught up is told the view by the next entry, within milliseconds. Likewise one that primary has no
    sender to at both looks (no ``lag`` entry: it let the member go, unanswered too long or too far
    behind, :mod:`~psflow.ps.replication.joins`). Returns this look's count."""
    try:
        status = self._status_of(view.primary or "")
    except RpcError:
        return None
    seen = (status.task, status.epoch, status.incarnation)
    counts_it, sends = self.task in status.backups, self.task in status.lag
    if status.role != PRIMARY or (sends and not counts_it):
        return None
    if seen != counted or self.view.view != view or self.view.join_in_flight:
        return seen
    if counts_it:
        log.warning("%s: %s counts this joining member among shard %d's backups at epoch %d but sends it nothing it "
                    "takes (a sender its Join did not start: that primary's process restarted meanwhile): joining it "
                    "again", self.task, status.task, self.shard, status.epoch)
    else:
        log.warning("%s: %s has no sender to this joining member of shard %d at epoch %d (it let it go: unanswered "
                    "too long, or too far behind): joining it again", self.task, status.task, self.shard, status.epoch)
    rebuild(self, status.task)
    return None
