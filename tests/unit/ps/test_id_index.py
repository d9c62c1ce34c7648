"""A dynamic table's C loops and their numpy twins: the id index (id_index.py) against a dict model, and a
batch's distinct ids (rows.unique_ids, through psflow.native.ids) against np.unique.

Every test runs on both paths: ``c`` (the loops of ``psflow.ps._kernels``) and
``numpy`` (the fallback: the modules' ``_KERNELS`` set to None), and ``mixed``
alternates them call by call on one index, since both keep the same invariants
on the same arrays. The C side is skipped when the extension was not built,
unless ``PSFLOW_REQUIRE_NATIVE=1`` (scripts/test.sh) makes that an error.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psflow.native import ids as ids_module
from psflow.optim import OptimizerSpec
from psflow.ps.dynamic import DynamicTable, DynamicTableSpec, id_index
from psflow.ps.dynamic.id_index import MIN_BUCKETS, IdIndex, buckets_for
from psflow.ps.dynamic.rows import unique_ids

try:
    KERNELS: ModuleType | None = importlib.import_module("psflow.ps._kernels")
    if not all(hasattr(KERNELS, f"index_{n}") for n in ("find", "touch", "place", "remove")):
        raise ImportError("psflow.ps._kernels was built without the dynamic table's loops: rebuild it")
except ImportError:
    # scripts/test.sh sets PSFLOW_REQUIRE_NATIVE where a C compiler is present: the kernels must have been built.
    if os.environ.get("PSFLOW_REQUIRE_NATIVE") == "1":
        raise
    KERNELS = None

SPEED_FREE: dict[str, Any] = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow]}
needs_c = pytest.mark.skipif(KERNELS is None, reason="psflow.ps._kernels was not built")
BOTH = [pytest.param("c", marks=needs_c), "numpy"]
PATHS = [*BOTH, pytest.param("mixed", marks=needs_c)]
MASK64 = (1 << 64) - 1
SALT = 0x5851F42D4C957F2D


def _home(value: int, mask: int) -> int:
    """Reference home bucket in Python ints: splitmix64 of (id ^ salt), masked."""
    z = (((value & MASK64) ^ SALT) + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return (z ^ (z >> 31)) & mask


def _pool() -> list[int]:
    """Ids for a 64-bucket index: 3 per home bucket, 12 more whose home is the last bucket (runs that wrap
    around the end), and the extremes of int64."""
    by_home: dict[int, list[int]] = {}
    candidate = -10_000
    while min((len(by_home.get(h, [])) for h in range(MIN_BUCKETS)), default=0) < 3 or len(by_home[63]) < 15:
        by_home.setdefault(_home(candidate, MIN_BUCKETS - 1), []).append(candidate)
        candidate += 1
    ids = [i for h in range(MIN_BUCKETS) for i in by_home[h][:15 if h == 63 else 3]]
    return ids + [-(2**63), -(2**63) + 1, -1, 0, 2**63 - 1]


POOL = _pool()


@contextmanager
def _path(name: str) -> Iterator[None]:
    """Runs the index and unique_ids on the C loops (``c``) or the numpy loops (``numpy``)."""
    assert name == "numpy" or KERNELS is not None
    saved = id_index._KERNELS, ids_module.IDS
    id_index._KERNELS = KERNELS if name == "c" else None
    ids_module.IDS = saved[1] if name == "c" else None  # psflow.native.ids's loop (unique_ids' unsorted case)
    try:
        yield
    finally:
        id_index._KERNELS, ids_module.IDS = saved


def _op_path(path: str, op: int) -> str:
    return ("c", "numpy")[op % 2] if path == "mixed" else path


def _ids(values: Any) -> np.ndarray:
    return np.array(values, dtype=np.int64)


def _check_invariants(index: IdIndex) -> None:
    """Power-of-two buckets, at most half full, distinct keys, no empty bucket between an id's home and its bucket."""
    keys, vals, mask = index._keys, index._vals, index._mask
    assert keys.size == vals.size == mask + 1 and mask & (mask + 1) == 0 and mask + 1 >= MIN_BUCKETS
    assert ((vals >= 0) | (vals == -1)).all()
    full = np.flatnonzero(vals >= 0)
    assert index.live == full.size and 2 * full.size <= mask + 1
    assert np.unique(keys[full]).size == full.size
    for bucket in full.tolist():
        home = _home(int(keys[bucket]), mask)
        path = (home + np.arange((bucket - home) & mask)) & mask
        assert (vals[path] >= 0).all(), f"empty bucket between home {home} and bucket {bucket}"


