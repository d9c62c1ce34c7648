"""Lazy static partitions (issue 29): rows built on first touch read, update, save and replicate bit-equal to
an eager partition's, and creating one does not touch the table's memory."""

from __future__ import annotations

import os

import numpy as np
import pytest
from safetensors.numpy import load as safetensors_load

import psflow.ps.lazy_rows as lazy_rows
import psflow.ps.row_marks as row_marks
from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.averages import MovingAverages
from psflow.ps.built_rows import whole_rows
from psflow.ps.initializers import initial_rows, initial_value
from psflow.ps.lazy_rows import lazy_eligible
from psflow.ps.optimizers import make_optimizer
from psflow.ps.replication.deltas import capture, capture_averages, write
from psflow.ps.service import ParameterService
from psflow.ps.shard_snapshot import partition_copy as _snapshot
from psflow.ps.store import ParameterStore, PartitionState
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(120)

SPECS = [
    {"name": "zeros"},
    {"name": "constant", "value": 0.25},
    {"name": "random_uniform", "minval": -1, "maxval": 2, "seed": 3},
    {"name": "random_normal", "mean": 0.5, "stddev": 2.0, "seed": 11},
    {"name": "truncated_normal", "stddev": 0.35, "seed": 11},
    {"name": "glorot_uniform", "seed": 5},
]
OPTIMIZERS = {
    "sgd": OptimizerSpec("sgd", {"learning_rate": 0.5}),
    "adagrad": OptimizerSpec("adagrad", {"learning_rate": 0.3, "initial_accumulator_value": 0.7}),
    "ftrl": OptimizerSpec("ftrl", {"learning_rate": 0.2, "initial_accumulator_value": 0.4,
                                   "l1_regularization_strength": 0.01}),
    "momentum": OptimizerSpec("momentum", {"learning_rate": 0.1, "momentum": 0.9}),
    "rmsprop": OptimizerSpec("rmsprop", {"learning_rate": 0.1, "centered": True}),
    "adam": OptimizerSpec("adam", {"learning_rate": 0.01}),  # its sparse update moves every row: eager
}
FULL, START, STOP = (5003, 3), 1000, 4001  # the partition: rows 1000-4000 of the variable


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: str(s["name"]))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_initial_rows_are_bit_equal_to_the_eager_initial_value(spec: dict[str, object], dtype: str) -> None:
    whole = initial_value(spec, FULL, 0, FULL[0], dtype)
    rows = np.random.default_rng(0).integers(0, FULL[0], 777).astype(np.int64)
    got = initial_rows(spec, FULL, rows, dtype)
    assert got.shape == (777, 3) and got.dtype == np.dtype(dtype)
    assert got.tobytes() == whole[rows].tobytes()
    assert initial_rows(spec, (10,), np.array([9, 2]), dtype).tobytes() == initial_value(spec, (10,), 0, 10, dtype)[[9, 2]].tobytes()


def test_which_partitions_are_lazy() -> None:
    adagrad, adam = make_optimizer(OPTIMIZERS["adagrad"]), make_optimizer(OPTIMIZERS["adam"])
    assert lazy_eligible((1 << 18, 8), "float32", adagrad)  # 8 MiB: an embedding table
    assert lazy_eligible((1 << 18, 8), "float32", None)
    assert not lazy_eligible((208, 256), "float32", adagrad)  # a dense layer (208 KiB)
    assert not lazy_eligible((1 << 18, 8), "float32", adam)  # its sparse update touches every row
    assert lazy_eligible((1 << 20,), "float32", adagrad)  # a 4 MiB vector (a wide model's weights) too


