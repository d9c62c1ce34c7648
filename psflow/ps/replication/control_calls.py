"""A replicated shard primary's control calls, recorded after they are served: ``LoadShard``, ``SetReady``,
``BeginRestore``, ``Done``, ``FinalEval``, ``ReaderPositions`` and ``Leave``; and the reads of the shard's state,
``SaveShard`` and ``Stats``, served by the members holding it alone.

:func:`control_handlers` wraps the service's own handlers of these calls on a
:class:`~psflow.ps.replication.member.ShardReplication` (``Register``: :mod:`~psflow.ps.replication.register_call`;
``Fence``, shard 0's leases and checkpoint ledger: :mod:`~psflow.ps.replication.carried`). Guarantees:

* **Primary only.** A call on a member that is not the primary of its view, or is deposed, is refused with
  FAILED_PRECONDITION naming the primary it knows, before it is served.
* **Served, then recorded, then acknowledged.** The call is served as an unreplicated task serves it; then its
  result is recorded as the member's next entry (:meth:`ShardReplication._record`) and the call returns once
  every backup of the view acknowledged that entry (UNAVAILABLE naming the backup after the wait below).
  ``LoadShard`` (a checkpoint's values) is a full entry, the whole shard; the others carry the small state
  (:func:`~psflow.ps.replication.snapshot.task_state`).
* **The wait.** ``replica_timeout``; a ``LoadShard``'s: until just before its caller stops waiting
  (:attr:`~psflow.ps.protocol.LoadShardRequest.reply_within_ms`), ``replica_timeout`` at least, so the caller hears
  which backup failed (:func:`full_wait`).
* **A save reads a member holding the shard's state.** ``SaveShard`` (a checkpoint's shard) changes nothing and
  is not recorded; the primary serves it, and a backup of its view (its state as of every entry it acknowledged,
  every acknowledged push among them: the bit-for-bit checks of a backup read it). A member without the state
  refuses it (the primary-only refusal above, asked before the snapshot and again after it: a member deposed
  meanwhile refuses, still deposed or rebuilding from the new primary already, its snapshot may lack what the new
  primary applied since or hold entries it lacks): a restarted one rebuilding from the primary holds none of the
  shard's values (it answered a final save with an empty 72-byte shard file once, and the run rolled back to an
  older checkpoint with the promoted primary holding every update). The chief's client sends a save to the
  primary it knows; refused, it follows the shard to its primary now (:class:`~psflow.ps.failover.ShardRouter`)
  and sends it there.
* **Stats, the same rule.** ``Stats`` (a member's state and counters: global_step, registered, ready, the
  generation, examples, the ``replication`` entry) is served as ``SaveShard`` is, by the primary and the backups
  of its view (as of every entry they acknowledged), refused by a member without the state. Every reader of a
  shard's figures goes through this one rule: a client (the chief's and a worker's state-loss and restore checks,
  :func:`psflow.train.state_loss.ps_states`; ``ParameterClient.stats``: summaries, the launcher's progress)
  follows the refusal to the primary as a save does; a reader of every member (the launcher's end, the status
  page: :func:`psflow.status.replication.shard_primaries`) leaves it out. A rebuilding member's answer
  (registered false, global_step 0) once read as a lost shard: a worker without a checkpoint directory stopped
  with StateLostError while the promoted backup held every acknowledged push, and one with a checkpoint waited
  for the chief to restore every task from it.
* **Leave counts.** A ``Leave``'s final ``acked`` count of the process that leaves is taken into the dedup
  table's counts (``pushes_acknowledged``) before its entry is recorded.

Thread-safe: the member's forwarder orders the entries.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from psflow.ps.protocol import LeaveRequest, LoadShardRequest
from psflow.ps.replication.view import BACKUP
from psflow.rpc.api import Handler, PreconditionFailed, Reply
from psflow.rpc.framing import Frame

if TYPE_CHECKING:
    from psflow.ps.replication.member import ShardReplication

__all__ = ["control_handlers", "full_wait"]

_FULL_CALLS = ("LoadShard",)  # calls replicated whole (a full entry; Register: register_call.py), then by small state:
_STATE_CALLS = ("SetReady", "BeginRestore", "Done", "FinalEval", "ReaderPositions")
_READS = ("SaveShard", "Stats")  # reads of the shard's state (a checkpoint's shard, its figures), not recorded
#: Seconds a LoadShard's wait for its backups ends before its caller's deadline (at most a tenth of it), so
#: its UNAVAILABLE reply, naming the backup, reaches the caller before the caller gives up.
_REPLY_MARGIN = 1.0


def control_handlers(member: ShardReplication, table: dict[str, Handler]) -> dict[str, Handler]:
    """The replicated handlers, on ``member``, of the calls above that ``table`` (the service's) serves."""
    out = {method: _replicated(member, table[method], full=method in _FULL_CALLS)
           for method in _FULL_CALLS + _STATE_CALLS if method in table}
    if LeaveRequest.METHOD in table:
        out[LeaveRequest.METHOD] = _leave(member, table[LeaveRequest.METHOD])
    for method in _READS:
        if method in table:
            out[method] = _state_read(member, method,
                                      member.applier.settled(table[method], member.config.replica_timeout))
    return out


def _state_read(member: ShardReplication, method: str, handler: Handler) -> Handler:
    """``handler`` (``method``, a read of the shard's state: ``SaveShard``, ``Stats``) served by a member holding
    it, the primary or a backup of its view; refused with FAILED_PRECONDITION naming the primary this member knows
    by any other before it reads, and after it where the member lost the state meanwhile (the module docstring)."""
    def call(frame: Frame) -> Reply:
        if member.view.view.role == BACKUP and member.has_state:
            result = handler(frame)
            if not member.has_state:  # deposed, dropped or rejoining while it read: not the shard's
                raise PreconditionFailed(f"{member.task}: lost shard {member.shard}'s state while its {method} was "
                                         f"served ({member.view.view.describe()}); its answer is not the shard's")
            return result
        forwarder = member._check_primary()
        result = handler(frame)
        # Deposed meanwhile: still, or deposed and rebuilt already (a Join takes milliseconds, a big shard's write
        # longer: the deposal is cleared then, the member joining). Its forwarder goes with a deposal, and a member
        # primary again has a new one: the same forwarder is a primary never deposed since the snapshot.
        if member.deposal.by is not None or member.forwarder is not forwarder:
            raise PreconditionFailed(f"{member.task}: deposed while its {method} was served (shard {member.shard}'s "
                                     f"{member.view.view.describe()}); its answer is not the shard's")
        return result
    return call


def _replicated(member: ShardReplication, handler: Handler, *, full: bool) -> Handler:
    def call(frame: Frame) -> Reply:
        forwarder = member._check_primary()
        began = time.monotonic()
        result = handler(frame)
        seq = member._record(forwarder, lambda: [], full=full)
        forwarder.wait(seq, timeout=full_wait(frame, began, member.config.replica_timeout) if full else None)
        return result
    return call


def full_wait(frame: Frame, began: float, replica_timeout: float) -> float:
    """Seconds a ``LoadShard`` served since ``began`` waits for its backups' acknowledgement of its full entry
    (the whole shard, which may take a backup longer than ``replica_timeout`` to receive and write): until
    just before its caller stops waiting (``reply_within_ms``, the call's deadline), so the caller hears
    which backup failed; ``replica_timeout`` at least. A call without it: ``replica_timeout`` plus twice
    the seconds the load took here (each backup writes the same), as ``Register`` waits."""
    within = LoadShardRequest.from_frame(frame).reply_within_ms
    elapsed = time.monotonic() - began
    if within is None:
        return replica_timeout + 2 * elapsed
    return max(replica_timeout, within / 1000 - elapsed - min(_REPLY_MARGIN, within / 10000))


def _leave(member: ShardReplication, handler: Handler) -> Handler:
    """``Leave``: served, with the final ``acked`` count of the process that leaves (its incarnation; an
    older client's Leave: the worker's newest), then replicated."""
    def call(frame: Frame) -> Reply:
        forwarder = member._check_primary()
        request = LeaveRequest.from_frame(frame)
        result = handler(frame)
        incarnation = request.incarnation or member.service.workers.incarnation_of(request.worker)
        member.dedup.report_acked(request.worker, incarnation, request.acked, request.acked_all)
        forwarder.wait(member._record(forwarder, lambda: []))
        return result
    return call
