"""Row marks (incremental checkpoints' "which rows changed since snapshot E"): one byte a row, exact over the
last saves however many a run takes, and a whole save where a base is older than the marks can tell."""

from __future__ import annotations

import numpy as np
import pytest

import psflow.ps.row_marks as row_marks
from psflow.ps.row_marks import MarkClock, RowMarks

pytestmark = pytest.mark.timeout(60)


def test_marks_take_one_byte_a_row_and_a_fresh_partition_has_changed_nothing() -> None:
    marks = RowMarks(MarkClock(), 1000)
    assert marks.changed_at.nbytes == 1000
    assert marks.changed_since(marks.clock.token, 0).tolist() == []
    assert marks.changed_since("another task", 0) is None and marks.changed_since(marks.clock.token, None) is None


@pytest.mark.parametrize("native", [True, False])
def test_changed_since_is_exact_over_many_saves_and_whole_past_the_window(native: bool,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """700 snapshots, rows stamped between them: changed_since(E) holds exactly the rows stamped after E for
    every E in the last KEPT_EPOCHS (a reference keeps each row's epoch in int64); an older E saves the partition
    whole (None), never a set that lacks a changed row; a partition untouched for hundreds of saves too."""
    if not native:
        monkeypatch.setattr(row_marks, "_TOUCH_ROWS", None)
    clock = MarkClock()
    n = 500
    marks, quiet = RowMarks(clock, n), RowMarks(clock, n)
    want = np.zeros(n, np.int64)
    rng = np.random.default_rng(3)
    snapshots: list[int] = []
    for save in range(700):
        if save % 7 != 3:  # some saves see no change at all
            rows = np.unique(rng.integers(0, n, 20)).astype(np.int64)
            marks.mark(rows)
            want[rows] = clock.epoch
        if save == 350:
            marks.mark(None)
            want[:] = clock.epoch
        if save == 10:
            quiet.mark(np.array([4], np.int64))
        snapshots.append(clock.advance())
        for epoch in (snapshots[-1], *snapshots[-row_marks.KEPT_EPOCHS:][:3], *snapshots[-40:-38]):
            got = marks.changed_since(clock.token, epoch)
            assert got is not None and got.tolist() == np.flatnonzero(want > epoch).tolist(), (save, epoch)
        if save > row_marks.KEPT_EPOCHS * 2:
            oldest = snapshots[-3 * row_marks.KEPT_EPOCHS] if len(snapshots) > 3 * row_marks.KEPT_EPOCHS else 0
            got = marks.changed_since(clock.token, oldest)
            assert got is None or set(np.flatnonzero(want > oldest).tolist()) <= set(got.tolist())
    assert marks.base > 0  # rebased (a byte holds 255 epochs)
    quiet.mark(np.array([7], np.int64))  # 690 saves later
    assert quiet.changed_since(clock.token, snapshots[-1]).tolist() == [7]
    got = quiet.changed_since(clock.token, snapshots[5])
    assert got is None or {4, 7} <= set(got.tolist())
