"""One build for the new rows of many lazy partitions (a request's tables): the rows equal those built one
partition at a time, bit for bit, whatever initializers, seeds and shapes the partitions mix."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import psflow.ps.lazy_rows as lazy_rows
from psflow.optim import OptimizerSpec
from psflow.ps.initializers import initial_rows, initial_rows_many
from psflow.ps.optimizers import make_optimizer
from psflow.ps.shard_snapshot import partition_copy
from psflow.ps.store import ParameterStore, PartitionState

pytestmark = pytest.mark.timeout(120)

MIXED = [
    ({"name": "truncated_normal", "stddev": 0.35, "seed": 11}, (5003, 3)),
    ({"name": "truncated_normal", "stddev": 0.35, "seed": 12}, (5003, 3)),
    ({"name": "truncated_normal", "mean": -0.5, "stddev": 2.5, "seed": -7}, (900, 8)),  # many redraws
    ({"name": "random_normal", "mean": 0.5, "stddev": 2.0, "seed": 11}, (700, 2)),
    ({"name": "random_uniform", "minval": -1, "maxval": 2, "seed": 3}, (5003, 3)),
    ({"name": "glorot_uniform", "seed": 5}, (400, 5)),
    ({"name": "glorot_uniform", "seed": 5}, (1000,)),
    ({"name": "zeros"}, (5003, 3)),
    ({"name": "constant", "value": 0.25}, (60, 4)),
    ({"name": "truncated_normal", "seed": (1 << 64) + 3}, (300, 8)),  # a seed past 64 bits wraps as one stream's
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("count", [0, 1, 5, 777])
def test_initial_rows_many_equal_initial_rows_of_each(dtype: str, count: int) -> None:
    rng = np.random.default_rng(count)
    requests = [(spec, shape, rng.integers(0, shape[0], count if i % 3 else count // 2 + 1).astype(np.int64))
                for i, (spec, shape) in enumerate(MIXED)]
    got = initial_rows_many(requests, dtype)
    assert len(got) == len(requests)
    for (spec, shape, rows), out in zip(requests, got, strict=True):
        want = initial_rows(spec, shape, rows, dtype)
        assert out.shape == want.shape and out.dtype == want.dtype
        assert out.tobytes() == want.tobytes(), spec


def test_initial_rows_many_spans_its_chunks() -> None:
    """More elements than one chunk of the computation: the values do not depend on where a chunk ends."""
    spec, shape = MIXED[2][0], (70_000, 8)
    rows = np.arange(shape[0], dtype=np.int64)[::-1].copy()
    other = np.arange(0, 9, dtype=np.int64)
    a, b = initial_rows_many([(MIXED[0][0], MIXED[0][1], other), (spec, shape, rows)], "float32")
    assert a.tobytes() == initial_rows(MIXED[0][0], MIXED[0][1], other).tobytes()
    assert b.tobytes() == initial_rows(spec, shape, rows).tobytes()


ADAGRAD = OptimizerSpec("adagrad", {"learning_rate": 0.3, "initial_accumulator_value": 0.7})
FTRL = OptimizerSpec("ftrl", {"learning_rate": 0.2, "initial_accumulator_value": 0.4})


def _tables(lazy: bool, monkeypatch: pytest.MonkeyPatch) -> list[PartitionState]:
    """Deep (random) and wide (zeros) tables of a W&D-like model, two partitions of one of them."""
    monkeypatch.setattr(lazy_rows, "LAZY_MIN_BYTES", 1 if lazy else 1 << 60)
    store = ParameterStore()
    parts = []
    for i, (spec, shape) in enumerate(MIXED[:8]):
        opt = make_optimizer(FTRL if spec["name"] == "zeros" else ADAGRAD)
        average = 0.99 if i == 3 else None
        parts.append(store.create(f"t{i}", 0, shape, 0, shape[0] // 2, "float32", dict(spec), opt, average_decay=average))
        parts.append(store.create(f"t{i}", 1, shape, shape[0] // 2, shape[0], "float32", dict(spec), opt,
                                  average_decay=average))
    return parts


@pytest.mark.parametrize("first_touch", ["c", "numpy"])
def test_partitions_built_together_equal_eager_ones(first_touch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if first_touch == "c" and lazy_rows._FIRST_TOUCH is None:
        pytest.skip("psflow.ps._kernels was not built")
    if first_touch == "numpy":
        monkeypatch.setattr(lazy_rows, "_FIRST_TOUCH", None)
    eager, lazy = _tables(False, monkeypatch), _tables(True, monkeypatch)
    assert all(p.lazy is not None for p in lazy)
    rng = np.random.default_rng(3)
    store = ParameterStore()
    for _ in range(6):
        wanted = [(p, rng.integers(0, p.value.shape[0], 50).astype(np.int64)) for p in lazy]
        built = store.materialize_together(wanted)
        assert built == {p.key for p in lazy}
        for (part, rows), twin in zip(wanted, eager, strict=True):
            assert part.lazy is None or bool(part.lazy.marks[rows].all())  # built before the read
            got = ParameterStore.read(part, rows, built=True)  # no second look for new rows
            assert got.tobytes() == ParameterStore.read(twin, rows).tobytes()
    for part, twin in zip(lazy, eager, strict=True):
        assert part.lazy is not None and 0 < part.lazy.count == int(np.count_nonzero(part.lazy.marks))
        value, slots = partition_copy(part)
        want_value, want_slots = partition_copy(twin)
        assert value.tobytes() == want_value.tobytes(), part.describe
        assert {k: v.tobytes() for k, v in slots.items()} == {k: v.tobytes() for k, v in want_slots.items()}


def test_a_failed_build_leaves_every_partitions_rows_unbuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    eager, lazy = _tables(False, monkeypatch), _tables(True, monkeypatch)
    wanted = [(p, np.array([1, 4, 1, 7], np.int64)) for p in lazy]

    def fail(*args: object, **kwargs: object) -> None:
        raise MemoryError("no memory for the rows")

    with monkeypatch.context() as m:
        m.setattr(lazy_rows, "initial_rows_many", fail)
        with pytest.raises(MemoryError):
            ParameterStore().materialize_together(wanted)
    assert all(p.lazy is not None and p.lazy.count == 0 and not p.lazy.marks.any() for p in lazy)
    for (part, rows), twin in zip(wanted, eager, strict=True):
        assert ParameterStore.read(part, rows).tobytes() == ParameterStore.read(twin, rows).tobytes()


def test_a_partition_locked_elsewhere_is_left_to_its_own_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition whose lock another thread holds is skipped (no wait while holding other locks: no deadlock);
    its read builds its rows as before."""
    eager, lazy = _tables(False, monkeypatch), _tables(True, monkeypatch)
    rows = np.array([2, 3], np.int64)
    held = lazy[0]
    with held.lock:
        done = threading.Event()
        built: list[frozenset[str]] = []
        worker = threading.Thread(target=lambda: (built.append(ParameterStore().materialize_together(
            [(p, rows) for p in lazy])), done.set()))
        worker.start()
        assert done.wait(60), "materialize_together waited for a lock held elsewhere"
        worker.join(60)
    assert held.lazy is not None and held.lazy.count == 0
    assert built == [frozenset(p.key for p in lazy[1:])]  # the skipped one is not named: its read looks itself
    assert all(p.lazy is not None and p.lazy.count == 2 for p in lazy[1:])
    for part, twin in zip(lazy, eager, strict=True):
        assert ParameterStore.read(part, rows).tobytes() == ParameterStore.read(twin, rows).tobytes()


