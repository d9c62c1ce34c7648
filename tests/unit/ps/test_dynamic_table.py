"""Tests for psflow.ps.dynamic: parity with static rows, admission, eviction, memory, re-split, errors."""

from __future__ import annotations

import threading
import tracemalloc
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psflow.optim import OptimizerSpec
from psflow.ps.dynamic import (
    FIXED_OVERHEAD_BYTES,
    CountMinSketch,
    DynamicTable,
    DynamicTableError,
    DynamicTableSpec,
    owner_of,
    resplit_snapshots,
)
from psflow.ps.initializers import initial_value
from psflow.ps.optimizers import make_optimizer
from psflow.ps.store import ParameterStore, StoreError

I64_MIN, I64_MAX = -(2**63), 2**63 - 1
EXTREME_IDS = [I64_MIN, I64_MIN + 1, -(2**32), -1, 0, 1, 2**31, 2**32, I64_MAX - 1, I64_MAX]
OPTIMIZERS = {
    "sgd": OptimizerSpec("sgd", {"learning_rate": 0.1}),
    "adagrad": OptimizerSpec("adagrad", {"learning_rate": 0.1, "initial_accumulator_value": 0.2}),
    "ftrl": OptimizerSpec("ftrl", {"learning_rate": 0.1, "l1_regularization_strength": 0.01,
                                   "l2_regularization_strength": 0.001}),
    "ftrl_power": OptimizerSpec("ftrl", {"learning_rate": 0.1, "learning_rate_power": -0.7}),
    "momentum": OptimizerSpec("momentum", {"learning_rate": 0.1, "momentum": 0.9, "use_nesterov": True}),
    "adam": OptimizerSpec("adam", {"learning_rate": 0.01}),
}
NORMAL = {"name": "random_normal", "stddev": 0.1, "seed": 11}
# Property tests never depend on machine speed: no per-example deadline, no "data generation too slow" check.
SPEED_FREE: dict[str, Any] = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}


def _ids(values: Any) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _table(dim: int = 4, optimizer: str | None = "sgd", **options: Any) -> DynamicTable:
    spec = OPTIMIZERS[optimizer] if optimizer else None
    return DynamicTable(DynamicTableSpec("emb", dim, optimizer=spec, **options))


def _splitmix64(x: int) -> int:
    """Reference splitmix64 in Python ints."""
    mask = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def _assert_snapshots_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# ---- owner_of and the sketch ----------------------------------------------------
def test_owner_of_is_splitmix64_mod_num_ps() -> None:
    assert _splitmix64(0) == 0xE220A8397B1DCDAF  # splitmix64's first output from state 0
    ids = _ids(EXTREME_IDS)
    for num_ps in (1, 2, 3, 7):
        want = [_splitmix64(i % (1 << 64)) % num_ps for i in EXTREME_IDS]
        assert owner_of(ids, num_ps).tolist() == want
    assert owner_of(_ids([0]), 3).tolist() == [0xE220A8397B1DCDAF % 3]


@given(st.lists(st.integers(I64_MIN, I64_MAX), max_size=50), st.integers(1, 9))
@settings(max_examples=50, **SPEED_FREE)
def test_owner_of_matches_reference(values: list[int], num_ps: int) -> None:
    got = owner_of(_ids(values), num_ps)
    assert got.dtype == np.int64
    assert got.tolist() == [_splitmix64(v % (1 << 64)) % num_ps for v in values]


def test_owner_of_spreads_consecutive_ids() -> None:
    counts = np.bincount(owner_of(np.arange(30_000, dtype=np.int64), 3), minlength=3)
    assert counts.min() > 9_500  # 10,000 expected each


@pytest.mark.parametrize("bad", [np.arange(3, dtype=np.int32), np.arange(3, dtype=np.uint64), [1, 2], np.zeros((2, 2), np.int64)])
def test_owner_of_refuses_bad_ids(bad: Any) -> None:
    with pytest.raises(DynamicTableError, match="int64"):
        owner_of(bad, 2)
    with pytest.raises(DynamicTableError, match="num_ps"):
        owner_of(_ids([1]), 0)


