"""A replicated shard's ``Stats`` names the primary's restored checkpoint and step (psflow/ps/restore_gate.py), on a
backup of the view, on the backup promoted after the primary died, and on the restarted member rebuilt from it:
``LoadShard`` is replicated whole and the gate's state rides every entry, so the summaries' START and the launcher's
``restore_loss`` read the same step whichever member answers. In-process members (tests/replica_shard.py).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from failed_over_shard import BACKUP, trained
from replica_shard import PRIMARY, InProcessShard

from psflow.ps.protocol import BeginRestoreRequest, LoadShardRequest, SetReadyRequest, StatsReply
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)


def _restored(shard: InProcessShard, member: str) -> tuple[int, bool, str | None, int | None]:
    stats = StatsReply.from_frame(shard.call(member, "Stats", Frame({})))
    return stats.generation, stats.ready, stats.restored_from, stats.restored_from_step


def test_every_member_holding_the_shard_names_the_primary_s_restore(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = trained(make_shard, ready=True)
    shard.call(PRIMARY, BeginRestoreRequest.METHOD, BeginRestoreRequest(7).to_frame())
    load = LoadShardRequest([], restored_step=5, restored_from="/ckpt/ckpt-000000003", restored_from_step=3,
                            generation=7)
    shard.call(PRIMARY, LoadShardRequest.METHOD, load.to_frame())
    shard.call(PRIMARY, SetReadyRequest.METHOD, SetReadyRequest("the chief", 7, 5).to_frame())
    want = (7, True, "/ckpt/ckpt-000000003", 3)
    assert [_restored(shard, m) for m in (PRIMARY, BACKUP)] == [want] * 2
    shard.cut.add(PRIMARY)  # killed
    assert shard.promote(BACKUP, 1).epoch == 2
    assert _restored(shard, BACKUP) == want
    shard.add(PRIMARY)  # restarted empty, rebuilt from the new primary
    shard.cut.discard(PRIMARY)
    shard.start(PRIMARY)
    shard.wait_view(BACKUP, (PRIMARY,))
    assert _restored(shard, PRIMARY) == want
