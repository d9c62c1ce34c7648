"""The replicated shards' messages (psflow/ps/protocol/replication.py) and the push's new tags survive the wire."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from psflow.ps import protocol as p
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame, decode, encode

pytestmark = pytest.mark.timeout(30)


def _wire(frame: Frame) -> Frame:
    return decode(encode(frame.meta, frame.arrays))


def test_a_push_carries_push_id_acked_and_the_shard_epoch() -> None:
    push = p.PushRequest([("w/part_0", np.ones(3, np.float32), None)],
                         p.WorkerTag("/job:worker/task:0", 7, push_id=12, acked=11), shard_epoch=3)
    back = p.PushRequest.from_frame(_wire(push.to_frame()))
    assert (back.worker.push_id, back.worker.acked, back.shard_epoch) == (12, 11, 3)
    plain = p.PushRequest.from_frame(_wire(p.PushRequest([]).to_frame()))
    assert (plain.worker.push_id, plain.worker.acked, plain.shard_epoch) == (None, None, None)
    with pytest.raises(InvalidRequest, match="'push_id' must be a non-negative integer"):
        p.PushRequest.from_frame(Frame({"grads": [], "push_id": -1}))
    pull = p.PullRequest.from_frame(_wire(p.PullRequest([("w/part_0", None)], shard_epoch=2).to_frame()))
    assert pull.shard_epoch == 2
    leave = p.LeaveRequest.from_frame(_wire(p.LeaveRequest("/job:worker/task:1", acked=40).to_frame()))
    assert leave.acked == 40


def test_status_promote_drop_join_round_trip() -> None:
    status = p.ReplicaStatusReply("/job:ps/task:0", 0, "primary", 2, "/job:ps/task:0", ("/job:ps_backup/task:0",),
                                  17, True, 99, {"/job:ps_backup/task:0": 3})
    assert p.ReplicaStatusReply.from_frame(_wire(status.to_frame())) == status
    promote = p.PromoteRequest(1, 4, "/job:worker/task:0")
    assert p.PromoteRequest.from_frame(_wire(promote.to_frame())) == promote
    drop = p.DropBackupRequest(1, 4, "/job:ps_backup/task:1", "/job:worker/task:0")
    assert p.DropBackupRequest.from_frame(_wire(drop.to_frame())) == drop
    join = p.JoinRequest(0, "/job:ps/task:0", 5)
    assert p.JoinRequest.from_frame(_wire(join.to_frame())) == join
    numbered = p.JoinRequest(0, "/job:ps/task:0", 5, join_id=3)
    assert p.JoinRequest.from_frame(_wire(numbered.to_frame())) == numbered
    with pytest.raises(InvalidRequest, match="'role' must be one of"):
        p.ReplicaStatusReply.from_frame(Frame({**status.to_frame().meta, "role": "leader"}))


def test_replicate_keeps_every_entry_its_rows_and_arrays() -> None:
    rows = np.array([1, 4], np.int64)
    entries = (p.ReplicaEntry(5, {"global_step": 9}, (p.PartDelta("w/part_0", rows, {"value": np.ones((2, 3), np.float32),
                                                                                  "slot/accum": np.zeros((2, 3))}),)),
               p.ReplicaEntry(6, {}, (p.PartDelta("b/part_0", None, {"value": np.arange(3.0)}),), full=True))
    request = p.ReplicateRequest(2, "/job:ps/task:0", "/job:ps_backup/task:0", ("/job:ps_backup/task:0",), entries)
    back = p.ReplicateRequest.from_frame(_wire(request.to_frame()))
    assert (back.epoch, back.primary, back.member, back.backups) == (2, "/job:ps/task:0", "/job:ps_backup/task:0",
                                                                     ("/job:ps_backup/task:0",))
    assert [e.seq for e in back.entries] == [5, 6] and back.entries[1].full and not back.entries[0].full
    assert back.entries[0].state == {"global_step": 9}
    first = back.entries[0].parts[0]
    assert first.rows is not None and first.rows.tolist() == [1, 4]
    assert np.array_equal(first.arrays["slot/accum"], np.zeros((2, 3)))
    assert back.entries[1].parts[0].rows is None
    assert p.ReplicateReply.from_frame(_wire(p.ReplicateReply(6).to_frame())).applied_seq == 6
    assert back.incarnation is None  # a sender started without a Join
    time_ns = 1_795_000_000_123_456_789  # a member's incarnation (its start, in ns) survives the wire whole
    tagged = p.ReplicateRequest(2, "/job:ps/task:0", "/job:ps_backup/task:0", (), (), incarnation=time_ns)
    assert p.ReplicateRequest.from_frame(_wire(tagged.to_frame())).incarnation == time_ns
    assert back.join_id is None and p.ReplicateRequest.from_frame(_wire(dataclasses.replace(
        tagged, join_id=4).to_frame())).join_id == 4  # the Join that started the sender