@given(st.lists(st.lists(st.integers(-50, 50), unique=True, max_size=30), max_size=20), st.integers(0, 4))
@settings(max_examples=60, **SPEED_FREE)
def test_count_min_never_under_counts(batches: list[list[int]], log_width: int) -> None:
    sketch = CountMinSketch(1 << log_width, 3, seed=5)  # tiny widths: many collisions
    truth: dict[int, int] = {}
    for batch in batches:
        estimates = sketch.add(_ids(batch))
        for value, estimate in zip(batch, estimates.tolist(), strict=True):
            truth[value] = truth.get(value, 0) + 1
            assert estimate >= truth[value]
    keys = _ids(sorted(truth))
    assert (sketch.estimate(keys) >= _ids([truth[k] for k in sorted(truth)])).all()
    assert sketch.total == sum(truth.values())
    assert sketch.nbytes == 4 * 3 * (1 << log_width)


def test_count_min_counts_repeated_entries_of_one_call() -> None:
    sketch = CountMinSketch(4, 2)
    assert sketch.add(_ids([5, 5, 5, 6])).tolist()[:3] == [3, 3, 3]
    assert sketch.estimate(_ids([5])).tolist()[0] >= 3 and sketch.error_bound() == pytest.approx(np.e * 4 / 4)


def test_count_min_is_exact_without_collisions() -> None:
    sketch = CountMinSketch(1 << 16, 4)
    for _ in range(3):
        sketch.add(_ids(EXTREME_IDS))
    assert sketch.estimate(_ids(EXTREME_IDS)).tolist() == [3] * len(EXTREME_IDS)
    assert sketch.estimate(_ids([12345])).tolist() == [0]
    with pytest.raises(ValueError, match="power of two"):
        CountMinSketch(1000, 4)


# ---- parity with the static store ------------------------------------------------
class _StaticTwin:
    """A static partition holding the same ids at rows 0..n-1, updated by the static store's own path."""

    def __init__(self, optimizer: str, ids: np.ndarray, initial_rows: np.ndarray) -> None:
        self.row_of = {int(v): r for r, v in enumerate(ids.tolist())}
        self.store = ParameterStore()
        shape = initial_rows.shape
        self.part = self.store.create("w", 0, shape, 0, shape[0], "float32", {"name": "zeros"},
                                      make_optimizer(OPTIMIZERS[optimizer]))
        self.part.value[...] = initial_rows

    def apply(self, ids: np.ndarray, grads: np.ndarray) -> None:
        rows = _ids([self.row_of[int(v)] for v in ids.tolist()])
        self.store.check_sparse(self.part, rows, grads)
        ParameterStore.apply_sparse(self.part, rows, grads)


def _history(rng: np.random.Generator, universe: np.ndarray, steps: int, duplicates: bool) -> list[np.ndarray]:
    if duplicates:
        return [rng.choice(universe, size=12) for _ in range(steps)]
    return [rng.choice(universe, size=6, replace=False) for _ in range(steps)]


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
@pytest.mark.parametrize("duplicates", [False, True])
def test_rows_update_as_static_rows(optimizer: str, duplicates: bool) -> None:
    rng = np.random.default_rng(3)
    universe = _ids(EXTREME_IDS + [5, 6, 7, 1000])
    table = _table(3, optimizer, initializer=NORMAL)
    rows, found = table.lookup(universe, step=0)
    assert found.all()
    twin = _StaticTwin(optimizer, universe, rows)
    for step, ids in enumerate(_history(rng, universe, 25, duplicates), start=1):
        grads = rng.normal(size=(ids.size, 3)).astype(np.float32)
        table.lookup(ids, step=step)
        assert table.apply_gradients(ids, grads, step) == ids.size
        twin.apply(ids, grads)
    snap = table.snapshot()
    order = [twin.row_of[int(v)] for v in snap["ids"].tolist()]
    tolerance = {"rtol": 1e-6, "atol": 1e-7} if duplicates else {"rtol": 0, "atol": 0}  # no duplicates: bit for bit
    np.testing.assert_allclose(snap["values"], twin.part.value[order], **tolerance)
    for name, slot in twin.part.slots.items():
        want = slot[order] if slot.ndim else slot
        np.testing.assert_allclose(snap[f"slot/{name}" if slot.ndim else f"state/{name}"], want, **tolerance)


