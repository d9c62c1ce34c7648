"""A backup served over psflow's TCP carrier acknowledges the entries it received and writes them right after
its reply (issue 28's cost: the write leaves the push's round trip; psflow/ps/replication/applier.py's
promise). What must not move: a promoted backup holds every acknowledged push bit for bit (a Promote waits
for the writes), so do a backup's Stats, and a backup that could not write an entry it
acknowledged stops counting as holding the state and rebuilds from the primary. The entries are written
together, coalesced, every ``COALESCE`` of them or at the first read (applier.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.ps.protocol import (
    JoinRequest,
    PushRequest,
    ReplicaEntry,
    ReplicaStatusReply,
    StatsReply,
    WorkerTag,
)
from psflow.ps.replication.applier import COALESCE
from psflow.ps.sync import SyncConfig
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)

BACKUP = backup(0)


def _grads(push_id: int) -> PushRequest:
    rows = np.unique(np.array([push_id % 20, (push_id * 7) % 20], np.int64))
    return PushRequest([("w/part_0", np.full((len(rows), 4), 0.01 * push_id, np.float32), rows),
                        ("b/part_0", np.full(4, 0.01, np.float32), None)],
                       WorkerTag(WORKERS[0], 1, push_id=push_id, acked=push_id - 1), step=True, examples=1)


def _same(shard: InProcessShard, member: str) -> bool:
    """Whether ``member`` holds the primary's state once it wrote what it acknowledged (as a read sees it)."""
    assert shard.replicas[member].applier.settle(10)
    return _written_equal(shard, member)


def _written_equal(shard: InProcessShard, member: str) -> bool:
    """Whether what ``member`` wrote so far equals the primary's state."""
    primary, other = shard.services[PRIMARY], shard.services[member]
    for part in primary.store.partitions():
        theirs = other.store.get(part.key)
        if part.value.tobytes() != theirs.value.tobytes():
            return False
        if any(slot.tobytes() != theirs.slots[name].tobytes() for name, slot in part.slots.items()):
            return False
    assert primary.global_step is not None and other.global_step is not None
    return bool(primary.global_step.value == other.global_step.value)


def _shard(make_shard: Callable[..., InProcessShard]) -> InProcessShard:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    shard.after_reply.add(BACKUP)  # from here on, as over the TCP carrier
    for push_id in range(1, 4):
        shard.push(PRIMARY, _grads(push_id))
    assert _same(shard, BACKUP)
    return shard


def test_a_push_is_acknowledged_before_the_backup_writes_it_and_written_after(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = _shard(make_shard)
    applier = shard.replicas[BACKUP].applier
    shard.after_reply_held = True
    reply = shard.push(PRIMARY, _grads(4))
    assert reply.step == 4  # acknowledged: the backup received it
    assert applier.received_seq > applier.applied_seq and not _written_equal(shard, BACKUP)  # not written yet
    shard.after_reply_held = False
    assert shard.run_after_reply(BACKUP) == 1
    for push_id in range(5, 4 + COALESCE - 1):  # handed over, kept to be written with the next ones
        assert applier.received_seq > applier.applied_seq and not _written_equal(shard, BACKUP)
        shard.push(PRIMARY, _grads(push_id))
    assert applier.received_seq > applier.applied_seq
    shard.push(PRIMARY, _grads(4 + COALESCE - 1))  # the COALESCE-th: all written, with no read asking
    assert applier.received_seq == applier.applied_seq and _written_equal(shard, BACKUP)


def test_a_promotion_waits_for_the_writes_of_every_acknowledged_entry(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = _shard(make_shard)
    shard.after_reply_held = True
    for push_id in (4, 5):
        shard.push(PRIMARY, _grads(push_id))
    assert not _written_equal(shard, BACKUP)
    primary_state = {p.key: (p.value.copy(), {n: s.copy() for n, s in p.slots.items()})
                     for p in shard.services[PRIMARY].store.partitions()}
    shard.cut.add(PRIMARY)  # the primary died; the writes are still to come
    promoted: list[ReplicaStatusReply | Exception] = []

    def promote() -> None:
        try:
            promoted.append(shard.promote(BACKUP, expected_epoch=shard.replicas[BACKUP].view.view.epoch))
        except Exception as e:  # noqa: BLE001 - reported below
            promoted.append(e)
    promoting = threading.Thread(target=promote, daemon=True)
    promoting.start()
    promoting.join(0.3)
    assert not promoted  # it waits for the writes of the entries its member acknowledged
    assert shard.run_after_reply(BACKUP) == 2
    promoting.join(10)
    assert promoted and isinstance(promoted[0], ReplicaStatusReply), promoted
    status, service = promoted[0], shard.services[BACKUP]
    got = {p.key: (p.value.tobytes(), {n: s.tobytes() for n, s in p.slots.items()})
           for p in service.store.partitions()}
    step = service.global_step.value if service.global_step is not None else None
    assert status.role == "primary" and step == 5
    for key, (value, slots) in primary_state.items():
        assert got[key][0] == value.tobytes(), key
        assert got[key][1] == {n: s.tobytes() for n, s in slots.items()}, key


def test_a_backup_that_cannot_write_an_acknowledged_entry_rebuilds_from_the_primary(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = _shard(make_shard)
    member = shard.replicas[BACKUP]
    write, failed = member.applier._apply_many, list[int]()

    def failing(entries: list[ReplicaEntry]) -> None:
        if not failed and not any(e.full for e in entries):
            failed.append(entries[0].seq)
            raise RuntimeError("disk on fire (test)")
        write(entries)
    member.applier._apply_many = failing
    member.applier._apply = lambda entry: failing([entry])
    shard.after_reply_held = True
    first = member.applier.applied_seq + 1
    shard.push(PRIMARY, _grads(4))  # acknowledged, then its write fails
    shard.push(PRIMARY, _grads(5))
    rejoin = threading.Event()  # its Join waits until the test looked (else it may be back in the view first)
    shard.held_requests[(PRIMARY, JoinRequest.METHOD)] = rejoin
    shard.run_after_reply(BACKUP)
    assert not failed, failed  # not written yet
    member.applier.settle(5)  # a read: the two entries written together, which fails
    assert failed == [first] and not member.has_state  # never promoted with a state that lacks an acknowledged push
    del shard.held_requests[(PRIMARY, JoinRequest.METHOD)]
    rejoin.set()
    shard.after_reply_held = False
    shard.wait_view()  # it joined again: a snapshot, then the entries after it
    shard.push(PRIMARY, _grads(5))
    assert _same(shard, BACKUP)


def test_a_backups_stats_hold_every_entry_it_acknowledged(make_shard: Callable[..., InProcessShard]) -> None:
    """(A backup serves no SaveShard: the primary's alone, tests/unit/ps/replication/test_save_on_primary_only.py.)"""
    shard = _shard(make_shard)
    shard.after_reply_held = True
    shard.push(PRIMARY, _grads(4))
    read: list[StatsReply] = []
    reader = threading.Thread(target=lambda: read.append(StatsReply.from_frame(
        shard.call(BACKUP, "Stats", Frame({})))))
    reader.start()
    reader.join(0.3)
    assert not read  # it waits for the write of the entry it acknowledged
    shard.run_after_reply(BACKUP)
    reader.join(10)
    assert read and read[0].global_step == 4
