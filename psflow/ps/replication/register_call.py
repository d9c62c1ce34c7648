"""A replicated shard's ``Register`` (issue 28): what it records for the backups.

* The chief's call that creates the partitions is one entry holding the registration (layout, optimizer,
  update mode) and the small state (:func:`~psflow.ps.replication.snapshot.registration_entry`): each backup
  creates the same partitions from the same initializers, which are counter-based per element, so they equal
  the primary's bit for bit. A few KB cross the wire where a copy of the whole state (~520 MB for W&D) did.
  The creation and the entry are made under the forwarder's lock, so no other entry falls between them, and
  under the restore mutex (:meth:`~psflow.ps.restore_gate.RestoreGate.creating`, taken first), so no
  ``BeginRestore``, load or ``SetReady`` falls between the call's ask of the gate and its creation.
  The call waits for the backups' acknowledgement ``replica_timeout`` plus twice the seconds the creation
  took here (each backup does the same work).
* A call that creates nothing (a non-chief's, while it waits for the chief or compares its layout; the
  chief's repeat on a ready task) records no entry: it returns once every backup acknowledged the newest
  entry, which holds whatever it saw (readiness, the registration). Unless it dropped a ``Done`` of its
  worker (a process restarted after its worker finished, :meth:`~psflow.ps.run_end.RunLedger.joined`), or a
  chief's named another run than the one shard 0's global_step handed values out for (its claim,
  :meth:`~psflow.ps.global_step.GlobalStep.claim`): then it records the small state, so that a backup promoted
  next does not count that ``Done`` and end the run while the new process trains, nor keep naming the earlier
  run in its journal for the rest of the new one (:mod:`psflow.train.within_run`).

A joining member still starts from a full snapshot (:meth:`~psflow.ps.replication.joins.Joins.add_sender`), and
``LoadShard`` (a checkpoint's values) is still a full entry.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from psflow.ps.protocol import RegisterRequest, ReplicaEntry
from psflow.ps.replication.snapshot import registration_entry, task_state
from psflow.rpc.api import Handler, Reply
from psflow.rpc.framing import Frame

if TYPE_CHECKING:
    from psflow.ps.replication.member import ShardReplication

__all__ = ["replicated_register"]


def replicated_register(member: ShardReplication, handler: Handler) -> Handler:
    """``handler`` (the service's ``Register``) served on ``member``'s primary and replicated as above."""
    def call(frame: Frame) -> Reply:
        forwarder = member._check_primary()
        if not RegisterRequest.from_frame(frame).chief:  # never creates: nothing to record but a dropped Done
            done = _run_end(member)
            result = handler(frame)
            if _run_end(member) == done:
                forwarder.wait(forwarder.last_seq)
            else:
                forwarder.wait(forwarder.record(lambda seq: _state_entry(member, seq)))
            return result
        results: list[Reply] = []
        took = [0.0]

        def build(seq: int) -> ReplicaEntry | None:
            variables = member.service.variables
            before, done, began = variables.init_count, _run_end(member), time.monotonic()
            run = _step_run(member)
            results.append(handler(frame))
            took[0] = time.monotonic() - began
            if variables.init_count == before:  # a repeat: the partitions were there; a Done or the run may change
                changed = _run_end(member) != done or _step_run(member) != run
                return _state_entry(member, seq) if changed else None
            return registration_entry(seq, member.service, member.dedup, member.counts)
        # The restore mutex before the entries' lock (a sync step records its entry holding the step's lock, which
        # SetReady and a load take under the mutex): the service's Register, which takes it too, holds on to it.
        with member.service.gate.creating():
            seq = forwarder.record(build)
        forwarder.wait(seq, timeout=forwarder.replica_timeout + 2 * took[0])
        return results[0]
    return call


def _run_end(member: ShardReplication) -> object:
    """The shard's run ledger as replicated (the workers' ``Done``); None without one."""
    ledger = member.service.run_ledger
    return ledger.replica_state() if ledger is not None else None


def _step_run(member: ShardReplication) -> str | None:
    """The run shard 0's global_step hands values out for (None: none named, or another shard)."""
    step = member.service.clock.global_step
    return step.run if step is not None else None


def _state_entry(member: ShardReplication, seq: int) -> ReplicaEntry:
    """Entry ``seq``: the small state alone (a ``Done`` the call dropped)."""
    return ReplicaEntry(seq, task_state(member.service, member.dedup, member.counts), ())