def test_duplicate_ids_are_summed_first() -> None:
    a, b = _table(2, "adagrad"), _table(2, "adagrad")
    ids = _ids([7, -3, 7, 7])
    grads = np.array([[1, 2], [3, 4], [0.5, 0.25], [2, 1]], np.float32)
    a.lookup(ids)
    b.lookup(ids)
    a.apply_gradients(ids, grads, 1)
    b.apply_gradients(_ids([-3, 7]), np.array([grads[1], grads[0] + grads[2] + grads[3]], np.float32), 1)
    np.testing.assert_allclose(a.snapshot()["values"], b.snapshot()["values"], rtol=1e-6)
    np.testing.assert_allclose(a.snapshot()["slot/accumulator"], b.snapshot()["slot/accumulator"], rtol=1e-6)


@pytest.mark.parametrize("initializer", [NORMAL, {"name": "truncated_normal", "stddev": 2.0, "seed": 4},
                                         {"name": "random_uniform", "minval": -1, "maxval": 2, "seed": 9},
                                         {"name": "constant", "value": 0.5}, {"name": "ones"}])
def test_initial_rows_equal_static_rows(initializer: dict[str, Any]) -> None:
    table = _table(5, initializer=initializer)
    rows, _ = table.lookup(np.arange(40, dtype=np.int64)[::-1].copy())
    np.testing.assert_array_equal(rows[::-1], initial_value(initializer, (40, 5), 0, 40))


def test_slots_start_at_the_optimizer_initial_value_and_are_dropped_with_the_row() -> None:
    table = _table(2, "adagrad", capacity_rows=2)
    table.lookup(_ids([1, 2]))
    table.apply_gradients(_ids([1, 2]), np.ones((2, 2), np.float32), 1)
    table.lookup(_ids([3]))  # evicts one of 1, 2; slot reused
    snap = table.snapshot()
    assert len(table) == 2 and 3 in snap["ids"].tolist()
    np.testing.assert_array_equal(snap["slot/accumulator"][snap["ids"] == 3], np.full((1, 2), 0.2, np.float32))
    np.testing.assert_array_equal(snap["values"][snap["ids"] == 3], [[0, 0]])


# ---- admission -----------------------------------------------------------------------
def test_admit_after_admits_at_the_nth_sighting() -> None:
    table = _table(2, admit_after=3)
    x, y = _ids([I64_MIN]), _ids([42])
    for _ in range(2):
        rows, found = table.lookup(_ids([I64_MIN, I64_MIN, 42]))  # one sighting per call, however often it repeats
        assert not found.any() and not rows.any()
        assert table.apply_gradients(x, np.ones((1, 2), np.float32), 1) == 0
    assert len(table) == 0
    _, found = table.lookup(x)
    assert found.all() and len(table) == 1
    _, found = table.lookup(y)
    assert found.all()
    stats = table.stats()
    assert (stats.admitted, stats.rejected_lookups, stats.dropped_gradients) == (2, 6, 2)
    sketch = table.admission_sketch()
    assert sketch is not None and stats.sketch_bytes == sketch.nbytes == 4 * (1 << 18) * 4


def test_admit_after_one_and_default_admit_everything() -> None:
    for table in (_table(admit_after=1), _table()):
        assert table.lookup(_ids([5]))[1].all()
        assert table.admission_sketch() is None


