"""One member of a replicated ps shard: its handlers, its role, and the replicated write path.

:class:`ShardReplication` joins the parts of this package to a :class:`~psflow.ps.service.ParameterService`:

* On the primary, every call that changes state (Push, PushPull, a Pull that creates dynamic rows, Register, LoadShard,
  SetReady, BeginRestore, Leave, Done, ReaderPositions; Fence, shard 0's leases and checkpoint ledger: carried.py) is
  served as unreplicated, then its result is recorded as the next entry (the rows it wrote, the small state, the dedup table;
  :mod:`~psflow.ps.replication.snapshot`) and the call returns once every backup of the view acknowledged it
  (:mod:`~psflow.ps.replication.forwarder`; waiting ``replica_timeout``, a LoadShard's whole-shard entry as
  long as its caller waits for the reply). A push already applied for its (worker, incarnation, push_id)
  gets its recorded reply (:mod:`~psflow.ps.replication.dedup`). In sync mode a step's rows, the records
  of every push it applied (dedup, examples, reader positions) and their count are one entry, so a backup
  never holds a step without its pushes' records (a resend after a failover gets its reply, never "stale").
  Push, PushPull (and PushPullAckLater with its Acked) and Pull are :mod:`~psflow.ps.replication.data_calls`;
  LoadShard, SetReady, BeginRestore, Done, FinalEval, ReaderPositions and Leave (and SaveShard and Stats, by a
  member holding the state) :mod:`~psflow.ps.replication.control_calls`; the entries' recording (:meth:`ShardReplication._record`) is here.
* Counts (``Stats``' ``replication`` entry): ``pushes_applied`` (numbered pushes applied here, each once) and
  ``pushes_acknowledged`` (the largest ``acked`` each client process reported, summed): docs/replication.md.
* On a backup or joining member, pushes and pulls are refused with FAILED_PRECONDITION naming the primary it
  knows (saves and Stats too, on a joining or deposed one); ``Replicate`` writes the primary's entries in order
  (applier.py). Promoted, it announces a run over.
* ``ReplicaStatus``, ``Promote``, ``DropBackup``, ``Join``: :mod:`psflow.ps.protocol.replication`. A Join's
  sender, from a snapshot, and its entry into the view once caught up: :mod:`~psflow.ps.replication.joins`.
* Start (:meth:`ShardReplication.start`): where the member stands, :mod:`~psflow.ps.replication.startup`.

An unreplicated service never builds one of these: its handlers are the service's own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import shard_members
from psflow.coord.lease_table import LeaseTable
from psflow.ps.protocol import (
    DropBackupRequest,
    FenceRequest,
    JoinRequest,
    PartDelta,
    PromoteRequest,
    PushReply,
    PushRequest,
    RegisterRequest,
    ReplicaEntry,
    ReplicaStatusReply,
    ReplicaStatusRequest,
    ReplicateReply,
    ReplicateRequest,
)
from psflow.ps.replication.applier import InOrderApplier
from psflow.ps.replication.carried import CarriedStates
from psflow.ps.replication.channels import MemberChannels
from psflow.ps.replication.checkpoint_count import CheckpointCount
from psflow.ps.replication.chunks import ChunkAssembler
from psflow.ps.replication.control_calls import control_handlers
from psflow.ps.replication.data_calls import DataCalls
from psflow.ps.replication.dedup import DedupTable
from psflow.ps.replication.deposed import Deposal
from psflow.ps.replication.fence_state import ReplicatedFence
from psflow.ps.replication.forwarder import Forwarder
from psflow.ps.replication.joins import Joins
from psflow.ps.replication.leases import ReplicatedLeases
from psflow.ps.replication.register_call import replicated_register
from psflow.ps.replication.save_ledger import ReplicatedSaveLedger
from psflow.ps.replication.snapshot import full_entry, task_state, write_entries
from psflow.ps.replication.startup import adopt_floors, find_place, rebuild, rebuild_unwritten
from psflow.ps.replication.view import BACKUP, DEPOSED, JOINING, PRIMARY, View, ViewState
from psflow.ps.replication.view_checks import refuse_drop, refuse_promotion
from psflow.ps.service import ParameterService
from psflow.rpc import after_reply
from psflow.rpc.api import Channel, Handler, InvalidRequest, PreconditionFailed, Reply, RpcError
from psflow.rpc.framing import Frame
from psflow.rpc.tls import TlsConfig

__all__ = ["ReplicationConfig", "ShardReplication"]

log = logging.getLogger("psflow.ps.replication")


@dataclass(frozen=True)
class ReplicationConfig:
    """Where this member stands: the cluster, its task name, and how it reaches the others.

    Attributes:
        cluster: the cluster (with its ``ps_backup`` job).
        task: this member, e.g. ``/job:ps_backup/task:0``.
        shard: the shard it is a member of.
        replica_timeout: seconds a call waits for a backup's acknowledgement before UNAVAILABLE.
        token: the cluster token (calls to the other members carry it).
        status_timeout: deadline of one ReplicaStatus call to another member.
        transport: the carrier of the primary's Replicate calls (``tcp`` where the members serve psflow's TCP
            carrier); other calls go over gRPC (:mod:`~psflow.ps.replication.channels`).
        tls: TLS of the calls to the other members (the task's; None: plain text).
        chunk_bytes: a Replicate call carries at most this many bytes of arrays; a bigger entry goes in chunks.
    """

    cluster: ClusterSpec
    task: str
    shard: int
    replica_timeout: float = 5.0
    token: str | None = None
    status_timeout: float = 1.0
    transport: str = "grpc"
    tls: TlsConfig | None = None
    chunk_bytes: int = 64 << 20


class ShardReplication:
    """The replication of one shard member's :class:`ParameterService`. Thread-safe."""

    def __init__(self, config: ReplicationConfig, service: ParameterService,
                 connect: Callable[[str], Channel] | None = None) -> None:
        """``connect``: the channel to another member by task name (default: :mod:`.channels`; an in-process
        test joins members with :class:`~psflow.rpc.inprocess.InProcessChannel`)."""
        self.config, self.service = config, service
        self.task, self.shard = config.task, config.shard
        self.members = shard_members(config.cluster, config.shard)
        if self.task not in self.members:
            raise ValueError(f"{self.task} is not a member of shard {self.shard} ({', '.join(self.members)})")
        self.incarnation = time.time_ns()
        self.view = ViewState(self.task, self.shard, self.members)
        self.deposal = Deposal(self.task, self.shard)
        self.dedup = DedupTable(self.task)
        self.counts = {"pushes_applied": 0}
        self.applier, self.chunks = InOrderApplier(lambda e: self._write_many([e]), self._write_many), ChunkAssembler()
        self.forwarder: Forwarder | None = None
        self.fence = ReplicatedFence(self)
        self.carried = CarriedStates(self, self.fence)  # and shard 0's lease table, when served (serve_leases)
        self.saves = self.carried.add(ReplicatedSaveLedger(self, service.saves)) if service.global_step is not None else None
        self.channels = MemberChannels(config.cluster, token=config.token, tls=config.tls, transport=config.transport,
                                       status_timeout=config.status_timeout, replica_timeout=config.replica_timeout,
                                       connect=connect)
        self._channel, self._status_of = self.channels.get, self.channels.status_of  # control calls to a member
        self._stopped = threading.Event()
        self.joins = Joins(self)  # Join, and the forwarder's senders
        self.data = DataCalls(self)  # Push, PushPull, Pull
        service.mode.on_step_applied = self.data.step_applied
        service._checkpoints.push_count = CheckpointCount(self.counts, self.dedup, self.data.apply_lock,
                                                          service.mode)  # its saves

    # ---- handlers ---------------------------------------------------------------------------------
    def handlers(self, table: dict[str, Handler]) -> dict[str, Handler]:
        """The service's handler table with the replicated calls in place of its own, and this package's."""
        out = dict(table)
        out.update(self.data.handlers())
        out.update(control_handlers(self, table))  # LoadShard, SetReady, ..., Leave; SaveShard, Stats (reads)
        out[RegisterRequest.METHOD] = replicated_register(self, table[RegisterRequest.METHOD])
        out[FenceRequest.METHOD] = self.fence.handler(table[FenceRequest.METHOD])
        out.update(self.saves.handlers(table) if self.saves is not None else {})
        out.update({ReplicaStatusRequest.METHOD: self.replica_status, PromoteRequest.METHOD: self.promote,
                    DropBackupRequest.METHOD: self.drop_backup, JoinRequest.METHOD: self.join,
                    ReplicateRequest.METHOD: self.replicate})
        return out

    def serve_leases(self, table: LeaseTable) -> dict[str, Handler]:
        """Replicates ``table`` (the embedded election's, on shard 0) with this shard: its handlers (leases.py)."""
        return self.carried.add(ReplicatedLeases(self, table)).handlers()

    # ---- status -----------------------------------------------------------------------------------
    @property
    def has_state(self) -> bool:
        """Whether this member holds every acknowledged update (a primary, or a backup in the view)."""
        return self.view.view.role in (PRIMARY, BACKUP) and self.deposal.by is None

    def status(self) -> ReplicaStatusReply:
        view, forwarder = self.view.view, self.forwarder
        lag = {m: n for m, (n, _) in forwarder.lag().items()} if forwarder is not None and view.role == PRIMARY else {}
        floor, run = step.handed_out() if (step := self.service.global_step) is not None else (None, None)
        return ReplicaStatusReply(self.task, self.shard, view.role, view.epoch, view.primary, view.backups,
                                  self._applied_seq(), self.has_state, self.incarnation, lag, False, floor, run)

    def stats(self) -> dict[str, Any]:
        """The ``replication`` entry of ``Stats``: shard, role, epoch, primary, backups, lag, the push counts."""
        view, forwarder = self.view.view, self.forwarder
        lag: dict[str, dict[str, float]] = {}
        if forwarder is not None and view.role == PRIMARY:
            lag = {m: {"entries": n, "seconds": round(s, 3)} for m, (n, s) in forwarder.lag().items()}
        return {"shard": self.shard, "task": self.task, "role": view.role, "epoch": view.epoch,
                "primary": view.primary, "backups": list(view.backups), "lag": lag,
                "applied_seq": self._applied_seq(), **self.counts, "pushes_acknowledged": self.dedup.acknowledged(),
                # per client process: what the run's updates_lost adds up (psflow.status.replication)
                "acked_by_process": self.dedup.acked_by(self.shard), "applied_by_process": self.dedup.applied_by(),
                "counts_exact": self.dedup.exact}

    def replica_status(self, frame: Frame) -> Reply:
        """ReplicaStatus: a backup first writes the entries handed over to it (no wait for the others), so
        ``applied_seq`` is what it holds, not up to ``COALESCE`` - 1 entries behind (applier.py)."""
        if self.view.view.role != PRIMARY:
            self.applier.settle(0.0)
        return _reply(self.status())

    def _applied_seq(self) -> int:
        forwarder = self.forwarder
        if forwarder is not None and self.view.view.role == PRIMARY:
            return forwarder.last_seq
        return self.applier.applied_seq

    # ---- the primary's write path (data_calls.py, control_calls.py) --------------------------------
    def _check_primary(self, shard_epoch: int | None = None) -> Forwarder:
        if self.deposal.by is not None:
            raise PreconditionFailed(self.deposal.message())
        view, forwarder = self.view.view, self.forwarder
        if view.role == PRIMARY and forwarder is None:  # becoming primary (promote, startup): wait until it is
            view, forwarder = self.view.settled(), self.forwarder
        if view.role != PRIMARY or forwarder is None:
            raise PreconditionFailed(f"{self.task}: not the primary of shard {self.shard} ({view.role}); "
                                     f"{view.describe()}")
        if shard_epoch is not None and shard_epoch > view.epoch:
            threading.Thread(target=self._check_deposed, name="psflow-replica-check", daemon=True).start()
            raise PreconditionFailed(f"{self.task}: the client routes shard {self.shard} by epoch {shard_epoch}, "
                                     f"this member is primary at epoch {view.epoch}: ask the members' ReplicaStatus")
        return forwarder

    def _record(self, forwarder: Forwarder, parts: Callable[[], list[PartDelta]],
                pushes: list[tuple[PushRequest, PushReply]] | None = None, full: bool = False) -> int:
        """Records the next entry (``parts()`` copied under the forwarder's lock) and returns its seq;
        ``pushes``: the pushes it applies, recorded in it (their dedup record, count and ``acked``)."""
        def build(seq: int) -> ReplicaEntry:
            for request, reply in pushes or ():
                tag = request.worker
                self.dedup.report_acked(tag.worker, tag.incarnation, tag.acked, tag.acked_all)
                if tag.push_id is not None:  # a numbered push, which its client counts
                    self.dedup.record(tag.worker, tag.incarnation, tag.push_id, reply.meta(), seq)
                    self.counts["pushes_applied"] += 1
            if full:
                return self._full_entry(seq)
            return ReplicaEntry(seq, task_state(self.service, self.dedup, self.counts), tuple(parts()))
        return forwarder.record(build)

    # ---- a backup's side --------------------------------------------------------------------------
    def replicate(self, frame: Frame) -> Reply:
        request = ReplicateRequest.from_frame(frame)
        if request.member != self.task:
            raise InvalidRequest(f"{self.task}: entries addressed to {request.member}")
        # a replaced sender's call (held up across a restart or a Join) would set back what newer calls told it
        self.view.check_sender(request.primary, request.epoch, request.incarnation, self.incarnation, request.join_id)
        view = self.view.view
        if view.role == PRIMARY and request.epoch > view.epoch:  # another member was promoted over this one
            self._deposed(request.primary, request.epoch)
            raise PreconditionFailed(f"{self.task}: deposed at epoch {view.epoch}; rebuilding from {request.primary}")
        if view.role == DEPOSED:
            raise PreconditionFailed(f"{self.task}: deposed; rebuilding from {self.deposal.by}")
        if request.primary != view.primary and view.primary is not None:
            self.applier.expect_snapshot()  # a new primary's entries follow its snapshot
        self.view.check_entries(request.epoch, request.primary)
        entries = self.chunks.whole(request.entries)  # a chunked entry: once its last chunk is here
        # Over a carrier that runs work after the reply (tcp), entries that continue what it holds are written
        # after it, several together (applier.py); else (gRPC, a snapshot, a gap) now.
        if after_reply.deferrable() and (promised := self.applier.promise(entries)) is not None:
            after_reply.defer(lambda: self.applier.apply_promised(entries, lambda e: rebuild_unwritten(self, e)))
        else:
            promised = self.applier.offer(entries, wait=self.config.replica_timeout)
        snapshot_taken = self.applier.received_seq > 0 or any(e.full for e in entries)
        role = BACKUP if self.task in request.backups and snapshot_taken else JOINING
        self.view.learn(request.epoch, request.primary, request.backups, role)
        return _reply(ReplicateReply(promised))

    def _write_many(self, entries: list[ReplicaEntry]) -> None:
        write_entries(self.service, self.dedup, self.counts, entries)  # one entry: write_entry
        self.carried.written(entries)

    def _full_entry(self, seq: int) -> ReplicaEntry:
        return self.carried.carried(full_entry(seq, self.service, self.dedup, self.counts))

    # ---- view changes -----------------------------------------------------------------------------
    def promote(self, frame: Frame) -> Reply:
        request = PromoteRequest.from_frame(frame)
        self._check_shard(request.shard)
        if not self.applier.settle(self.config.replica_timeout):  # the entries it acknowledged, all written
            raise PreconditionFailed(f"{self.task}: still writing the entries it acknowledged; ask again")
        refuse_promotion(self._status_of, self.task, self.view.view, request.expected_epoch, self.shard)
        with self.view.becoming:  # a push its new view brings here waits until the forwarder is made
            view, changed = self.view.promote(request.expected_epoch, self.has_state)
            if changed:
                log.warning("%s: promoted to primary of shard %d at epoch %d by %s (backups: %s)", self.task,
                            self.shard, view.epoch, request.requester, ", ".join(view.backups) or "none until a member rejoins")
                self._become_primary(view)
        return _reply(replace(self.status(), view_changed=changed))

    def drop_backup(self, frame: Frame) -> Reply:
        request = DropBackupRequest.from_frame(frame)
        self._check_shard(request.shard)
        checked = self.view.view  # a member joining here, caught up before the drop, was asked nothing: kept
        refuse_drop(self._status_of, self.task, checked, request.backup)
        # after a becoming primary's forwarder is made: one made after the drop waited for the backup it dropped
        # (the promotion's view), and nothing took its sender out
        with self.view.becoming:
            view, changed = self.view.drop_backup(request.expected_epoch, request.backup, checked)
            forwarder = self.forwarder
            if changed and forwarder is not None:
                log.warning("%s: shard %d goes on without %s at epoch %d (%s cannot reach it either)", self.task,
                            self.shard, request.backup, view.epoch, request.requester)
                with forwarder.lock:
                    sender = forwarder.senders.pop(request.backup, None)
                if sender is not None:
                    sender.stop()
                forwarder.set_waited(view.backups)
        return _reply(replace(self.status(), view_changed=changed))

    def join(self, frame: Frame) -> Reply:
        """``Join``: a sender to the member that asks, from a snapshot (:meth:`Joins.join`)."""
        return self.joins.join(frame)

    def _on_refused(self, member: str, error: str) -> None:
        """``member`` refused entries as deposed: ask it who is primary at which epoch; this one is deposed."""
        try:
            status = self._status_of(member)
        except RpcError:
            return
        if status.epoch > self.view.view.epoch:
            self._deposed(status.primary, status.epoch)

    def _deposed(self, primary: str | None, epoch: int) -> None:
        if not self.deposal.depose(primary, epoch):
            return
        view = self.view.set(View(epoch, primary, (), DEPOSED))
        forwarder, self.forwarder = self.forwarder, None
        if forwarder is not None:
            forwarder.fail(self.deposal.message())
            forwarder.stop()
        if view.primary is not None:
            threading.Thread(target=rebuild, args=(self, view.primary), name="psflow-replica-rebuild",
                             daemon=True).start()

    def _check_deposed(self) -> None:
        for member in self.members:
            if member == self.task:
                continue
            try:
                status = self._status_of(member)
            except RpcError:
                continue
            adopt_floors(self, [status], late=True)  # a member back after the fresh shard started (startup.py)
            if status.role == PRIMARY and status.epoch > self.view.view.epoch and status.has_state:
                self._deposed(status.primary, status.epoch)
                return

    def _become_primary(self, view: View) -> None:
        forwarder = Forwarder(self.shard, self.config.replica_timeout, first_seq=self.applier.applied_seq)
        self.carried.promoted()
        for member in view.backups:  # each rebuilds from this one's state
            self.joins.add_sender(forwarder, member)
        forwarder.set_waited(view.backups)
        # published with its senders: a Join served sooner (the member saw this one primary) had its sender
        # replaced by a Join-less one it refuses, and its view restored with the member waited for, for good
        self.forwarder = forwarder
        now = self.view.view
        if self.deposal.by is not None or now.role != PRIMARY:  # deposed meanwhile (a sender refused)
            self.forwarder = None
            # deposed and already rebuilt as a backup: no deposal stands, its message would name none
            forwarder.fail(self.deposal.message() if self.deposal.by is not None else
                           f"{self.task}: no longer becoming primary of shard {self.shard} at epoch {view.epoch}: "
                           f"deposed and rebuilt meanwhile ({now.role}; {now.describe()})")
            forwarder.stop()
            return
        if self.service.run_ledger is not None:  # the workers' Done it holds may say the run is over already
            self.service.run_ledger.announce_if_over()

    def _check_shard(self, shard: int) -> None:
        if shard != self.shard:
            raise InvalidRequest(f"{self.task} is a member of shard {self.shard}, not {shard}")

    # ---- start and rebuild ------------------------------------------------------------------------
    def start(self) -> None:
        """Finds this member's place (see the module docstring), in the background."""
        threading.Thread(target=find_place, args=(self,), name="psflow-replica-start", daemon=True).start()

    def stop(self) -> None:
        self._stopped.set()
        if self.forwarder is not None:
            self.forwarder.stop()


def _reply(message: Any) -> Reply:
    frame = message.to_frame()
    return frame.meta, frame.arrays
