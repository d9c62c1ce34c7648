"""A replicated shard's dynamic table travels row by row (issue 28): each entry carries the rows a lookup
admitted or touched and a push updated (values, slots, id, last use, lookup count) and the ids evicted, not
the whole table; the backup ends with the primary's rows, slots and metadata after admissions, updates,
capacity and ttl evictions, with Adagrad and with non-lazy Adam (whose update moves every row: a static
partition's sparse push is then replicated whole, with Adam's 0-d beta powers)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.optim import OptimizerSpec
from psflow.ps.dynamic import DynamicTable, DynamicTableError, DynamicTableSpec
from psflow.ps.protocol import PullRequest, PushRequest, WorkerTag
from psflow.ps.replication.deltas import capture, write
from psflow.ps.store import ParameterStore
from psflow.ps.sync import SyncConfig

pytestmark = pytest.mark.timeout(60)

TABLE = "emb/part_0"
#: A table's counters, which a backup takes from the primary (spelled here, not read from psflow: a counter
#: dropped from what a change carries fails these tests)
_COUNTED = ("admitted", "rejected_lookups", "absent_reads", "dropped_gradients", "evicted_ttl", "evicted_capacity")


def _assert_same_table(shard: InProcessShard, member: str) -> None:
    mine = shard.services[PRIMARY].store.get(TABLE).table
    theirs = shard.services[member].store.get(TABLE).table
    assert mine is not None and theirs is not None
    a, b = mine.snapshot(), theirs.snapshot()
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name
    assert len(mine) == len(theirs) > 0
    # the counters travel with the rows: a promoted backup reports what the table did, not what it saw itself
    mine_stats, their_stats = mine.stats(), theirs.stats()
    assert {k: getattr(their_stats, k) for k in _COUNTED} == {k: getattr(mine_stats, k) for k in _COUNTED}, member


@pytest.mark.parametrize("optimizer", ["adagrad", "adam"])
def test_the_backup_table_ends_equal_after_admissions_updates_and_evictions(
        make_shard: Callable[..., InProcessShard], optimizer: str) -> None:
    shard = make_shard()
    shard.start()
    shard.wait_view()
    spec = {"policy": "lru", "capacity_rows": 40, "ttl_steps": 6, "admit_after": 2, "initial_rows": 8}
    shard.register(layout(SyncConfig(), dynamic=spec, optimizer=OptimizerSpec(optimizer, {"learning_rate": 0.05})))
    rng = np.random.default_rng(11)
    for step in range(1, 61):
        ids = np.unique(rng.integers(-30, 70 if step < 40 else 200, size=12)).astype(np.int64)  # later: new ids
        shard.call(PRIMARY, PullRequest.METHOD, PullRequest([(TABLE, ids)], create=True, step_hint=step).to_frame())
        w_rows = np.array([step % 20], np.int64)  # a static partition's sparse rows: Adam moves every row
        push = PushRequest([(TABLE, rng.normal(size=(ids.size, 3)).astype(np.float32), ids),
                            ("w/part_0", rng.normal(size=(1, 4)).astype(np.float32), w_rows)],
                           WorkerTag(WORKERS[0], 1, push_id=step, acked=step - 1), step=True, examples=1)
        shard.push(PRIMARY, push)
    stats = shard.services[PRIMARY].store.get(TABLE).table.stats()  # type: ignore[union-attr]
    assert stats.admitted > 40 and stats.evicted_capacity > 0 and stats.evicted_ttl > 0, stats
    assert stats.rejected_lookups > 0, stats  # admit_after 2: first sightings are not admitted
    _assert_same_table(shard, backup(0))
    w, copy = shard.services[PRIMARY].store.get("w/part_0"), shard.services[backup(0)].store.get("w/part_0")
    assert w.value.tobytes() == copy.value.tobytes() and w.slots.keys() == copy.slots.keys()
    assert all(w.slots[name].tobytes() == copy.slots[name].tobytes() for name in w.slots)
    # row by row: after the table's first capture no entry carries it whole
    entries = [e for e in shard.received[backup(0)] if not e.full]
    whole = [e.seq for e in entries for p in e.parts if p.key == TABLE and any(k.startswith("table/") for k in p.arrays)]
    rows = [e.seq for e in entries for p in e.parts if p.key == TABLE and any(k.startswith("rows/") for k in p.arrays)]
    assert len(whole) <= 1 and len(rows) >= 100, (whole, len(rows))


def test_a_table_change_is_replicated_in_a_fraction_of_the_whole_tables_bytes() -> None:
    """The note in psflow/ps/replication/deltas.py: a 100,000-row table (dim 8, Adagrad), a push of 1,000 ids."""
    spec = DynamicTableSpec("emb", 8, optimizer=OptimizerSpec("adagrad", {"learning_rate": 0.1}),
                            initial_rows=1 << 17)
    part = ParameterStore().create_dynamic(DynamicTable(spec), 0, None)
    assert part.table is not None
    part.table.lookup(np.arange(100_000, dtype=np.int64), step=1)
    first = capture(part, np.zeros(0, np.int64))  # the first capture: whole
    ids = np.arange(0, 100_000, 100, dtype=np.int64)
    part.table.lookup(ids, step=2)
    part.table.apply_gradients(ids, np.ones((ids.size, 8), np.float32), step=2)
    change = capture(part, ids)

    def size(delta: object) -> int:
        return sum(a.nbytes for a in delta.arrays.values())  # type: ignore[attr-defined]
    whole, rows = size(first), size(change)
    print(f"bytes per push: whole table {whole:,}, rows {rows:,}")
    assert whole > 8_000_000 and rows < 120_000, (whole, rows)
    # and the change, written after the whole table, gives the same table
    store = ParameterStore()
    copy = store.create_dynamic(DynamicTable(spec), 0, None)
    write(store, first)
    write(store, change)
    assert copy.table is not None
    a, b = part.table.snapshot(), copy.table.snapshot()
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert copy.table.stats().admitted == part.table.stats().admitted == 100_000


@pytest.mark.parametrize("rows", [None, np.zeros(0, np.int64)], ids=["joining member", "first capture"])
def test_a_whole_table_written_on_a_backup_carries_the_primarys_counters(rows: np.ndarray | None) -> None:
    """A joining member (a full entry: the whole table, rows None) or a table's first capture gets the counters
    with the rows: its Stats, once promoted, go on from the primary's admissions and evictions, not from zero."""
    spec = DynamicTableSpec("emb", 2, optimizer=OptimizerSpec("sgd", {"learning_rate": 0.1}), capacity_rows=5)
    part = ParameterStore().create_dynamic(DynamicTable(spec), 0, None)
    assert part.table is not None
    part.table.lookup(np.arange(5, dtype=np.int64), step=1)
    part.table.lookup(np.arange(5, 8, dtype=np.int64), step=2)            # 3 evicted to make room
    part.table.apply_gradients(np.array([0, 7], np.int64), np.ones((2, 2), np.float32), step=2)
    part.table.lookup(np.array([100], np.int64), step=2, create=False)    # an absent read
    store = ParameterStore()
    copy = store.create_dynamic(DynamicTable(spec), 0, None)
    write(store, capture(part, rows))
    assert copy.table is not None
    mine, theirs = part.table.stats(), copy.table.stats()
    assert {k: getattr(theirs, k) for k in _COUNTED} == {k: getattr(mine, k) for k in _COUNTED}
    assert (mine.admitted, mine.evicted_capacity, mine.absent_reads) == (8, 3, 1), mine


def test_a_replicated_table_change_refuses_arrays_that_do_not_fit() -> None:
    spec = DynamicTableSpec("emb", 2, optimizer=OptimizerSpec("sgd", {"learning_rate": 0.1}))
    table = DynamicTable(spec)
    with pytest.raises(DynamicTableError, match="replicated values has shape"):
        table.apply_changes({"ids": np.array([1], np.int64), "values": np.zeros((1, 3), np.float32),
                             "last_step": np.zeros(1, np.int64), "frequency": np.zeros(1, np.int64),
                             "removed": np.zeros(0, np.int64), "step": np.array(0, np.int64)})
    assert len(table) == 0