def test_admission_by_probability_is_deterministic_per_seed() -> None:
    ids = np.arange(-5000, 5000, dtype=np.int64)

    def admitted(seed: int) -> np.ndarray:
        table = _table(1, admit_probability=0.3, seed=seed)
        table.lookup(ids)
        table.lookup(ids[:100])
        return table.snapshot()["ids"]

    first = admitted(1)
    np.testing.assert_array_equal(first, admitted(1))
    assert not np.array_equal(first, admitted(2))
    assert abs(first.size - 0.3 * 10_000 - 0.7 * 0.3 * 100) < 5 * np.sqrt(10_000 * 0.21)


def test_read_only_lookups_change_nothing() -> None:
    table = _table(2, admit_after=2)
    table.lookup(_ids([1, 2]))
    before = table.snapshot()
    rows, found = table.lookup(_ids([1, 2, 3]), create=False, step=9)
    assert not found.any() and not rows.any()
    table.lookup(_ids([1]))  # second sighting admits 1; the read-only lookup did not count
    assert table.snapshot()["ids"].tolist() == [1]
    assert before["ids"].size == 0 and table.stats().absent_reads == 3


# ---- eviction ------------------------------------------------------------------------
def test_ttl_drops_rows_unused_for_more_than_ttl_steps() -> None:
    table = _table(1, ttl_steps=10)
    table.lookup(_ids([1, 2, 3]), step=0)
    table.apply_gradients(_ids([2]), np.ones((1, 1), np.float32), 5)
    table.lookup(_ids([3]), step=7)
    assert table.evict(10) == 0
    assert table.evict(11) == 1  # 1 last used at 0
    assert table.snapshot()["ids"].tolist() == [2, 3]
    assert table.evict(15) == 0 and table.evict(16) == 1 and table.evict(18) == 1
    assert len(table) == 0 and table.stats().evicted_ttl == 3


def test_ttl_scan_is_bounded_per_call() -> None:
    table = _table(1, ttl_steps=1, ttl_scan_rows=10)
    table.lookup(np.arange(35, dtype=np.int64), step=0)
    evicted = [table.evict(5) for _ in range(5)]
    assert evicted == [10, 10, 10, 5, 0]
    table.lookup(np.arange(35, dtype=np.int64), step=5)
    assert table.evict(9, full=True) == 35


def _zipf_stream(seed: int, support: int, exponent: float, batches: int, size: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, support + 1) ** exponent
    ids = rng.integers(I64_MIN, I64_MAX, support, dtype=np.int64, endpoint=True)
    out: np.ndarray = ids[rng.choice(support, size=(batches, size), p=p / p.sum())]
    return out


