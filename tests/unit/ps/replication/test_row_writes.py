"""A backup writes a delta's rows as numpy's ``target[rows] = array`` would, byte for byte (issue 28):
psflow/ps/replication/deltas.py sets each row of a C-contiguous array as one opaque item (half the CPU),
and falls back to numpy's assignment where the arrays are not laid out for that."""

from __future__ import annotations

import numpy as np
import pytest

from psflow.ps.replication.deltas import _put_rows

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