def test_a_partition_named_twice_gets_the_rows_of_both(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request naming one partition twice: both entries' rows are built (its lock is taken once), so a read of
    either with ``built=True`` holds the initial values."""
    eager, lazy = _tables(False, monkeypatch), _tables(True, monkeypatch)
    first, second = np.array([5, 6], np.int64), np.array([9, 5, 40], np.int64)
    wanted = [(lazy[0], first), (lazy[2], first), (lazy[0], second)]
    assert ParameterStore().materialize_together(wanted) == {lazy[0].key, lazy[2].key}
    assert lazy[0].lazy is not None and lazy[0].lazy.count == 4
    for rows in (first, second):
        assert ParameterStore.read(lazy[0], rows, built=True).tobytes() == ParameterStore.read(eager[0], rows).tobytes()


def test_a_partition_also_read_whole_is_not_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request reading one partition by rows and whole: only the rows are built together, so the partition is not
    named (its whole read builds every row itself, as the service's read does with what is returned)."""
    eager, lazy = _tables(False, monkeypatch), _tables(True, monkeypatch)
    rows = np.array([5, 6], np.int64)
    wanted: list[tuple[PartitionState, np.ndarray | None]] = [(lazy[0], rows), (lazy[2], rows), (lazy[4], rows),
                                                              (lazy[0], None)]
    built = ParameterStore().materialize_together(wanted)
    assert built == {lazy[2].key, lazy[4].key}
    for (part, part_rows), twin in zip(wanted, (eager[0], eager[2], eager[4], eager[0]), strict=True):
        got = ParameterStore.read(part, part_rows, built=part.key in built)
        assert got.tobytes() == ParameterStore.read(twin, part_rows).tobytes(), part.describe
