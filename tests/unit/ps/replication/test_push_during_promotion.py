"""A push that reaches a backup while its ``Promote`` is under way waits for it to become primary, and is applied
(psflow/ps/replication/member.py ``_check_primary``).

``Promote`` publishes the member's view (role primary, the new epoch) before it makes its forwarder. A worker that
learned the new view from the member's ``ReplicaStatus`` (another worker's promotion) and pushed in between was
refused as ``<member>: not the primary of shard 0 (primary); primary <member> at epoch 2``: a FAILED_PRECONDITION
its client does not retry, so the worker failed, and the other shards' halves of its step, applied and answered,
were never counted acknowledged (a sync run with its primary killed ended with ``pushes_applied`` 2037,
``pushes_acknowledged`` 2036).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.ps.protocol import PushReply, PushRequest, WorkerTag
from psflow.ps.replication.view import View
from psflow.ps.sync import SyncConfig

pytestmark = pytest.mark.timeout(60)


def _push(i: int) -> PushRequest:
    rng = np.random.default_rng(i)
    return PushRequest([("b/part_0", rng.normal(size=4).astype(np.float32), None)],
                       WorkerTag(WORKERS[0], 1, push_id=i, acked=i - 1), step=True, examples=8)


def test_a_push_arriving_while_the_backup_becomes_primary_is_applied_not_refused(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard()
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    shard.push(PRIMARY, _push(1))
    shard.cut.add(PRIMARY)  # the primary dies
    new = backup(0)
    member = shard.replicas[new]
    outcome: list[PushReply | Exception] = []

    def push() -> None:
        try:
            outcome.append(shard.push(new, _push(2)))
        except Exception as e:  # noqa: BLE001 - recorded, asserted below
            outcome.append(e)

    pusher = threading.Thread(target=push, daemon=True)
    become = member._become_primary

    def becoming(view: View) -> None:  # the view says primary at epoch 2; the forwarder is not made yet
        assert member.view.view.role == "primary"
        pusher.start()
        pusher.join(1.0)  # refused at once before the fix; waits for the promotion after it
        become(view)

    member._become_primary = becoming  # type: ignore[method-assign]
    assert shard.promote(new, 1).role == "primary"
    pusher.join(30.0)
    assert not pusher.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], PushReply), outcome
    stats = member.stats()
    assert stats["pushes_applied"] == 2, stats
