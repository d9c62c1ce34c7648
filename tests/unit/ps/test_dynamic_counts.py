"""A dynamic table's counters in its snapshot (a checkpoint's): a load goes on from them, a re-split keeps them.

The end-to-end checks (a ps task killed and the cluster restored, a resume onto more ps tasks) are in
tests/integration/test_dynamic_counters.py; here the rules themselves, on tables in this process.
"""

from __future__ import annotations

import numpy as np
import pytest

from psflow.optim import OptimizerSpec
from psflow.ps.dynamic import DynamicTable, DynamicTableError, DynamicTableSpec, owner_of, resplit_snapshots
from psflow.ps.dynamic.snapshots import COUNTED


def _tasks(num_ps: int, capacity: int) -> list[DynamicTable]:
    """``num_ps`` shares, each fed its ids of 0..149, 150..299 and 0..99, at capacity ``capacity``: admissions,
    and capacity evictions on every task."""
    spec = DynamicTableSpec("emb", 2, optimizer=OptimizerSpec("sgd", {"learning_rate": 0.1}), capacity_rows=capacity)
    tables = [DynamicTable(spec) for _ in range(num_ps)]
    for step, (lo, hi) in enumerate([(0, 150), (150, 300), (0, 100)]):
        ids = np.arange(lo, hi, dtype=np.int64)
        owners = owner_of(ids, num_ps)
        for task, table in enumerate(tables):
            table.lookup(ids[owners == task], step=step)
    return tables


def _counts(table: DynamicTable) -> dict[str, int]:
    stats = table.stats()
    return {name: getattr(stats, name) for name in COUNTED}


def test_a_load_goes_on_from_the_snapshots_counters_and_one_without_them_keeps_its_own() -> None:
    (saved,) = _tasks(1, 200)
    want = _counts(saved)
    assert want["admitted"] > 200 and want["evicted_capacity"] > 0 and want["rejected_lookups"] == 0
    fresh = DynamicTable(saved.spec)
    fresh.load(saved.snapshot(counts=True))
    assert _counts(fresh) == want and len(fresh) == len(saved)
    older = DynamicTable(saved.spec)  # a checkpoint of before the counters were saved: the table's own stay
    older.lookup(np.array([7], np.int64), step=1)
    older.load(saved.snapshot())
    assert _counts(older)["admitted"] == 1
    bad = {**saved.snapshot(), "counts": np.array([1, 2], np.int64)}
    with pytest.raises(DynamicTableError, match="'emb': snapshot counts must be 6 int64"):
        fresh.check_snapshot(bad)


@pytest.mark.parametrize("num_ps", [1, 2, 3])
def test_a_resplit_keeps_each_tasks_counters_or_splits_their_sums_evenly(num_ps: int) -> None:
    old = _tasks(2, 100)
    parts = resplit_snapshots("emb", [t.snapshot(counts=True) for t in old], num_ps)
    roomy = DynamicTableSpec("emb", 2, optimizer=old[0].spec.optimizer)  # the load itself evicts nothing
    new = [DynamicTable.restore(roomy, part) for part in parts]
    if num_ps == 2:  # the same tasks: each its own
        assert [_counts(t) for t in new] == [_counts(t) for t in old]
    for name in COUNTED:
        per_task = [_counts(t)[name] for t in new]
        assert sum(per_task) == sum(_counts(t)[name] for t in old), name
        assert max(per_task) - min(per_task) <= 1 or num_ps == 2, (name, per_task)
    total = {name: sum(_counts(t)[name] for t in new) for name in COUNTED}
    assert total["admitted"] - total["evicted_capacity"] == sum(len(t) for t in new)
