"""A backup served over psflow's TCP carrier writes an entry of many rows right after its reply instead of
keeping it to be written with the next ones (issue 28, option 1(a)): coalescing merges a partition's rows only
while its deltas carry at most ``_MERGE_ROWS`` rows each on average (psflow/ps/replication/deltas.py), so
sparse LR's ~20,000-row entries never merge, and keeping ``COALESCE`` of them made every ``COALESCE``-th reply's
after-reply work write them all (~1.6 ms) while the connection's next Replicate call waited unread. Entries of
few rows (W&D's) are still kept and written together (test_ack_before_write.py, test_coalesced_writes.py).
Either kind is kept, up to ``2 * COALESCE``, while the connection's next request already waits (option 1(b)):
the write would hold that call up, and the work of a later call (or a read) writes them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.protocol import PartDelta, PushRequest, RegisterRequest, ReplicaEntry, WorkerTag
from psflow.ps.replication.applier import COALESCE, InOrderApplier
from psflow.ps.replication.deltas import _MERGE_ROWS
from psflow.ps.sync import SyncConfig
from psflow.rpc import after_reply

pytestmark = pytest.mark.timeout(60)

BACKUP = backup(0)
ROWS = 4 * _MERGE_ROWS  # w's rows
MANY, FEW = _MERGE_ROWS + 1, 3  # rows per push: more than a merge takes; a few


def _layout() -> RegisterRequest:
    """w (ROWS x 1, FTRL, as sparse LR's), b (1,)."""
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["127.0.0.1:1"]})))
    vs.get_variable("w", (ROWS, 1), initializer={"name": "random_normal", "stddev": 0.1, "seed": 1})
    vs.get_variable("b", (1,))
    return RegisterRequest(tuple(vs.placements()), OptimizerSpec("ftrl", {"learning_rate": 0.1}), SyncConfig(),
                           WORKERS[0], chief=True)


def _push(push_id: int, rows: int) -> PushRequest:
    ids = np.random.default_rng(push_id).choice(ROWS, rows, replace=False).astype(np.int64)
    ids.sort()
    return PushRequest([("w/part_0", np.full((rows, 1), 0.01 * push_id, np.float32), ids),
                        ("b/part_0", np.full(1, 0.01, np.float32), None)],
                       WorkerTag(WORKERS[0], 1, push_id=push_id, acked=push_id - 1), step=True, examples=1)


def _written_together(make_shard: Callable[..., InProcessShard], rows: int) -> list[int]:
    """How many entries each write of the backup took, over 2 * COALESCE pushes of ``rows`` rows each."""
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(_layout())
    shard.push(PRIMARY, _push(1, rows))
    assert shard.replicas[BACKUP].applier.settle(10)
    shard.after_reply.add(BACKUP)  # from here on, as over the TCP carrier
    applier, sizes = shard.replicas[BACKUP].applier, list[int]()
    write = applier._apply_many

    def counted(entries: list[ReplicaEntry]) -> None:
        sizes.append(len(entries))
        write(entries)
    applier._apply_many = counted
    for push_id in range(2, 2 + 2 * COALESCE):
        shard.push(PRIMARY, _push(push_id, rows))
        if rows > _MERGE_ROWS:  # written by its own call's after-reply work: nothing left for the next call's
            assert applier.applied_seq == applier.received_seq, (push_id, applier.applied_seq, sizes)
    assert applier.settle(10)
    primary, mine = shard.services[PRIMARY].store.get("w/part_0"), shard.services[BACKUP].store.get("w/part_0")
    assert primary.value.tobytes() == mine.value.tobytes()
    assert all(primary.slots[n].tobytes() == mine.slots[n].tobytes() for n in primary.slots)
    return sizes


def test_an_entry_of_more_rows_than_a_merge_takes_is_written_right_after_its_reply(
        make_shard: Callable[..., InProcessShard]) -> None:
    assert _written_together(make_shard, MANY) == [1] * (2 * COALESCE)


def test_entries_of_few_rows_are_still_written_coalesce_at_a_time(make_shard: Callable[..., InProcessShard]) -> None:
    assert _written_together(make_shard, FEW) == [COALESCE, COALESCE]


def test_entries_wait_while_the_connections_next_request_does_up_to_twice_coalesce() -> None:
    written: list[list[int]] = []
    applier = InOrderApplier(lambda entry: None, lambda entries: written.append([e.seq for e in entries]))
    applier.offer([ReplicaEntry(1, {}, (), full=True)])
    failed: list[Exception] = []
    waiting = True

    def entry(seq: int) -> ReplicaEntry:
        return ReplicaEntry(seq, {}, (PartDelta("w/part_0", np.arange(MANY, dtype=np.int64),
                                                {"value": np.zeros((MANY, 1), np.float32)}),))

    def handed_over(seq: int) -> None:
        assert applier.promise([entry(seq)]) == seq
        applier.apply_promised([entry(seq)], failed.append)
    with after_reply.collecting(lambda: waiting):  # as the TCP carrier runs a call's after-reply work
        for seq in range(2, 2 + 2 * COALESCE):  # every one with the connection's next request waiting
            handed_over(seq)
            assert applier.applied_seq == (1 if seq < 1 + 2 * COALESCE else seq), seq
        waiting = False
        handed_over(2 + 2 * COALESCE)
        waiting = True
        handed_over(3 + 2 * COALESCE)
    assert written == [list(range(2, 2 + 2 * COALESCE)), [2 + 2 * COALESCE]] and not failed
    assert applier.settle(10) and written[-1] == [3 + 2 * COALESCE]
