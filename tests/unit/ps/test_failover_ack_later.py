"""The client's side of a PushPull whose rows come before its acknowledgement (psflow/ps/task_calls.py,
``collect_rows`` and ``send_acked``; issue 28): which shards get an ``Acked`` call, when a push counts as
acknowledged, and that a push one shard applied while another shard's call failed for good is acknowledged
(and counted) before the error is raised, as a plain push's is, also when that other shard comes first and the
replying shard's call had failed over (psflow/ps/failover.py, ``ShardRouter.gather``). Fake members of two
shards (tests/unit/ps/test_failover.py); the real members meet the client in tests/unit/train/test_ack_later_failover.py and
tests/integration/test_replicated_training.py."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from test_failover import B0, B1, P0, P1, FakeShards, Member, _two_shard_client, healthy

from psflow.gradients import DenseGradient
from psflow.ps.plans import ClientError
from psflow.ps.protocol import PullReply, PushPullAckLaterReply, PushPullReply, PushReply
from psflow.rpc.api import InvalidArgumentError, RpcError, TaskUnavailableError
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)

GRADS = {"w": DenseGradient(np.ones(2, np.float32)), "b": DenseGradient(np.ones(1, np.float32))}


def _rows(step: int, pending: int | None) -> PushPullAckLaterReply:
    return PushPullAckLaterReply(PushPullReply(PushReply(step), PullReply(step, {})), pending)


def test_only_the_shards_that_left_the_ack_pending_get_an_acked_call_and_count_once_it_replied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    assert client.acks_later
    shards.members[P0].replies += [_rows(7, 3).to_frame(), PushReply(7).to_frame()]  # pending; then its Acked
    shards.members[P1].replies.append(_rows(0, None).to_frame())  # acknowledged before its reply
    pending = client.send_push_pull(GRADS, {}, ack_later=True)
    assert pending.rows() == {}
    assert shards.members[P0].calls[-2:] == ["PushPullAckLater", "Acked"] and "Acked" not in shards.members[P1].calls
    assert client.acked == {1: 1}  # shard 0's is not acknowledged yet
    assert pending.result()[0].step == 7
    assert client.acked == {0: 1, 1: 1}
    acked = shards.members[P0].metas[-1]
    assert (acked["worker"], acked["push_id"], acked["incarnation"]) == ("/job:worker/task:0", 1, client.incarnation)


def test_a_push_that_fails_for_good_on_one_shard_is_acknowledged_by_the_shards_that_replied_before_it_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    shards.members[P0].replies.append(InvalidArgumentError("bad gradient"))  # not a failover: raised
    shards.members[P1].replies.append(_rows(0, 5).to_frame())  # applied, its acknowledgement pending
    pending = client.send_push_pull(GRADS, {}, ack_later=True)
    with pytest.raises(InvalidArgumentError, match="bad gradient"):
        pending.rows()
    # Shard 1 applied it: its Acked call went out and replied before the error (nothing left in flight), and its
    # count has it (else pushes_applied would exceed pushes_acknowledged with nothing lost).
    assert shards.members[P1].calls[-2:] == ["PushPullAckLater", "Acked"]
    assert client.acked == {1: 1}


def _failed_over(shards: FakeShards, reply: Frame | None = None) -> None:
    """Shard 1's primary dies with this call in flight (its push may be applied and held by its backup, which this
    client's resend promotes); ``reply``: what the promoted backup answers the resend (default: a push reply)."""
    shards.set(P1, None)  # its host refuses the connection: gone (the client reached it at connect)
    if reply is not None:
        shards.members[B1].replies.append(reply)


