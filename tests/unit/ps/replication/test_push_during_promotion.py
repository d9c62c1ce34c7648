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
from typing import Any

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.ps.protocol import DropBackupRequest, PushReply, PushRequest, ReplicaStatusReply, WorkerTag
from psflow.ps.replication import member as member_module
from psflow.ps.replication.forwarder import Forwarder
from psflow.ps.replication.view import View
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import PreconditionFailed

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


def test_a_drop_served_while_the_backup_becomes_primary_is_not_undone(
        make_shard: Callable[..., InProcessShard]) -> None:
    """ps:0 and ps_backup:1 gone: a client promotes ps_backup:0 (epoch 2, backups: ps_backup:1), and another, which
    read that view from its ReplicaStatus, asks it to drop ps_backup:1 while its forwarder is being made. The drop
    went to epoch 3 without the member but found no forwarder to take its sender out of; the promotion then set the
    waited backups from its own view, the member among them: every push waited for it and failed UNAVAILABLE after
    replica_timeout for as long as it stayed gone (for good where it is not restarted)."""
    shard = make_shard(backups=2)
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    shard.push(PRIMARY, _push(1))
    shard.cut.update({PRIMARY, backup(1)})  # both gone
    new = backup(0)
    member = shard.replicas[new]
    dropped: list[ReplicaStatusReply | Exception] = []

    def drop() -> None:
        try:
            frame = shard.call(new, DropBackupRequest.METHOD, DropBackupRequest(0, 2, backup(1), WORKERS[1]).to_frame())
            dropped.append(ReplicaStatusReply.from_frame(frame))
        except Exception as e:  # noqa: BLE001 - recorded, asserted below
            dropped.append(e)

    dropper = threading.Thread(target=drop, daemon=True)
    become = member._become_primary

    def becoming(view: View) -> None:  # primary at epoch 2 with ps_backup:1 as its backup; no forwarder yet
        dropper.start()
        dropper.join(1.0)  # served at once before the fix; waits for the promotion after it
        become(view)

    member._become_primary = becoming  # type: ignore[method-assign]
    assert shard.promote(new, 1).role == "primary"
    dropper.join(30.0)
    assert not dropper.is_alive()
    assert len(dropped) == 1 and isinstance(dropped[0], ReplicaStatusReply) and dropped[0].view_changed, dropped
    assert (dropped[0].epoch, dropped[0].backups) == (3, ())
    reply = shard.push(new, _push(2))  # waits for no backup: none is in the view
    assert reply.accepted
    assert member.stats()["pushes_applied"] == 2


def test_a_member_deposed_and_rebuilt_while_it_became_primary_names_that_in_its_forwarders_failure(
        make_shard: Callable[..., InProcessShard], monkeypatch: pytest.MonkeyPatch) -> None:
    """``_become_primary`` finds its member no longer primary (deposed meanwhile, and already rebuilt as a backup:
    no deposal stands): a call that took its forwarder is refused naming what happened and the view it holds,
    not 'deposed: shard 0's primary is unknown at epoch 0' (the deposal's message with no deposal)."""
    shard = make_shard()
    shard.start()
    shard.wait_view()
    member = shard.replicas[backup(0)]
    made: list[Forwarder] = []

    class Recorded(Forwarder):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(member_module, "Forwarder", Recorded)
    assert member.view.view.role == "backup" and member.deposal.by is None  # as after a rebuild
    member._become_primary(View(2, member.task, (), "primary"))
    assert member.forwarder is None and len(made) == 1
    with pytest.raises(PreconditionFailed) as refused:
        made[0].wait(1, timeout=1.0)
    message = str(refused.value)
    assert "unknown" not in message and "epoch 0" not in message, message
    assert (f"{member.task}: no longer becoming primary of shard 0 at epoch 2: deposed and rebuilt meanwhile "
            f"(backup; primary {PRIMARY} at epoch 1)") in message, message
