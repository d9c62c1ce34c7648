"""A replicated shard's Register (issue 28): the chief's creating call is replicated as the registration
(layout, optimizer, update mode: a few KB), and the backup creates the same partitions from the same
counter-based initializers, bit for bit; a Register that changes nothing (a non-chief's, a repeat) records no
entry. Before, every Register was a full entry (a copy of the whole state: ~520 MB for W&D), which the backup
wrote past the replica timeout."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.protocol import RegisterRequest, ReplicateRequest
from psflow.ps.sync import SyncConfig

pytestmark = pytest.mark.timeout(60)


def _big_layout(chief: bool = True, client: str = WORKERS[0]) -> RegisterRequest:
    """About 4 MB of values (plus Adam's two slots of the same size) on shard 0."""
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["127.0.0.1:1"]})))
    vs.get_variable("emb", (50_000, 16), partitioner=fixed_size_partitioner(2), moving_average_decay=0.99,
                    initializer={"name": "truncated_normal", "stddev": 0.05, "seed": 7})
    vs.get_variable("w", (16, 1), initializer={"name": "glorot_uniform", "seed": 3})
    vs.get_variable("b", (1,))
    vs.get_variable("ids", (0, 4), dynamic={"policy": "lru"}, initializer={"name": "random_normal", "stddev": 0.1,
                                                                            "seed": 2})
    return RegisterRequest(tuple(vs.placements()), OptimizerSpec("adam", {"learning_rate": 0.01}), SyncConfig(),
                           client, chief=chief)


def _bytes(entries: list[object]) -> int:
    frame = ReplicateRequest(1, PRIMARY, backup(0), (backup(0),), entries).to_frame()  # type: ignore[arg-type]
    return len(repr(frame.meta)) + sum(a.nbytes for a in frame.arrays.values())


def test_a_creating_register_is_replicated_small_and_the_backup_creates_the_same_partitions(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    member = backup(0)
    before = len(shard.received.get(member, []))
    shard.register(_big_layout())
    entries = shard.received[member][before:]
    assert len(entries) == 1
    primary, copy = shard.services[PRIMARY], shard.services[member]
    state_bytes = sum(p.value.nbytes for p in primary.store.partitions())
    assert state_bytes > 3_000_000
    assert _bytes(entries) < 100_000, f"the registration entry is {_bytes(entries)} bytes"
    assert copy.registered and sorted(copy.store.keys()) == sorted(primary.store.keys())
    for part in primary.store.partitions():
        other = copy.store.get(part.key)
        if part.table is not None:
            assert other.table is not None
            mine, theirs = part.table.snapshot(), other.table.snapshot()
            assert sorted(mine) == sorted(theirs) and all(np.array_equal(mine[k], theirs[k]) for k in mine)
            continue
        assert np.array_equal(part.value, other.value) and part.value.dtype == other.value.dtype
        assert sorted(part.slots) == sorted(other.slots)
        for name, slot in part.slots.items():
            assert np.array_equal(slot, other.slots[name])
        if part.average is not None:
            assert other.average is not None and np.array_equal(part.average, other.average)
    assert copy.ready == primary.ready and copy.init_count == primary.init_count == 1


def test_a_register_that_changes_nothing_records_no_entry(make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    member = backup(0)
    before = len(shard.received.get(member, []))
    shard.register(_big_layout(chief=False, client=WORKERS[1]))  # waits for the chief: nothing registered yet
    shard.register(_big_layout())
    shard.register(_big_layout(chief=False, client=WORKERS[1]))  # the layout is registered: it compares
    shard.register(_big_layout())  # the chief's repeat on a ready task
    seqs = [e.seq for e in shard.received[member][before:]]
    assert len(seqs) == 1, f"entries {seqs} for one creating Register"
    assert shard.replicas[PRIMARY].status().applied_seq == shard.replicas[member].status().applied_seq
