"""A replicated shard's ``Stats`` is answered by a member holding its state only, the primary or a backup of its
view (psflow/ps/replication/control_calls.py), as ``SaveShard`` is.

Every member answered ``Stats`` from its own state, a restarted member still rebuilding from the primary (empty)
and a deposed old primary (stale) too. A client whose route to a shard is such a member (no call of it failed
since the failover: a lingering worker, the launcher, a chief between saves) read their figures as the shard's:
:func:`psflow.train.state_loss.ps_states` took the empty member for a ps task that lost its variables (the
chief then restores every task from a checkpoint, the pushes since lost, or, without one, the run stops with
StateLostError although the promoted backup holds every acknowledged push), and ``client.stats()`` (the
summaries' global_step and examples, the launcher's progress line) read global_step 0. Such a member now refuses
with FAILED_PRECONDITION naming the primary it knows, which the client's router follows (psflow/ps/failover.py).
In-process members (tests/replica_shard.py), no sockets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
from failed_over_shard import BACKUP, failed_over, numbered_push, routed_client, trained
from replica_shard import PRIMARY, InProcessShard

from psflow.optim import OptimizerSpec
from psflow.ps.protocol import JoinRequest, StatsReply
from psflow.rpc.api import FailedPreconditionError
from psflow.rpc.framing import Frame
from psflow.train.recovery import ClusterRecovery
from psflow.train.state_loss import lost_tasks, ps_states

pytestmark = pytest.mark.timeout(60)

def _stats(shard: InProcessShard, member: str) -> StatsReply:
    return StatsReply.from_frame(shard.call(member, "Stats", Frame({})))


def test_a_restarted_member_rebuilding_refuses_stats_naming_the_primary(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard, joined = failed_over(make_shard, ready=True)
    try:
        with pytest.raises(FailedPreconditionError, match=r"not the primary of shard 0 \(joining\)"):
            _stats(shard, PRIMARY)  # before: registered False, global_step 0
        assert _stats(shard, BACKUP).global_step == 5
    finally:
        joined.set()
    shard.wait_view(BACKUP, (PRIMARY,))  # rebuilt: a backup of the view, answering from every entry it acknowledged
    assert _stats(shard, PRIMARY).global_step == 5


def test_a_deposed_primary_refuses_stats(make_shard: Callable[..., InProcessShard]) -> None:
    """ps:0 cut off, ps_backup:0 promoted over it and pushed to; back, ps:0 learns it was deposed (watch_view) and
    rebuilds (its Join held): deposed, then joining, it never answers its own stale figures (global_step 5)."""
    shard = trained(make_shard, ready=True)
    shard.cut.add(PRIMARY)
    assert shard.promote(BACKUP, 1).epoch == 2
    shard.push(BACKUP, numbered_push(6))
    joined = threading.Event()
    shard.held_requests[(BACKUP, JoinRequest.METHOD)] = joined
    shard.cut.discard(PRIMARY)
    old = shard.replicas[PRIMARY]
    try:
        shard.wait(lambda: old.deposal.by is not None or old.view.view.role == "joining", "ps:0 deposed")
        with pytest.raises(FailedPreconditionError, match="deposed|not the primary of shard 0"):
            _stats(shard, PRIMARY)  # before: ready, global_step 5 (the shard's is 6)
        assert _stats(shard, BACKUP).global_step == 6
    finally:
        joined.set()


def test_a_clients_stats_follow_the_shard_to_its_primary(make_shard: Callable[..., InProcessShard]) -> None:
    """``client.stats()``: the summaries' global_step and examples (psflow/train/summary_hook.py), the launcher's
    progress line (psflow/launch/local.py, 2 s deadline), ``client.global_step()``."""
    shard, joined = failed_over(make_shard, ready=True)
    client = routed_client(shard)
    try:
        stats = client.stats(timeout=2.0)
        assert (stats["global_step"], stats["registered"]) == (5, True), stats  # before: (0, False), ps:0's
        assert client.channels[0].task == BACKUP
        assert client.global_step() == 5
    finally:
        joined.set()
        client.close()


def test_the_state_loss_check_takes_no_rebuilding_member_for_a_lost_shard(
        make_shard: Callable[..., InProcessShard]) -> None:
    """:func:`ps_states` (the chief's join, a worker's recovery, the in-graph client) reads the primary's state:
    nothing lost, nothing to restore. Before, shard 0 read as empty: a worker of a run without a checkpoint
    directory stopped with StateLostError ('/job:ps/task:0 restarted with no checkpoint to restore from'), and
    one with a checkpoint waited for its chief to restore every ps task from it (the pushes since, lost)."""
    shard, joined = failed_over(make_shard, ready=True)
    client = routed_client(shard)
    try:
        states = ps_states(client)
        assert lost_tasks(states) == ([], [0]), states  # before: ([0], [])
        state = states[0]
        assert state is not None and (state.ready, state.global_step) == (True, 5), state
        recovery = ClusterRecovery(client, OptimizerSpec("adagrad", {"learning_rate": 0.1}), checkpoint_dir=None,
                                   leader=lambda: None, timeout=5.0, generation=0)
        assert not recovery.needed()
        assert recovery.wait() == (False, None)  # before: StateLostError
    finally:
        joined.set()
        client.close()

