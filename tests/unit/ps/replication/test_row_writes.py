"""A backup writes a delta's rows as numpy's ``target[rows] = array`` would, byte for byte (issue 28):
psflow/ps/replication/deltas.py sets each row of a C-contiguous array as one opaque item (half the CPU),
and falls back to numpy's assignment where the arrays are not laid out for that; a ``pack/`` array (value and
slots stacked) goes in one C call (``scatter_rows``) where the kernels were built, the same bytes."""

from __future__ import annotations

import numpy as np
import pytest

from psflow.optim import OptimizerSpec
from psflow.ps.optimizers import make_optimizer
from psflow.ps.protocol import PartDelta
from psflow.ps.replication import deltas
from psflow.ps.replication.deltas import _put_rows, capture, write
from psflow.ps.store import ParameterStore
from psflow.rpc.api import InvalidRequest

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("shape", [(1000, 1), (1000, 8), (1000, 3, 2), (1000,)])
def test_rows_written_equal_numpys_assignment(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    target = rng.normal(size=shape).astype(np.float32)
    rows = np.array([5, 999, 0, 17, 5], np.int64)  # a repeated row: the last one wins, as in numpy
    values = rng.normal(size=(len(rows), *shape[1:])).astype(np.float32)
    want = target.copy()
    want[rows] = values
    _put_rows(target, rows, values)
    assert target.tobytes() == want.tobytes()


def test_a_strided_target_falls_back_to_numpys_assignment() -> None:
    base = np.zeros((100, 8), np.float32)
    target = base[:, ::2]  # not C-contiguous
    rows = np.array([3, 50], np.int64)
    values = np.ones((2, 4), np.float32)
    _put_rows(target, rows, values)
    assert base[3].tolist() == [1, 0, 1, 0, 1, 0, 1, 0] and float(base.sum()) == 8.0


def test_a_stacked_capture_writes_the_same_bytes_with_and_without_the_c_loop(
        monkeypatch: pytest.MonkeyPatch) -> None:
    optimizer = make_optimizer(OptimizerSpec("adagrad", {"learning_rate": 0.1}))
    primary = ParameterStore()
    part = primary.create("w", 0, (64, 4), 0, 64, "float32", {"name": "random_normal", "seed": 4}, optimizer)
    rng = np.random.default_rng(3)
    part.slots["accumulator"][:] = rng.random(part.value.shape).astype(np.float32)
    rows = np.array([0, 9, 33, 63], np.int64)
    delta = capture(part, rows)
    assert [name for name in delta.arrays] == ["pack/value|slot/accumulator"]
    delta = PartDelta("w/part_0", np.array([0, 9, 33, 63, 9], np.int64),  # a repeated row: the last one wins
                      {"pack/value|slot/accumulator": np.concatenate(
                          [delta.arrays["pack/value|slot/accumulator"], rng.random((2, 1, 4)).astype(np.float32)],
                          axis=1)})
    written = []
    for native in (True, False):
        if not native:
            monkeypatch.setattr(deltas, "_SCATTER_ROWS", None)
        backup = ParameterStore()
        backup.create("w", 0, (64, 4), 0, 64, "float32", {"name": "zeros"}, optimizer)
        write(backup, delta)
        got = backup.get("w/part_0")
        written.append((got.value.tobytes(), got.slots["accumulator"].tobytes()))
    assert written[0] == written[1]
    assert written[0][0] != ParameterStore().create("w", 0, (64, 4), 0, 64, "float32", {"name": "zeros"},
                                                    optimizer).value.tobytes()


@pytest.mark.parametrize("native", [True, False])
def test_a_stacked_row_outside_the_partition_is_refused_by_name(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not native:
        monkeypatch.setattr(deltas, "_SCATTER_ROWS", None)
    optimizer = make_optimizer(OptimizerSpec("adagrad", {"learning_rate": 0.1}))
    store = ParameterStore()
    part = store.create("w", 0, (8, 2), 0, 8, "float32", {"name": "zeros"}, optimizer)
    block = np.ones((2, 2, 2), np.float32)
    with pytest.raises(InvalidRequest, match="variable 'w' partition 0 .*(row 8 is outside 0-7|out of bounds)"):
        write(store, PartDelta("w/part_0", np.array([1, 8], np.int64), {"pack/value|slot/accumulator": block}))
    assert not part.value.any()  # nothing written


def test_a_stack_with_strided_row_numbers_is_written_as_numpy_writes_it() -> None:
    """Row numbers that are a view with a stride (valid, not C-contiguous) go to numpy, not refused by the C loop."""
    optimizer = make_optimizer(OptimizerSpec("adagrad", {"learning_rate": 0.1}))
    store = ParameterStore()
    part = store.create("w", 0, (8, 2), 0, 8, "float32", {"name": "zeros"}, optimizer)
    rows = np.arange(8, dtype=np.int64)[::2]
    block = np.arange(16, dtype=np.float32).reshape(2, 4, 2)
    want_value, want_accumulator = part.value.copy(), part.slots["accumulator"].copy()
    want_value[rows], want_accumulator[rows] = block[0], block[1]
    write(store, PartDelta("w/part_0", rows, {"pack/value|slot/accumulator": block}))
    assert part.value.tobytes() == want_value.tobytes()
    assert part.slots["accumulator"].tobytes() == want_accumulator.tobytes()