def _check_find(index: IdIndex, model: dict[int, int], ids: np.ndarray) -> None:
    slots, where = index.find(ids)
    assert slots.dtype == where.dtype == np.int64 and slots.shape == where.shape == ids.shape
    assert slots.tolist() == [model.get(i, -1) for i in ids.tolist()]
    hit = slots >= 0
    assert (where[~hit] == -1).all()
    np.testing.assert_array_equal(index._keys[where[hit]], ids[hit])
    np.testing.assert_array_equal(index._vals[where[hit]], slots[hit])
    if KERNELS is not None:  # the other path reads the same arrays the same way: same slots and buckets
        saved = id_index._KERNELS
        id_index._KERNELS = None if saved is not None else KERNELS
        try:
            other = index.find(ids)
        finally:
            id_index._KERNELS = saved
        np.testing.assert_array_equal(other[0], slots)
        np.testing.assert_array_equal(other[1], where)


def test_kernels_are_used_when_built() -> None:
    if os.environ.get("PSFLOW_NATIVE", "1") == "0":
        assert id_index._KERNELS is None
    else:
        assert (id_index._KERNELS is None) == (KERNELS is None)


OPS = st.lists(st.tuples(st.sampled_from(["insert", "remove", "find"]),
                         st.lists(st.sampled_from(POOL), min_size=0, max_size=40)), max_size=40)


@pytest.mark.parametrize("path", PATHS)
@given(ops=OPS)
@settings(max_examples=60, **SPEED_FREE)
def test_index_matches_a_dict_model(path: str, ops: list[tuple[str, list[int]]]) -> None:
    index, model, next_slot = IdIndex(MIN_BUCKETS), {}, 0
    for number, (op, values) in enumerate(ops):
        with _path(_op_path(path, number)):
            distinct = list(dict.fromkeys(values))
            if op == "insert":
                new = [v for v in distinct if v not in model]
                slots = list(range(next_slot, next_slot + len(new)))
                next_slot += len(new)
                index.insert(_ids(new), _ids(slots))
                model.update(zip(new, slots, strict=True))
            elif op == "remove":
                gone = _ids([v for v in distinct if v in model])
                found, where = index.find(gone)
                assert (found >= 0).all()
                index.remove(where)
                for v in gone.tolist():
                    del model[v]
            else:
                _check_find(index, model, _ids(values))
            _check_invariants(index)
            _check_find(index, model, _ids(POOL))


