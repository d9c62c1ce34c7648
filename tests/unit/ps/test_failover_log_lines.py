"""One promotion, one WARNING line (psflow/ps/failover.py): every client that finds a shard's primary gone sends the
backup a ``Promote``, which the member serves idempotently (psflow/ps/replication/view.py: a second Promote at the
same epoch finds it primary already and changes nothing). Each client used to log "promoting ..." as a WARNING
before its call and "routes to ..." as another after it, so one ps kill in a run of 2 workers, the launcher and the
chief's save client read as several promotions in the merged log. Now the reply says whether the call changed the
view (``ReplicaStatusReply.view_changed``): only that client's line is a WARNING; the others', and every client's
"routes to", are INFO. Fake members (tests/unit/ps/test_failover.py) whose Promote answers as the real one does."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from replica_shard import PRIMARY, InProcessShard, backup
from test_failover import B0, CLUSTER, P0, FakeShards, Member, healthy, status

from psflow.ps.failover import ShardRouter
from psflow.ps.protocol.replication import PromoteRequest
from psflow.rpc.api import ConnectConfig, DeadlineExceededError, RpcError, TaskUnavailableError
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)


class RacingShards(FakeShards):
    """Promote as the ps side serves it (a backup at the expected epoch is promoted: ``view_changed``; a member primary at
    the next epoch already answers its status, unchanged); ``stale``: status answers a member gives before its
    current one (a round of statuses sent before another client's Promote reached it)."""

    def __init__(self) -> None:
        super().__init__()
        self.stale: dict[str, list[Frame]] = {}

    def answer(self, member: Member, method: str, meta: Mapping[str, Any]) -> Frame | RpcError:
        s = member.state
        if method == "ReplicaStatus" and self.stale.get(member.task):
            member.calls.append(method)
            return self.stale[member.task].pop(0)
        if method != PromoteRequest.METHOD or s is None:
            return super().answer(member, method, meta)
        if s.role == "primary" and s.epoch == meta["expected_epoch"] + 1:
            member.calls.append(method)
            return s.to_frame()  # promoted already, by another client's call: unchanged
        reply = super().answer(member, method, meta)
        return reply if isinstance(reply, RpcError) else Frame({**reply.meta, "view_changed": True})


def _router(shards: FakeShards, name: str) -> ShardRouter:
    return ShardRouter(CLUSTER, shards.open, client_name=name, config=ConnectConfig(backoff_initial=0.001),
                       failover_timeout=10.0, wait_timeout=5.0)


def test_two_clients_promoting_one_backup_log_one_warning_the_one_whose_promote_changed_the_view(
        caplog: pytest.LogCaptureFixture) -> None:
    base = healthy()
    shards = RacingShards()
    shards.members = base.members
    first, second = _router(shards, "/job:worker/task:0"), _router(shards, "/job:worker/task:1")
    first.resolve(0), second.resolve(0)  # both reached P0: its refused connection proves it gone
    shards.set(P0, None)
    caplog.set_level(logging.INFO, logger="psflow.ps.client")
    assert first.resolve(0, TaskUnavailableError("down"))
    # The second client's statuses were sent before the first's Promote reached the backup: it promotes too.
    shards.stale[B0] = [status(B0, "backup", 1, primary=P0).to_frame()]
    assert second.resolve(0, TaskUnavailableError("down"))
    assert first.routes[0] == second.routes[0] == (B0, 2)
    assert shards.members[B0].calls.count(PromoteRequest.METHOD) == 2  # both sent one; one promotion happened

    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["/job:worker/task:0: ps shard 0 has no primary holding its variables (/job:ps/task:0: "
                        "refused the connection); promoting /job:ps_backup/task:0 (epoch 1)"], warnings
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert ("/job:worker/task:1: ps shard 0 has no primary holding its variables (/job:ps/task:0: refused the "
            "connection); promoting /job:ps_backup/task:0 (epoch 1): done already by another client") in infos, infos
    for name in ("/job:worker/task:0", "/job:worker/task:1"):  # each client still says where it routes now
        assert (f"{name}: ps shard 0 routes to /job:ps_backup/task:0 at epoch 2 (was /job:ps/task:0 at epoch 1)"
                in infos), infos


def test_a_shard_no_member_holds_is_still_each_clients_warning(caplog: pytest.LogCaptureFixture) -> None:
    shards = healthy()
    client = _router(shards, "/job:worker/task:0")
    client.resolve(0)
    shards.set(P0, "primary", 2, primary=P0, has_state=False)  # every replica lost: restarted empty
    shards.set(B0, None)
    caplog.set_level(logging.INFO, logger="psflow.ps.client")
    assert client.resolve(0, TaskUnavailableError("down"))
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["/job:worker/task:0: ps shard 0 routes to /job:ps/task:0 at epoch 2 (was /job:ps/task:0 at "
                        "epoch 1); no member holds its variables"], warnings


def test_the_real_members_promote_says_whether_this_call_changed_the_view(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.cut.add(PRIMARY)
    first = shard.promote(backup(0), 1)
    again = shard.promote(backup(0), 1)  # a second client's Promote at the same epoch: served, nothing changed
    assert (first.role, first.epoch, first.view_changed) == ("primary", 2, True)
    assert (again.role, again.epoch, again.view_changed) == ("primary", 2, False)


class LostReplyShards(RacingShards):
    """The backup is promoted by the Promote, but its reply never reaches the client (DEADLINE_EXCEEDED: the member
    was settling the entries it acknowledged past the call's deadline, or the link broke after it served it)."""

    def answer(self, member: Member, method: str, meta: Mapping[str, Any]) -> Frame | RpcError:
        reply = super().answer(member, method, meta)
        if method == PromoteRequest.METHOD and not isinstance(reply, RpcError):
            return DeadlineExceededError(f"{member.task}: {method}: DEADLINE_EXCEEDED")
        return reply


def test_a_promotion_whose_reply_was_lost_is_still_a_clients_warning(caplog: pytest.LogCaptureFixture) -> None:
    """The only client that sent the Promote cannot know it made the promotion: the next round finds the backup
    promoted and routes to it. That promotion must not read as INFO lines only (as 'done already by another
    client' would, had one replied): the client's route to the member its own Promote named is its WARNING."""
    shards = LostReplyShards()
    shards.members = healthy().members
    client = _router(shards, "/job:worker/task:0")
    client.resolve(0)
    shards.set(P0, None)
    caplog.set_level(logging.INFO, logger="psflow.ps.client")
    assert client.resolve(0, TaskUnavailableError("down"))
    assert client.routes[0] == (B0, 2)
    assert shards.members[B0].calls.count(PromoteRequest.METHOD) == 1
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == ["/job:worker/task:0: ps shard 0 routes to /job:ps_backup/task:0 at epoch 2 (was "
                        "/job:ps/task:0 at epoch 1) after this client's Promote, whose reply was lost "
                        "(/job:ps_backup/task:0: Promote: DEADLINE_EXCEEDED)"], warnings