def _recall_of_top_percent(table: DynamicTable, stream: np.ndarray) -> float:
    ids, counts = np.unique(stream, return_counts=True)
    top = ids[np.argsort(-counts, kind="stable")[: ids.size // 100]]
    return float(table.lookup(top, create=False)[1].mean())


@pytest.mark.parametrize(("policy", "exponent", "admit_after"), [("lfu", 1.0, None), ("lfu", 1.0, 2), ("lru", 1.2, None)])
def test_capacity_keeps_the_hot_ids(policy: str, exponent: float, admit_after: int | None) -> None:
    capacity = 1000
    stream = _zipf_stream(7, 60_000, exponent, 200, 500)
    assert np.unique(stream).size >= 10 * capacity
    table = _table(4, "adagrad", capacity_rows=capacity, policy=policy, admit_after=admit_after)
    grads = np.ones((500, 4), np.float32)
    for step, batch in enumerate(stream):
        table.lookup(batch, step=step)
        table.apply_gradients(batch, grads, step)
        assert len(table) <= capacity
    assert _recall_of_top_percent(table, stream) >= 0.99
    assert table.stats().evicted_capacity > 5 * capacity


def test_lfu_evicts_the_least_frequent_and_never_rows_of_the_same_lookup() -> None:
    table = _table(1, capacity_rows=3, eviction_sample=64)
    for _ in range(3):
        table.lookup(_ids([10, 20]))
    table.lookup(_ids([30]))
    table.lookup(_ids([10, 20, 40]))  # must evict 30 (seen once), not 10 or 20
    assert table.snapshot()["ids"].tolist() == [10, 20, 40]
    rows, found = table.lookup(_ids([50, 60, 70, 80]))  # more new ids than room: the ones that fit are created
    assert found.sum() == 3 and len(table) == 3
    assert table.stats().rejected_lookups == 1


@pytest.mark.parametrize("policy", ["lfu", "lru"])
def test_eviction_spares_the_rows_a_lookup_reads(policy: str) -> None:
    table = _table(1, capacity_rows=3, policy=policy)
    table.lookup(_ids([1]), step=0)  # the least frequent and least recent row
    table.apply_gradients(_ids([1]), np.ones((1, 1), np.float32), 0)
    for step in range(1, 6):
        table.lookup(_ids([2, 3]), step=step)
    rows, found = table.lookup(_ids([1, 4]), step=6)  # 4 needs room: 2 or 3 goes, not 1
    assert found.all()
    np.testing.assert_array_equal(rows, np.array([[-0.1], [0.0]], np.float32))
    ids = table.snapshot()["ids"].tolist()
    assert 1 in ids and 4 in ids and len(ids) == 3


def test_memory_stays_within_the_byte_budget() -> None:
    budget = 200_000
    stream = _zipf_stream(3, 20_000, 1.0, 60, 500)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        table = _table(8, "ftrl", capacity_bytes=budget, admit_after=2, sketch_width=1 << 12)
        for step, batch in enumerate(stream):
            table.lookup(batch, step=step)
            table.apply_gradients(batch, np.ones((500, 8), np.float32), step)
        resident = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    stats = table.stats()
    assert stats.evicted_capacity > 0 and stats.rows == table.row_limit
    assert stats.memory_bytes <= 1.1 * budget + table.overhead_bytes()
    assert resident <= 1.1 * budget + table.overhead_bytes() + FIXED_OVERHEAD_BYTES
    assert stats.memory_bytes <= resident  # the accounting leaves nothing of the table's arrays out


def test_capacity_bytes_counts_rows_slots_metadata_and_index() -> None:
    table = _table(8, "ftrl", capacity_bytes=10_000)
    assert table.row_limit == 10_000 // (3 * 8 * 4 + 33 + 64)


# ---- snapshots and re-splitting --------------------------------------------------------
def _trained_tasks(num_ps: int, optimizer: str, ids: np.ndarray, steps: int) -> list[DynamicTable]:
    """num_ps tables, each fed the ids it owns, as the ps tasks of one table would be."""
    rng = np.random.default_rng(1)
    tables = [_table(3, optimizer, initializer=NORMAL) for _ in range(num_ps)]
    for step in range(steps):
        _feed(tables, rng.choice(ids, 40), rng, step)
    return tables


def _feed(tables: list[DynamicTable], batch: np.ndarray, rng: np.random.Generator, step: int) -> None:
    owners = owner_of(batch, len(tables))
    grads = rng.normal(size=(batch.size, 3)).astype(np.float32)
    for task, table in enumerate(tables):
        mine = owners == task
        table.lookup(batch[mine], step=step)
        table.apply_gradients(batch[mine], grads[mine], step)


def _union(snapshots: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return resplit_snapshots("emb", snapshots, 1)[0] if len(snapshots) > 1 else snapshots[0]


@pytest.mark.parametrize("optimizer", ["sgd", "adagrad", "ftrl", "adam"])
@pytest.mark.parametrize("num_ps", [1, 3])
def test_resplit_from_two_tasks_keeps_every_row_and_slot(optimizer: str, num_ps: int) -> None:
    ids = np.concatenate([_ids(EXTREME_IDS), np.random.default_rng(0).integers(I64_MIN, I64_MAX, 300, np.int64)])
    old = _trained_tasks(2, optimizer, ids, 30)
    parts = resplit_snapshots("emb", [t.snapshot() for t in old], num_ps)
    new = [DynamicTable.restore(old[0].spec, part) for part in parts]
    for task, table in enumerate(new):
        assert (owner_of(table.snapshot()["ids"], num_ps) == task).all()
    _assert_snapshots_equal(_union([t.snapshot() for t in new]), _union([t.snapshot() for t in old]))
    back = resplit_snapshots("emb", [t.snapshot() for t in new], 2)  # and back onto 2: what each task had
    for before, after in zip(old, back, strict=True):
        _assert_snapshots_equal(after, before.snapshot())
    rng_old, rng_new = np.random.default_rng(5), np.random.default_rng(5)
    for step in range(30, 35):  # training goes on identically from the restored tables
        batch = ids[np.random.default_rng(step).integers(0, ids.size, 40)]
        _feed(old, batch, rng_old, step)
        _feed(new, batch, rng_new, step)
    _assert_snapshots_equal(_union([t.snapshot() for t in new]), _union([t.snapshot() for t in old]))


def test_snapshot_is_sorted_and_round_trips_extreme_ids() -> None:
    table = _table(2, "ftrl")
    table.lookup(_ids(EXTREME_IDS[::-1]), step=3)
    table.apply_gradients(_ids(EXTREME_IDS), np.ones((len(EXTREME_IDS), 2), np.float32), 4)
    snap = table.snapshot()
    assert snap["ids"].tolist() == sorted(EXTREME_IDS)
    assert snap["last_step"].tolist() == [4] * len(EXTREME_IDS) and snap["frequency"].tolist() == [1] * len(EXTREME_IDS)
    assert int(snap["step"]) == 4
    _assert_snapshots_equal(DynamicTable.restore(table.spec, snap).snapshot(), snap)
    rows, found = table.lookup(_ids([I64_MIN, 12345, I64_MAX]), create=False)  # 12345 was never seen: zeros
    assert found.tolist() == [True, False, True] and snap["values"].all()
    np.testing.assert_array_equal(rows, np.stack([snap["values"][0], np.zeros(2, np.float32), snap["values"][-1]]))


def test_restore_onto_a_smaller_capacity_keeps_the_most_frequent_rows() -> None:
    table = _table(1)
    for n in range(1, 6):
        table.lookup(np.arange(n, dtype=np.int64))  # id k seen 5 - k times
    small = DynamicTable(DynamicTableSpec("emb", 1, optimizer=OPTIMIZERS["sgd"], capacity_rows=2))
    assert small.load(table.snapshot()) == 3
    assert small.snapshot()["ids"].tolist() == [0, 1] and small.stats().evicted_capacity == 3


def test_resplit_refuses_inconsistent_snapshots() -> None:
    a, b = _trained_tasks(2, "sgd", np.arange(100, dtype=np.int64), 3)
    with pytest.raises(DynamicTableError, match="'emb'.*task 0 holds id"):
        resplit_snapshots("emb", [b.snapshot(), a.snapshot()], 3)
    late = _table(3)
    late.load({**b.snapshot(), "step": np.array(99, np.int64)})
    assert [int(part["step"]) for part in resplit_snapshots("emb", [a.snapshot(), late.snapshot()], 3)] == [99] * 3
    with pytest.raises(DynamicTableError, match="no snapshots"):
        resplit_snapshots("emb", [], 3)
    other = _table(3, "adagrad").snapshot()
    with pytest.raises(DynamicTableError, match="task 1 has arrays"):
        resplit_snapshots("emb", [a.snapshot(), other], 3)


# ---- the index under churn, against a model ------------------------------------------------
POOL = EXTREME_IDS + list(range(-45, 45))
OPS = st.lists(st.tuples(st.sampled_from(["lookup", "apply", "evict"]),
                         st.lists(st.sampled_from(POOL), min_size=1, max_size=25)), max_size=40)


@given(OPS, st.sampled_from(["lfu", "lru"]))
@settings(max_examples=40, **SPEED_FREE)
def test_rows_match_a_dict_model_under_churn(ops: list[tuple[str, list[int]]], policy: str) -> None:
    table = _table(1, capacity_rows=30, ttl_steps=3, policy=policy, eviction_sample=2)
    model: dict[int, float] = {}  # id -> value: zeros initializer, sgd lr 0.1
    for step, (op, values) in enumerate(ops):
        ids = _ids(values)
        if op == "lookup":
            rows, found = table.lookup(ids, step=step)
            for value, row, hit in zip(values, rows[:, 0].tolist(), found.tolist(), strict=True):
                assert hit and row == model.setdefault(value, 0.0)
        elif op == "apply":
            grads = np.arange(1, ids.size + 1, dtype=np.float32).reshape(-1, 1)
            table.apply_gradients(ids, grads, step)
            summed: dict[int, float] = {}  # duplicates are summed first, then applied once (integer sums: exact)
            for value, grad in zip(values, grads[:, 0].tolist(), strict=True):
                summed[value] = summed.get(value, 0.0) + grad
            for value, grad in summed.items():
                if value in model:
                    model[value] = float(np.float32(model[value]) - np.float32(0.1) * np.float32(grad))
        else:
            table.evict(step)
        snap = table.snapshot()
        assert len(table) == snap["ids"].size <= 30
        assert set(snap["ids"].tolist()) <= set(model)
        model = {k: v for k, v in model.items() if k in set(snap["ids"].tolist())}  # evicted rows leave the model
        np.testing.assert_allclose(snap["values"][:, 0], [model[k] for k in snap["ids"].tolist()], rtol=1e-5, atol=1e-6)
        _, found = table.lookup(_ids(POOL), create=False)
        assert set(_ids(POOL)[found].tolist()) == set(model)


def test_rows_stay_with_their_ids_under_heavy_churn() -> None:
    table = _table(2, capacity_rows=4096, initializer=NORMAL, eviction_sample=1)  # index exactly half full
    expected = initial_value(NORMAL, (50_000, 2), 0, 50_000)  # id k starts as static row k
    rng = np.random.default_rng(8)
    for step in range(30):
        table.lookup(rng.choice(50_000, 1500, replace=False).astype(np.int64), step=step)
        assert len(table) <= 4096
    snap = table.snapshot()
    assert len(table) == snap["ids"].size == 4096
    np.testing.assert_array_equal(snap["values"], expected[snap["ids"]])
    everything = np.arange(50_000, dtype=np.int64)
    rows, found = table.lookup(everything, create=False)
    np.testing.assert_array_equal(everything[found], snap["ids"])
    np.testing.assert_array_equal(rows[found], expected[found])
    assert not rows[~found].any() and table.stats().index_rebuilds <= 2


def test_concurrent_calls_lose_no_update() -> None:
    # Every gradient is 1, so a row's state depends only on how many applies it got, in any order.
    ids = np.arange(-200, 200, dtype=np.int64)
    batches = [[np.sort(rng.choice(ids, 64, replace=False)) for _ in range(40)]
               for rng in (np.random.default_rng(seed) for seed in range(4))]
    ones = np.ones((64, 4), np.float32)
    start = threading.Barrier(len(batches))  # the threads begin together, so their calls interleave

    def work(table: DynamicTable, mine: list[np.ndarray], barrier: threading.Barrier | None = None) -> None:
        if barrier is not None:
            barrier.wait()
        for step, batch in enumerate(mine):
            table.lookup(batch, step=step)
            table.apply_gradients(batch, ones, step)

    concurrent, sequential = _table(4, "adagrad"), _table(4, "adagrad")
    threads = [threading.Thread(target=work, args=(concurrent, mine, start)) for mine in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for mine in batches:
        work(sequential, mine)
    a, b = concurrent.snapshot(), sequential.snapshot()
    for key in ("ids", "values", "slot/accumulator", "frequency"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


# ---- errors change nothing ------------------------------------------------------------
def _state(table: DynamicTable) -> tuple[dict[str, np.ndarray], Any]:
    return table.snapshot(), table.stats()


@pytest.mark.parametrize(("call", "match"), [
    (lambda t: t.lookup(np.arange(3, dtype=np.int32)), "'emb': lookup: ids must be a 1-D int64"),
    (lambda t: t.lookup(np.arange(3, dtype=np.uint64)), "int64"),
    (lambda t: t.lookup([1, 2]), "int64"),
    (lambda t: t.lookup(np.zeros((2, 1), np.int64)), "1-D"),
    (lambda t: t.lookup(_ids([1]), step=-1), "step"),
    (lambda t: t.apply_gradients(_ids([1, 2]), np.ones((2, 5), np.float32), 1), r"'emb'.*float32 \(2, 4\).*dim 4"),
    (lambda t: t.apply_gradients(_ids([1, 2]), np.ones((2, 4), np.float64), 1), "float32"),
    (lambda t: t.apply_gradients(_ids([1, 2]), np.array([[1, 1, 1, 1], [1, np.nan, 1, 1]], np.float32), 1),
     "'emb'.*1 gradient rows are not finite.*id 2"),
    (lambda t: t.apply_gradients(_ids([1]), np.full((1, 4), np.inf, np.float32), 1), "not finite"),
    (lambda t: t.apply_gradients(_ids([1]), np.ones((1, 4), np.float32), True), "step"),
    (lambda t: t.load({**t.snapshot(), "values": np.zeros((3, 5), np.float32)}), "'emb'.*values"),
    (lambda t: t.load({**t.snapshot(), "ids": t.snapshot()["ids"][::-1].copy()}), "strictly increasing"),
    (lambda t: t.load({k: v for k, v in t.snapshot().items() if k != "slot/accumulator"}), "needs"),
])
def test_bad_calls_name_the_table_and_change_nothing(call: Any, match: str) -> None:
    table = _table(4, "adagrad")
    table.lookup(_ids([1, 2, 3]), step=1)
    table.apply_gradients(_ids([1, 2]), np.ones((2, 4), np.float32), 1)
    before = _state(table)
    with pytest.raises(DynamicTableError, match=match) as info:
        call(table)
    assert isinstance(info.value, (StoreError, ValueError))
    after = _state(table)
    _assert_snapshots_equal(after[0], before[0])
    assert after[1] == before[1]


@pytest.mark.parametrize(("options", "match"), [
    ({"capacity_rows": 0}, "'emb': capacity_rows must be an int >= 1, got 0"),
    ({"capacity_bytes": 100}, "'emb': capacity_bytes 100 is less than one row"),
    ({"dim": 0}, "dim"),
    ({"admit_probability": 0.0}, "admit_probability"),
    ({"admit_probability": 0.5, "admit_after": 2}, "not both"),
    ({"admit_after": 0}, "admit_after"),
    ({"ttl_steps": 1.5}, "ttl_steps"),
    ({"policy": "fifo"}, "policy"),
    ({"initializer": {"name": "glorot_uniform"}}, "glorot_uniform"),
    ({"initializer": {"name": "nope"}}, "'emb'.*unknown initializer"),
    ({"sketch_width": 1000}, "sketch_width"),
])
def test_bad_specs_name_the_table(options: dict[str, Any], match: str) -> None:
    with pytest.raises(DynamicTableError, match=match):
        DynamicTable(DynamicTableSpec(**{"name": "emb", "dim": 4, "optimizer": OPTIMIZERS["sgd"], **options}))


def test_untrainable_table_refuses_gradients() -> None:
    table = _table(2, None)
    table.lookup(_ids([1]))
    with pytest.raises(DynamicTableError, match="'emb'.*not trainable"):
        table.apply_gradients(_ids([1]), np.ones((1, 2), np.float32), 1)


def test_spec_round_trips_through_json() -> None:
    spec = DynamicTableSpec("emb", 8, optimizer=OPTIMIZERS["ftrl"], initializer=NORMAL, admit_after=3, ttl_steps=100,
                            capacity_bytes=1 << 20, policy="lru")
    assert DynamicTableSpec.from_json(spec.to_json()) == spec
    assert spec.to_json()["initializer"] == {"name": "random_normal", "mean": 0.0, "stddev": 0.1, "seed": 11}
    with pytest.raises(DynamicTableError, match="unknown keys"):
        DynamicTableSpec.from_json({**spec.to_json(), "capacity": 3})