@pytest.mark.parametrize("path", PATHS)
def test_index_under_random_churn(path: str) -> None:
    """Many rounds of big batches: growth, removals that move long runs, re-insertion, absent ids."""
    rng = np.random.default_rng(3)
    universe = np.unique(rng.integers(-(2**63), 2**63 - 1, size=30_000, dtype=np.int64))
    universe = np.concatenate([universe, np.arange(-500, 500, dtype=np.int64)])  # consecutive ids too
    universe = rng.permutation(np.unique(universe))
    index, model, next_slot = IdIndex(MIN_BUCKETS), {}, 0
    present = np.zeros(universe.size, bool)
    for number in range(40):
        with _path(_op_path(path, number)):
            absent = np.flatnonzero(~present)
            add = rng.choice(absent, size=min(absent.size, int(rng.integers(1, 2_000))), replace=False)
            slots = np.arange(next_slot, next_slot + add.size, dtype=np.int64)
            next_slot += add.size
            index.insert(universe[add], slots)
            model.update(zip(universe[add].tolist(), slots.tolist(), strict=True))
            present[add] = True
            live = np.flatnonzero(present)
            drop = rng.choice(live, size=int(rng.integers(0, live.size // 2 + 1)), replace=False)
            _, where = index.find(universe[drop])
            index.remove(where)
            for value in universe[drop].tolist():
                del model[value]
            present[drop] = False
            probe = universe[rng.choice(universe.size, size=3_000, replace=False)]
            _check_find(index, model, probe)
            assert index.live == len(model)
    _check_invariants(index)
    _check_find(index, model, universe)


@pytest.mark.parametrize("path", BOTH)
def test_index_is_exactly_half_full_and_wraps(path: str) -> None:
    """32 ids in 64 buckets, 15 of them homed in the last bucket: runs wrap around the end of the arrays."""
    with _path(path):
        wrap = [i for i in POOL if _home(i, MIN_BUCKETS - 1) == 63]
        others = [i for i in POOL if i not in wrap][:MIN_BUCKETS // 2 - len(wrap)]
        ids = _ids(wrap + others)
        index = IdIndex(MIN_BUCKETS)
        index.insert(ids, np.arange(ids.size, dtype=np.int64))
        assert index.rebuilds == 0 and index.live == MIN_BUCKETS // 2
        _check_invariants(index)
        model = dict(zip(ids.tolist(), range(ids.size), strict=True))
        _check_find(index, model, _ids(POOL))
        for value in wrap[::2]:  # one at a time, each moving what follows it
            _, where = index.find(_ids([value]))
            index.remove(where)
            del model[value]
            _check_invariants(index)
            _check_find(index, model, _ids(POOL))
        index.insert(_ids([POOL[-1]]), _ids([99]))  # one more id: still half full at most
        model[POOL[-1]] = 99
        _check_find(index, model, _ids(POOL))
        index.insert(_ids(wrap[::2]), _ids(range(100, 100 + len(wrap[::2]))))  # past half full: doubles first
        assert index.rebuilds == 1 and index._mask + 1 == 2 * MIN_BUCKETS
        model.update(zip(wrap[::2], range(100, 100 + len(wrap[::2])), strict=True))
        _check_invariants(index)
        _check_find(index, model, _ids(POOL))


@pytest.mark.parametrize("path", BOTH)
def test_find_takes_any_int64_array(path: str) -> None:
    with _path(path):
        index = IdIndex(buckets_for(100))
        ids = np.arange(0, 200, 2, dtype=np.int64)
        index.insert(ids, np.arange(100, dtype=np.int64))
        slots, where = index.find(np.arange(200, dtype=np.int64)[::2])  # a strided view
        assert slots.tolist() == list(range(100)) and (where >= 0).all()
        slots, where = index.find(np.zeros(0, np.int64))
        assert slots.size == where.size == 0
        index.remove(where)  # nothing to remove
        assert index.live == 100


@pytest.mark.parametrize("path", BOTH)
def test_clear_and_rebuild(path: str) -> None:
    with _path(path):
        index = IdIndex(MIN_BUCKETS)
        ids = np.arange(-3_000, 3_000, 3, dtype=np.int64)
        index.insert(ids, np.arange(ids.size, dtype=np.int64))
        assert index.rebuilds == 1 and index._mask + 1 == buckets_for(ids.size)
        model = dict(zip(ids.tolist(), range(ids.size), strict=True))
        _check_invariants(index)
        _check_find(index, model, np.arange(-3_000, 3_000, dtype=np.int64))
        index.clear(10)
        assert index.live == 0 and index._mask + 1 == MIN_BUCKETS
        _check_find(index, {}, ids)


# ---- a batch's distinct ids --------------------------------------------------------------------------
def _check_unique(values: np.ndarray) -> None:
    unique, inverse = unique_ids(values)
    want_unique, want_inverse = np.unique(values, return_inverse=True)
    assert unique.dtype == inverse.dtype == np.int64
    np.testing.assert_array_equal(unique, want_unique)
    np.testing.assert_array_equal(inverse, want_inverse.reshape(-1))
    if values.size < 2 or bool((values[1:] > values[:-1]).all()):
        assert unique is values  # sorted distinct: the ids themselves (the table skips a gather then)


@pytest.mark.parametrize("path", BOTH)
@given(values=st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(-20, 20), max_size=80), order=st.integers(0, 2))
@settings(max_examples=150, **SPEED_FREE)
def test_unique_ids_is_np_unique(path: str, values: list[int], order: int) -> None:
    with _path(path):
        ids = _ids(values)
        _check_unique(np.unique(ids) if order == 1 else ids)  # order 1: sorted distinct, as clients send them
        _check_unique(ids[::-1] if order == 2 else ids[::2])  # strided views too


@pytest.mark.parametrize("path", BOTH)
def test_unique_ids_on_every_size(path: str) -> None:
    """Small and large batches, around the C loop's hash-set sizes (powers of two)."""
    rng = np.random.default_rng(4)
    with _path(path):
        for size in [0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 200, 1000, 2048, 2049, 5000]:
            for values in (rng.integers(-(2**63), 2**63 - 1, size, dtype=np.int64), rng.integers(-30, 30, size),
                           np.arange(size, dtype=np.int64), np.arange(size, 0, -1, dtype=np.int64),
                           np.full(size, 7, np.int64)):
                _check_unique(values.astype(np.int64))


@pytest.mark.parametrize("path", BOTH)
def test_touch_finds_and_marks_only_the_rows_found(path: str) -> None:
    """touch = find + the row marks: a training lookup counts a sighting and sets the last use; an update
    only raises the last use (never lowers it); absent ids get -1 and are counted; other rows stay."""
    rng = np.random.default_rng(5)
    present = rng.permutation(_ids(POOL))[:30]
    index = IdIndex(MIN_BUCKETS)
    index.insert(present, np.arange(present.size, dtype=np.int64))
    model = {int(v): i for i, v in enumerate(present.tolist())}
    query = np.concatenate([present[::2], _ids([v for v in POOL if v not in model][:7])])
    query = rng.permutation(query)
    freq, last = np.full(40, 3, np.int64), np.arange(40, dtype=np.int64)
    with _path(path):
        slots, absent = index.touch(query, freq, last, 20, lookup=True)
    want = [model.get(v, -1) for v in query.tolist()]
    assert slots.tolist() == want and absent == 7
    hit = sorted(s for s in want if s >= 0)
    assert [int(i) for i in np.flatnonzero(freq == 4)] == hit and (freq[[i for i in range(40) if i not in hit]] == 3).all()
    np.testing.assert_array_equal(last[hit], 20)
    untouched = [i for i in range(40) if i not in hit]
    np.testing.assert_array_equal(last[untouched], np.arange(40)[untouched])
    last[:] = np.arange(40)
    with _path(path):
        slots, absent = index.touch(query, freq, last, 10, lookup=False)
    assert slots.tolist() == want and absent == 7
    np.testing.assert_array_equal(last, np.maximum(np.arange(40), np.where(np.isin(np.arange(40), hit), 10, 0)))
    assert (freq[hit] == 4).all()  # an update does not count a sighting


@needs_c
def test_touch_checks_its_buffers() -> None:
    assert KERNELS is not None
    index = IdIndex(MIN_BUCKETS)
    index.insert(_ids([1, 2, 3]), _ids([0, 1, 9]))
    freq, last, out = np.zeros(5, np.int64), np.zeros(5, np.int64), np.empty(3, np.int64)
    with pytest.raises(ValueError, match="one item per id"):
        KERNELS.index_touch(index._keys, index._vals, _ids([1, 2]), out, freq, last, 1, True)
    with pytest.raises(ValueError, match="one per row"):
        KERNELS.index_touch(index._keys, index._vals, _ids([1, 2, 3]), out, freq, last[:4], 1, True)
    with pytest.raises(ValueError, match="int64"):
        KERNELS.index_touch(index._keys, index._vals, _ids([1, 2, 3]), out, freq.astype(np.int32), last, 1, True)
    with pytest.raises(ValueError, match="beyond freq and last"):  # slot 9 of a 5-row table: never written
        KERNELS.index_touch(index._keys, index._vals, _ids([1, 2, 3]), out, freq, last, 1, True)


# ---- the index's C loops: argument checks ---------------------------------------------------------------
@needs_c
def test_bad_kernel_calls_raise_and_change_nothing() -> None:
    assert KERNELS is not None
    index = IdIndex(MIN_BUCKETS)
    ids = _ids(POOL[:20])
    index.insert(ids, np.arange(20, dtype=np.int64))
    keys, vals = index._keys, index._vals
    before = keys.copy(), vals.copy()
    _, where = index.find(ids[:3])
    out = np.empty(3, np.int64)
    with pytest.raises(ValueError, match="power-of-two"):
        KERNELS.index_find(keys[:63], vals[:63], ids[:3], out, out.copy())
    with pytest.raises(ValueError, match="power-of-two"):
        KERNELS.index_find(keys, vals[:32], ids[:3], out, out.copy())
    with pytest.raises(ValueError, match="one item per id"):
        KERNELS.index_find(keys, vals, ids[:4], out, out.copy())
    with pytest.raises(ValueError, match="int64"):
        KERNELS.index_find(keys, vals, ids[:3].astype(np.int32), out, out.copy())
    with pytest.raises(ValueError, match="C-contiguous"):
        KERNELS.index_find(keys, vals, ids[:6:2], out, out.copy())
    with pytest.raises(ValueError, match="slot >= 0"):
        KERNELS.index_place(keys, vals, _ids([1, 2]), _ids([5, -1]))
    with pytest.raises(ValueError, match="slot >= 0"):
        KERNELS.index_place(keys, vals, _ids([1, 2]), _ids([5]))
    with pytest.raises(ValueError, match="outside the index"):
        KERNELS.index_remove(keys, vals, np.concatenate([where, _ids([64])]))
    with pytest.raises(ValueError, match="outside the index"):
        KERNELS.index_remove(keys, vals, _ids([-1]))
    with pytest.raises(ValueError, match="empty or given twice"):
        KERNELS.index_remove(keys, vals, np.concatenate([where, where[:1]]))
    empty = int(np.flatnonzero(vals == -1)[0])
    with pytest.raises(ValueError, match=f"bucket {empty} is empty"):
        KERNELS.index_remove(keys, vals, np.concatenate([where, _ids([empty])]))
    with pytest.raises(ValueError, match="read-only"):
        readonly = vals.copy()
        readonly.setflags(write=False)
        KERNELS.index_remove(keys, readonly, where)
    assert keys.tobytes() == before[0].tobytes() and vals.tobytes() == before[1].tobytes()
    full_keys, full_vals = np.arange(4, dtype=np.int64), np.arange(4, dtype=np.int64)  # no empty bucket
    with pytest.raises(RuntimeError, match="full"):
        KERNELS.index_place(full_keys, full_vals, _ids([9]), _ids([9]))
    slots, where = np.empty(1, np.int64), np.empty(1, np.int64)
    KERNELS.index_find(full_keys, full_vals, _ids([9]), slots, where)  # a miss in a full index still ends
    assert slots.tolist() == where.tolist() == [-1]


# ---- a whole table: the same results on either path ------------------------------------------------
def _run_table(path: str) -> tuple[list[np.ndarray], dict[str, np.ndarray], Any]:
    with _path(path):
        table = DynamicTable(DynamicTableSpec(
            "emb", 3, optimizer=OptimizerSpec("adagrad", {"learning_rate": 0.1}),
            initializer={"name": "random_normal", "stddev": 0.1, "seed": 4}, capacity_rows=600, ttl_steps=5,
            admit_after=2, sketch_width=1 << 10, initial_rows=16))
        rng = np.random.default_rng(9)
        outputs: list[np.ndarray] = []
        for step in range(60):
            ids = rng.integers(-1_500, 1_500, size=int(rng.integers(1, 400))).astype(np.int64)
            if step % 3 == 0:
                ids = np.unique(ids)  # sorted distinct, as clients send them
            rows, found = table.lookup(ids, step=step)
            outputs += [rows, found]
            grads = rng.normal(size=(ids.size, 3)).astype(np.float32)
            outputs.append(np.array(table.apply_gradients(ids, grads, step)))
            if step % 7 == 0:
                outputs.append(np.array(table.evict(step)))
        outputs += list(table.lookup(np.arange(-1_500, 1_500, dtype=np.int64), create=False))
        return outputs, table.snapshot(), table.stats()


@needs_c
def test_a_table_gives_the_same_results_on_either_path() -> None:
    c_outputs, c_snapshot, c_stats = _run_table("c")
    np_outputs, np_snapshot, np_stats = _run_table("numpy")
    assert c_stats == np_stats and c_stats.evicted_capacity > 0 and c_stats.evicted_ttl > 0
    assert len(c_outputs) == len(np_outputs)
    for a, b in zip(c_outputs, np_outputs, strict=True):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()
    assert sorted(c_snapshot) == sorted(np_snapshot)
    for key, value in c_snapshot.items():
        assert value.dtype == np_snapshot[key].dtype and value.tobytes() == np_snapshot[key].tobytes(), key
