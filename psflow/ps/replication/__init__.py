"""Replicated ps shards (issue 28): primary-backup, forwarding what the primary applied, in order.

A shard's members (:mod:`psflow.cluster.replicas`) are its ps task and its ``ps_backup`` tasks. The primary
applies each state change as an unreplicated task does, then forwards its *result* -- the rows it wrote
(values, optimizer slots, moving averages, dynamic rows), global_step, reader positions, the worker ledger,
the dedup table -- never the request: a sync push's aggregation and a dynamic table's admissions depend on
arrival order, so replaying requests could diverge. A backup writes those bytes in sequence order, so a
promoted backup holds exactly the primary's state of every acknowledged update, bit for bit.

Modules (one concept each):

* ``view.py``: the view and epoch of a member, Promote's compare-and-set, refusing an older epoch;
* ``forwarder.py``: the primary's ordered forwarding, one sender per backup, batched, acked by sequence number;
* ``channels.py``: how a member reaches the others (gRPC for control, the run's carrier for Replicate);
* ``data_calls.py``: the primary's Push, PushPull (PushPullAckLater, Acked) and Pull: served, recorded, acknowledged, each
  push once;
* ``control_calls.py``: the primary's LoadShard, SetReady, BeginRestore, Done, FinalEval, ReaderPositions and Leave:
  served, recorded, acknowledged;
* ``joins.py``: the primary's senders: a member's Join, its start from a snapshot, its entry into the view once caught up;
* ``join_queue.py``: what queues for a joining member after its snapshot, what each entry weighs, the bound on it;
* ``applier.py``: a backup's in-order applier (buffers entries that arrive early);
* ``chunks.py``: an entry bigger than a message (a big shard's full entry) split into chunks and joined again;
* ``deltas.py``: capture and write of what a change wrote to a partition;
* ``snapshot.py``: the small state every entry carries, the full snapshot a joining member starts from;
* ``register_call.py``: ``Register`` replicated as the registration (the backups create the same partitions);
* ``dedup.py``: the dedup table (exactly-once pushes across a failover);
* ``carried.py``: state the stream carries only when it changes (and in full entries);
* ``leases.py``: shard 0's lease table (the embedded chief election), carried, served by the primary;
* ``fence_state.py``: the shard's fence (the highest chief epoch it accepted), carried;
* ``save_ledger.py``: shard 0's checkpoint ledger (``CheckpointStatus``: saves done and failed, the newest), carried;
* ``checkpoint_count.py``: the count of applied pushes a shard's checkpoints save and a restore sets back;
* ``after_acked.py``: work held until a call's entry is acknowledged (a primary ends the run after the last ``Done``);
* ``deposed.py``: a deposed primary (refuses writes, one warning, rebuilds);
* ``view_checks.py``: what the member a view change names checks itself first (the other side answers: refused);
* ``startup.py``: a member's place when its process starts (fresh primary, join, promote its successor)
  and its rebuild from a primary (Join);
* ``member.py``: :class:`ShardReplication`, which joins them to a ParameterService.
"""

from psflow.ps.replication.member import ReplicationConfig, ShardReplication

__all__ = ["ReplicationConfig", "ShardReplication"]