def test_a_shard_that_failed_over_is_resent_and_counted_though_a_lower_shard_failed_for_good(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Shard 0's error is final; shard 1's primary died with the push in flight (applied there and forwarded to its
    # backup, say). Raising at shard 0 left shard 1's push applied on the promoted backup and never counted
    # acknowledged: pushes_applied above pushes_acknowledged in the failing run's metrics.json.
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    shards.members[P0].replies.append(InvalidArgumentError("bad gradient"))  # not a failover: raised
    _failed_over(shards)
    with pytest.raises(InvalidArgumentError, match="bad gradient"):
        client.push(GRADS)
    assert shards.members[B1].calls.count("Push") == 1  # resent to the promoted backup, which applies it once
    assert client.channels[1].task == B1 and client.acked == {1: 1}


def test_a_shard_that_failed_over_is_resent_though_a_lower_shard_has_no_member_left_to_wait_for(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Shard 0's members stopped (each status call answered only at its deadline), and shard 1's primary died with the
    # push in flight: shard 0's resolve waits the whole wait_timeout for a member and fails. Resolved after it in
    # turn, shard 1 had no time left and was never resent: its push, held by the backup another worker promotes,
    # applied and never counted acknowledged.
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    assert client.router is not None
    client.router.wait_timeout = 0.5
    shards.stalled |= {P0, B0}
    answer = shards.answer

    def late(member: Member, method: str, meta: Mapping[str, Any]) -> Frame | RpcError:
        if member.task in shards.stalled:
            time.sleep(0.3)  # a status call's deadline: shard 0's resolve then ends past the gather's deadline
        return answer(member, method, meta)

    monkeypatch.setattr(shards, "answer", late)
    _failed_over(shards)
    with pytest.raises(TaskUnavailableError, match="no member of ps shard 0 can serve it"):
        client.push(GRADS)
    assert shards.members[B1].calls.count("Push") == 1
    assert client.channels[1].task == B1 and client.acked == {1: 1}


def test_a_rows_first_push_that_failed_over_is_resent_and_acknowledged_though_a_lower_shard_failed_for_good(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    shards.members[P0].replies.append(InvalidArgumentError("bad gradient"))
    _failed_over(shards, _rows(0, 5).to_frame())  # the promoted backup's rows, acknowledgement pending
    pending = client.send_push_pull(GRADS, {}, ack_later=True)
    with pytest.raises(InvalidArgumentError, match="bad gradient"):
        pending.rows()
    assert shards.members[B1].calls[-2:] == ["PushPullAckLater", "Acked"] and client.acked == {1: 1}


def test_rows_that_cannot_be_read_still_get_their_acked_call_and_raise_one_error_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The rows came, their push applied, but reading them failed: no Acked call went out, so the push stayed applied
    # on the primary and was never counted acknowledged, and the error was a bare KeyError('w/part_0').
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    shards.members[P0].replies += [_rows(7, 3).to_frame(), PushReply(7).to_frame()]  # no rows of w; then Acked
    shards.members[P1].replies.append(_rows(0, None).to_frame())
    pending = client.send_push_pull(GRADS, {"w": None}, ack_later=True)
    with pytest.raises(ClientError, match=r"^/job:worker/task:0: variable 'w': the reply of /job:ps/task:0 "
                                          r"\(ps shard 0\) holds no rows of its partition 'w/part_0'$"):
        pending.rows()
    assert shards.members[P0].calls[-2:] == ["PushPullAckLater", "Acked"]
    assert client.acked == {0: 1, 1: 1}


def test_a_reply_that_does_not_decode_still_gets_its_acked_call_and_raises_one_error_naming_the_task(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    bad = _rows(7, 3).to_frame()
    shards.members[P0].replies += [Frame({**bad.meta, "step": "seven"}, dict(bad.arrays)), PushReply(7).to_frame()]
    shards.members[P1].replies.append(_rows(0, None).to_frame())
    pending = client.send_push_pull(GRADS, {}, ack_later=True)
    with pytest.raises(ClientError, match=r"^/job:worker/task:0: the reply of /job:ps/task:0 \(ps shard 0\) to "
                                          r"PushPullAckLater cannot be read: .*step"):
        pending.rows()
    assert shards.members[P0].calls[-2:] == ["PushPullAckLater", "Acked"]
    assert client.acked == {0: 1, 1: 1}


def test_a_reply_whose_ack_pending_does_not_decode_still_gets_its_acked_call(monkeypatch: pytest.MonkeyPatch) -> None:
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    bad = _rows(7, 3).to_frame()
    shards.members[P0].replies += [Frame({**bad.meta, "ack_pending": "three"}, dict(bad.arrays)),
                                   PushReply(7).to_frame()]
    shards.members[P1].replies.append(_rows(0, None).to_frame())
    pending = client.send_push_pull(GRADS, {}, ack_later=True)
    with pytest.raises(ClientError, match=r"^/job:worker/task:0: the rows from /job:ps/task:0 \(ps shard 0\), "
                                          r"/job:ps/task:1 \(ps shard 1\) cannot be read: .*ack_pending"):
        pending.rows()
    assert shards.members[P0].calls[-2:] == ["PushPullAckLater", "Acked"]
    assert client.acked == {0: 1, 1: 1}
