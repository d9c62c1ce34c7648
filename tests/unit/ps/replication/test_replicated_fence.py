"""A replicated shard's fence (the highest chief epoch it accepted) is carried to its backups (issue 28,
psflow/ps/replication/fence_state.py): a promoted backup, or a member rebuilt from the primary's snapshot,
refuses a deposed chief's epoch as the primary did. In-process members (tests/replica_shard.py), no sockets."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, Link, backup

from psflow.coord import FencedError, Lease
from psflow.ps.control_routes import ControlRouter
from psflow.ps.failover import ShardRouter
from psflow.ps.fencing import FencedWriter
from psflow.ps.protocol import FenceRequest, JoinRequest
from psflow.rpc.api import FailedPreconditionError, FencedOffError, TaskUnavailableError
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)


def fence(shard: InProcessShard, member: str, epoch: int) -> Frame:
    return shard.call(member, FenceRequest.METHOD, FenceRequest(epoch, holder=f"chief-{epoch}#1").to_frame())


@pytest.fixture
def shard(make_shard: Callable[..., InProcessShard]) -> InProcessShard:
    made = make_shard(backups=1)
    made.start()
    made.wait_view()
    return made


def test_a_promoted_backup_refuses_the_epoch_its_primary_refused(shard: InProcessShard) -> None:
    fence(shard, PRIMARY, 5)
    fence(shard, PRIMARY, 6)  # a new chief fences the ps tasks
    assert shard.services[backup(0)].fence.highest() == 6  # before the reply
    shard.cut.add(PRIMARY)
    shard.promote(backup(0), 1)
    with pytest.raises(FailedPreconditionError, match="epoch 5 refused: 'chief' is fenced at epoch 6"):
        fence(shard, backup(0), 5)  # the deposed chief wakes up
    fence(shard, backup(0), 6)


def test_a_rebuilt_members_snapshot_carries_the_fence(shard: InProcessShard) -> None:
    fence(shard, PRIMARY, 6)
    shard.add(backup(0))  # a new process of the backup: empty, it rebuilds from the primary's snapshot
    shard.start(backup(0))
    shard.wait_view()
    assert shard.services[backup(0)].fence.highest() == 6


def test_a_fence_a_backup_serves_is_served_as_unreplicated(shard: InProcessShard) -> None:
    fence(shard, backup(0), 4)
    assert shard.services[backup(0)].fence.highest() == 4 and shard.services[PRIMARY].fence.highest() == 0


def _deposed(shard: InProcessShard) -> None:
    """The primary is cut off, a client promotes its backup, and the old primary is back, still believing it
    is primary (it learns otherwise from its next entry, which the new primary refuses)."""
    shard.cut.add(PRIMARY)
    shard.promote(backup(0), 1)
    shard.cut.discard(PRIMARY)


def test_a_primary_deposed_while_it_waits_for_its_backups_refuses_the_fence_naming_the_new_primary(
        shard: InProcessShard) -> None:
    """Issue 28's review: answered as done, the new chief would believe every ps task fenced at its epoch while
    the shard's new primary never heard of it (and would accept the deposed chief's writes)."""
    fence(shard, PRIMARY, 5)
    _deposed(shard)
    with pytest.raises(FailedPreconditionError, match=f"deposed: shard 0's primary is {backup(0)}"):
        fence(shard, PRIMARY, 6)  # its entry is refused by the new primary: deposed while it waited
    assert shard.services[backup(0)].fence.highest() == 5


def test_a_primary_that_knows_it_is_deposed_refuses_the_fence_naming_the_new_primary(shard: InProcessShard) -> None:
    _deposed(shard)
    # The deposed member's rebuild (a Join to the new primary, started the moment it learns) is held up, so it
    # is still deposed at the next call: before, the rebuild could finish first and the member, now a backup,
    # served the Fence as an unreplicated task (18 of 25 runs failed alone).
    rejoin = threading.Event()
    shard.held_requests[(backup(0), JoinRequest.METHOD)] = rejoin
    try:
        with pytest.raises(FailedPreconditionError, match="deposed"):
            fence(shard, PRIMARY, 6)
        assert shard.replicas[PRIMARY].deposal.by is not None
        with pytest.raises(FailedPreconditionError, match=f"deposed: shard 0's primary is {backup(0)}"):
            fence(shard, PRIMARY, 7)  # deposed already: refused at once, as a push is
        fence(shard, backup(0), 7)  # the caller resends to the new primary, which records it
        assert shard.services[backup(0)].fence.highest() == 7
    finally:
        shard.replicas[PRIMARY].stop()
        rejoin.set()


def test_a_fence_its_backup_did_not_acknowledge_in_time_is_answered_unavailable(
        make_shard: Callable[..., InProcessShard]) -> None:
    slow = make_shard(backups=1, replica_timeout=0.3)
    slow.start()
    slow.wait_view()
    slow.cut.add(backup(0))  # unreachable, not dropped from the view yet (a client drops it)
    with pytest.raises(TaskUnavailableError, match=f"backup {backup(0)} did not acknowledge"):
        fence(slow, PRIMARY, 6)
    slow.cut.discard(backup(0))
    # The sender's next try after the cut may be up to a backoff away: the resend waits as long as it takes
    # (a safety net), so it does not depend on the backup acknowledging within 0.3 s on a busy machine.
    forwarder = slow.replicas[PRIMARY].forwarder
    assert forwarder is not None
    forwarder.replica_timeout = 60.0
    fence(slow, PRIMARY, 6)  # resent: the same token again, carried this time
    assert slow.services[backup(0)].fence.highest() == 6


def test_the_new_chiefs_fence_reaches_the_shards_new_primary(shard: InProcessShard) -> None:
    """The chief fences every shard when it is elected (psflow/train/worker.py). Sent to the member its client
    last knew as primary, now deposed, the Fence is refused (above): not by the fence (no newer chief's epoch was
    seen), so the FencedWriter raises that refusal, not FencedError; through the ControlRouter's channels it
    reaches the new primary, which records the token, and refuses an older chief's epoch as fenced."""
    _deposed(shard)  # the old primary does not know yet
    lease = Lease("chief", "/job:worker/task:1", "/job:worker/task:1#1", 9, 10.0, time.monotonic() + 10)
    with pytest.raises(FailedPreconditionError, match="deposed") as refused:
        FencedWriter({0: Link(shard, PRIMARY)}, lease).check()  # the route the data client last followed
    assert not isinstance(refused.value, FencedOffError)
    router = ShardRouter(shard.cluster, lambda task, address: Link(shard, task), client_name=WORKERS[1],
                         failover_timeout=0.3, status_timeout=1.0)
    control = ControlRouter(router)
    FencedWriter(control.channels(wait=5.0), lease).check()
    assert shard.services[backup(0)].fence.highest() == 9
    with pytest.raises(FencedError, match="epoch 8 refused: 'chief' is fenced at epoch 9"):
        FencedWriter(control.channels(wait=5.0), dataclasses.replace(lease, epoch=8)).check()  # a deposed chief
    control.close()
    # The old primary rebuilt as the new one's backup: it would take a Fence as done (a backup serves it as
    # an unreplicated task), so a router that still routes there asks the members first.
    shard.wait_view(backup(0), (PRIMARY,))
    fresh = ControlRouter(ShardRouter(shard.cluster, lambda task, address: Link(shard, task),
                                      client_name=WORKERS[1], failover_timeout=0.3, status_timeout=1.0))
    FencedWriter(fresh.channels(wait=5.0), dataclasses.replace(lease, epoch=10)).check()
    assert shard.services[backup(0)].fence.highest() == 10
    fresh.close()
