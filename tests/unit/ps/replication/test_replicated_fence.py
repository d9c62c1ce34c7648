"""A replicated shard's fence (the highest chief epoch it accepted) is carried to its backups (issue 28,
psflow/ps/replication/fence_state.py): a promoted backup, or a member rebuilt from the primary's snapshot,
refuses a deposed chief's epoch as the primary did. In-process members (tests/replica_shard.py), no sockets."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from replica_shard import PRIMARY, InProcessShard, backup

from psflow.ps.protocol import FenceRequest
from psflow.rpc.api import FailedPreconditionError
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