def _pair(opt: str, spec: dict[str, object], average: float | None,
          monkeypatch: pytest.MonkeyPatch) -> tuple[PartitionState, PartitionState]:
    """An eager and a lazy partition of the same variable."""
    optimizer = make_optimizer(OPTIMIZERS[opt])
    monkeypatch.setattr(lazy_rows, "LAZY_MIN_BYTES", 1 << 60)
    eager = ParameterStore().create("w", 1, FULL, START, STOP, "float32", dict(spec), optimizer, average_decay=average)
    monkeypatch.setattr(lazy_rows, "LAZY_MIN_BYTES", 1)
    lazy = ParameterStore().create("w", 1, FULL, START, STOP, "float32", dict(spec), make_optimizer(OPTIMIZERS[opt]),
                                   average_decay=average)
    assert eager.lazy is None
    assert (lazy.lazy is not None) == (opt != "adam")
    return eager, lazy


def _same(a: PartitionState, b: PartitionState) -> None:
    """Bit-equal values, slots and averages, read through what a checkpoint saves."""
    va, sa = _snapshot(a)
    vb, sb = _snapshot(b)
    assert va.tobytes() == vb.tobytes()
    assert sorted(sa) == sorted(sb)
    for name in sa:
        assert sa[name].tobytes() == sb[name].tobytes(), name


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("average", [None, 0.99])
@pytest.mark.parametrize("first_touch", ["c", "numpy"])
@pytest.mark.parametrize("spec", [SPECS[4], SPECS[1]], ids=["random", "constant"])  # constant: one row, broadcast
def test_lazy_partition_reads_and_updates_bit_equal_to_an_eager_one(
        opt: str, average: float | None, first_touch: str, spec: dict[str, object],
        monkeypatch: pytest.MonkeyPatch) -> None:
    if first_touch == "c" and lazy_rows._FIRST_TOUCH is None:
        pytest.skip("psflow.ps._kernels was not built")
    if first_touch == "numpy":
        monkeypatch.setattr(lazy_rows, "_FIRST_TOUCH", None)
    eager, lazy = _pair(opt, spec, average, monkeypatch)
    _same(eager, lazy)  # a checkpoint of an untouched lazy partition holds the initial values
    assert lazy.lazy is None or lazy.lazy.count == 0  # ... without building a row
    rng = np.random.default_rng(1)
    n = STOP - START
    clock = MovingAverages("ps/0", catch_up=False)
    for step in range(1, 25):
        rows = rng.integers(0, n, 40).astype(np.int64)
        assert ParameterStore.read(eager, rows).tobytes() == ParameterStore.read(lazy, rows).tobytes()
        grad_rows = rng.integers(0, n, 30).astype(np.int64)  # repeats included
        grad = rng.standard_normal((30, 3)).astype(np.float32)
        for part in (eager, lazy):
            ParameterStore.apply_sparse(part, grad_rows, grad, step=step)
            clock.move([part], step)
        if step == 20 and opt == "sgd":  # a dense update builds every row
            dense = rng.standard_normal((n, 3)).astype(np.float32)
            for part in (eager, lazy):
                ParameterStore.apply_dense(part, dense, step=step)
            assert lazy.lazy is None
        if average is not None:
            assert (ParameterStore.read(eager, rows, average=True).tobytes()
                    == ParameterStore.read(lazy, rows, average=True).tobytes())
        _same(eager, lazy)
    if lazy.lazy is not None:
        assert 0 < lazy.lazy.count < n  # only the touched rows were built
    assert ParameterStore.read(eager, None).tobytes() == ParameterStore.read(lazy, None).tobytes()
    assert lazy.lazy is None  # a whole read builds every row


@pytest.mark.parametrize("first_touch", ["c", "numpy"])
def test_rows_whose_build_failed_stay_unbuilt(first_touch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build that raises (out of memory, say) leaves the rows unmarked: the next touch builds them."""
    if first_touch == "c" and lazy_rows._FIRST_TOUCH is None:
        pytest.skip("psflow.ps._kernels was not built")
    if first_touch == "numpy":
        monkeypatch.setattr(lazy_rows, "_FIRST_TOUCH", None)
    eager, lazy = _pair("ftrl", SPECS[3], None, monkeypatch)
    assert lazy.lazy is not None
    ParameterStore.read(lazy, np.array([3, 4], np.int64))

    def fail(*args: object, **kwargs: object) -> None:
        raise MemoryError("no memory for the rows")

    with monkeypatch.context() as m:
        m.setattr(lazy_rows.LazyRows, "_write_initial", fail)
        with pytest.raises(MemoryError):
            ParameterStore.read(lazy, np.array([4, 9, 3, 11, 9], np.int64))
    assert lazy.lazy.count == 2 and np.flatnonzero(lazy.lazy.marks).tolist() == [3, 4]
    rows = np.array([4, 9, 3, 11, 9], np.int64)
    assert ParameterStore.read(lazy, rows).tobytes() == ParameterStore.read(eager, rows).tobytes()
    assert lazy.lazy.count == 4
    _same(eager, lazy)


def test_all_rows_touched_drops_the_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    eager, lazy = _pair("adagrad", SPECS[2], None, monkeypatch)
    rows = np.arange(STOP - START, dtype=np.int64)
    ParameterStore.read(lazy, rows[::2].copy())
    assert lazy.lazy is not None and lazy.lazy.count == rows[::2].size
    ParameterStore.read(lazy, rows[::-1].copy())
    assert lazy.lazy is None  # every row built: no more checks on the hot path
    _same(eager, lazy)


@pytest.mark.parametrize("native", [True, False])
def test_marking_rows_counts_each_row_once(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """mark(rows) (a replica's entry) counts only the rows not marked before, each once though repeated, so
    the partition drops its marks exactly when the last row is marked (the count is kept, not recounted); with
    the C loop (first_touch) and without it."""
    if not native:
        monkeypatch.setattr(lazy_rows, "_FIRST_TOUCH", None)
    marks = lazy_rows.LazyRows({"name": "zeros"}, (10, 2), 0, 10, "float32", None)
    marks.mark(np.array([3, 3, 7], np.int64))
    assert marks.count == 2 and not marks.complete
    marks.mark(np.array([0, 1, 2, 7], np.int64))  # sorted, distinct, one marked before
    assert marks.count == 5 == int(np.count_nonzero(marks.marks))
    marks.mark(np.array([7, 0, 1, 2, 0], np.int64))
    assert marks.count == 5
    marks.mark(np.array([4], np.int64))
    assert marks.count == 6
    marks.mark(np.arange(10, dtype=np.int64))
    assert marks.count == 10 and marks.complete
    marks.mark(np.arange(10, dtype=np.int64)[::-1].copy())
    assert marks.count == 10


def _marked_pair(native: bool, optimizer: str, spec: dict[str, object],
                 monkeypatch: pytest.MonkeyPatch) -> tuple[PartitionState, PartitionState]:
    """:func:`_pair` with row marks, the mark passes in C (skipped where the kernels were not built) or numpy."""
    if native and lazy_rows._TOUCH_ROWS is None:
        pytest.skip("psflow.ps._kernels was not built")
    if not native:
        _no_native_marks(monkeypatch)
    return _pair(optimizer, spec, None, monkeypatch)


def _no_native_marks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numpy twins of the mark passes (first_touch, touch_rows, RowMarks.mark's stamp)."""
    monkeypatch.setattr(lazy_rows, "_FIRST_TOUCH", None)
    monkeypatch.setattr(lazy_rows, "_TOUCH_ROWS", None)
    monkeypatch.setattr(row_marks, "_TOUCH_ROWS", None)


@pytest.mark.parametrize("native", [True, False])
def test_a_sparse_update_marks_changed_exactly_its_rows_built_or_new(native: bool,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows of a sparse update are stamped changed (incremental checkpoints) in the pass that finds the new
    ones: rows built before (by a read) and rows new to the partition alike, at the clock's epoch; rows only
    read are not; the C pass and the numpy twins mark the same rows."""
    eager, lazy = _marked_pair(native, "adagrad", SPECS[4], monkeypatch)
    assert lazy.lazy is not None and lazy.marks is not None
    ParameterStore.read(lazy, np.array([5, 6, 7], np.int64))  # built, not changed
    epoch = lazy.marks.clock.advance() + 1  # a snapshot: later changes carry the next epoch
    rows = np.array([7, 40, 5, 41], np.int64)  # 7 and 5 built by the read, 40 and 41 new
    grad = np.ones((4, 3), np.float32)
    for part in (eager, lazy):
        ParameterStore.apply_sparse(part, rows, grad, step=1)
    assert lazy.marks.changed_since(lazy.marks.clock.token, epoch - 1).tolist() == [5, 7, 40, 41]
    assert lazy.marks.changed_at[[5, 7, 40, 41]].tolist() == [epoch] * 4
    assert int(np.count_nonzero(lazy.marks.changed_at)) == 4  # row 6 was read, never changed
    assert np.flatnonzero(lazy.lazy.marks).tolist() == [5, 6, 7, 40, 41]
    _same(eager, lazy)


@pytest.mark.parametrize("native", [True, False])
def test_a_failed_build_in_a_sparse_update_marks_its_new_rows_neither_built_nor_changed(
        native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row is never marked changed before it is built (an increment saves a changed row as it is): where
    building an update's new rows fails, they stay unbuilt and unchanged; the rows built before are stamped
    (they are saved as they are, which is harmless) and the next update builds and changes the rest."""
    eager, lazy = _marked_pair(native, "ftrl", SPECS[3], monkeypatch)
    assert lazy.lazy is not None and lazy.marks is not None
    ParameterStore.read(lazy, np.array([3, 4], np.int64))
    rows = np.array([4, 9, 3, 11], np.int64)
    grad = np.ones((4, 3), np.float32)

    def fail(*args: object, **kwargs: object) -> None:
        raise MemoryError("no memory for the rows")

    with monkeypatch.context() as m:
        m.setattr(lazy_rows.LazyRows, "_write_initial", fail)
        with pytest.raises(MemoryError):
            ParameterStore.apply_sparse(lazy, rows, grad, step=1)
    assert np.flatnonzero(lazy.lazy.marks).tolist() == [3, 4]
    assert lazy.marks.changed_at[[9, 11]].tolist() == [0, 0]
    for part in (eager, lazy):
        ParameterStore.apply_sparse(part, rows, grad, step=1)
    assert lazy.marks.changed_since(lazy.marks.clock.token, 0).tolist() == [3, 4, 9, 11]
    _same(eager, lazy)


@pytest.mark.parametrize("opt", ["adagrad", "ftrl"])
def test_replicated_lazy_partition_reads_the_primarys_values(opt: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full capture carries the marks; row captures mark the rows written; the backup reads as the primary."""
    _, primary = _pair(opt, SPECS[3], 0.9, monkeypatch)
    _, backup = _pair(opt, SPECS[3], 0.9, monkeypatch)
    rng = np.random.default_rng(2)
    store = _single(backup)  # the backup's store
    clock = MovingAverages("ps/0", catch_up=False)
    for step in range(1, 6):
        rows = rng.integers(0, STOP - START, 25).astype(np.int64)
        ParameterStore.apply_sparse(primary, rows, rng.standard_normal((25, 3)).astype(np.float32), step=step)
        clock.move([primary], step)
        if step == 2:  # a backup joins: the whole partition
            write(store, capture(primary, None))
            assert backup.lazy is not None and primary.lazy is not None
            assert backup.lazy.count == primary.lazy.count
        elif step > 2:
            write(store, capture(primary, rows, averages=False))
            for delta in capture_averages(_single(primary), set()):
                write(store, delta)
        ParameterStore.read(primary, rng.integers(0, STOP - START, 10).astype(np.int64))  # built on the primary only
    _same(primary, backup)
    everything = np.arange(STOP - START, dtype=np.int64)
    assert ParameterStore.read(primary, everything).tobytes() == ParameterStore.read(backup, everything).tobytes()


def _single(part: PartitionState) -> ParameterStore:
    """A store holding ``part`` alone."""
    store = ParameterStore()
    store._parts[part.key] = part
    return store


def test_checkpoint_shard_of_a_lazy_partition_holds_its_built_rows_reading_as_eager_values_and_builds_no_row(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lazy_rows, "LAZY_MIN_BYTES", 1)
    variables = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["127.0.0.1:1"]})))
    variables.get_variable("emb", (3000, 4), initializer={"name": "random_normal", "seed": 9})
    layout = [p.to_json() for p in variables.placements()]
    svc = ParameterService(0, holds_global_step=True)
    optimizer = OPTIMIZERS["adagrad"].to_json()
    svc.register(Frame({"layout": layout, "optimizer": optimizer, "client": "w0", "chief": True}))
    part = svc.store.get("emb/part_0")
    assert part.lazy is not None
    svc.push(Frame({"grads": [["emb/part_0", "sparse"]], "step": True},
                   {"g/emb/part_0": np.ones((2, 4), np.float32), "i/emb/part_0": np.array([5, 2999])}))
    meta, arrays = svc.handlers()["SaveShard"](Frame({"path": None, "shard": 0, "num_shards": 1}))
    tensors = safetensors_load(arrays["shard"].tobytes())
    assert part.lazy is not None and part.lazy.count == 2  # the save built nothing in the partition
    (record,) = meta["partitions"]
    assert record["built"] == 2 and record["initializer"] == {"name": "random_normal", "seed": 9}
    assert tensors["emb/part_0@built_rows"].tolist() == [5, 2999]  # only the built rows are stored
    assert tensors["emb/part_0"].shape == tensors["emb/part_0:accumulator"].shape == (2, 4)
    spec = record["initializer"]
    value = whole_rows(spec, (3000, 4), "float32", 0, 0, 3000, tensors["emb/part_0@built_rows"],
                       tensors["emb/part_0"], None)
    accum_saved = whole_rows(spec, (3000, 4), "float32", 0, 0, 3000, tensors["emb/part_0@built_rows"],
                             tensors["emb/part_0:accumulator"], tensors["emb/part_0@initial/accumulator"])
    want_value = initial_value({"name": "random_normal", "seed": 9}, (3000, 4), 0, 3000)
    accum = np.full((3000, 4), 0.7, np.float32)
    untouched = np.setdiff1d(np.arange(3000), [5, 2999])
    assert value[untouched].tobytes() == want_value[untouched].tobytes()
    assert accum_saved[untouched].tobytes() == accum[untouched].tobytes()
    assert not np.array_equal(value[[5, 2999]], want_value[[5, 2999]])  # the pushed rows moved
    # Restore whole (a checkpoint of every row): the loaded partition is whole (no marks), and reads what was saved.
    load = {"v/emb/part_0": value, "s/emb/part_0/accumulator": accum_saved}
    svc.handlers()["LoadShard"](Frame({"parts": ["emb/part_0"], "global_step": 1, "restored_step": 1}, load))
    assert part.lazy is None
    assert ParameterStore.read(part, None).tobytes() == value.tobytes()


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_creating_a_large_lazy_table_does_not_touch_its_memory() -> None:
    """A 2^22 x 8 float32 table (128 MiB) with Adagrad's slot (128 MiB more): RSS grows by far less."""
    optimizer = make_optimizer(OPTIMIZERS["adagrad"])
    shape = (1 << 22, 8)
    before = _rss_bytes()
    part = ParameterStore().create("emb", 0, shape, 0, shape[0], "float32",
                                   {"name": "truncated_normal", "seed": 1}, optimizer)
    grown = _rss_bytes() - before
    assert part.lazy is not None
    assert grown < (32 << 20), f"RSS grew {grown:,} bytes creating a {2 * part.value.nbytes:,}-byte table"
    rows = np.array([0, 12345, (1 << 22) - 1], dtype=np.int64)
    got = ParameterStore.read(part, rows)
    assert got.tobytes() == initial_rows({"name": "truncated_normal", "seed": 1}, shape, rows).tobytes()
    assert part.slots["accumulator"][rows].tobytes() == np.full((3, 8), 0.7, np.float32).tobytes()
