"""Reading TensorBoard summaries without TensorBoard: read_scalars and ScalarTail (psflow/train/summary.py).

The event files are written by psflow's SummaryWriter, as the chief writes them; one test checks TensorBoard's own
reader agrees, another reads a file written by tensorboardX where it is installed.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from psflow.train.summary import ScalarTail, SummaryWriter, read_scalars

Series = dict[str, list[tuple[int, float]]]


def _write(logdir: Path, points: dict[int, dict[str, float]]) -> Path:
    """Writes ``step -> {tag: value}`` with one SummaryWriter; returns its (closed, complete) events file."""
    writer = SummaryWriter(str(logdir))
    for step, values in points.items():
        writer.scalars(values, step)
    writer.close()
    (path,) = [p for p in logdir.iterdir() if p.name.startswith("events.out.tfevents")]
    return path


def _f32(x: float) -> float:
    """``x`` as TensorBoard stores it (simple_value is a float32)."""
    import numpy as np

    return float(np.float32(x))


def _expected(points: dict[int, dict[str, float]]) -> Series:
    out: Series = {}
    for step, values in sorted(points.items()):
        for tag, value in values.items():
            out.setdefault(tag, []).append((step, _f32(value)))
    return out


def _merge(polls: list[Series]) -> Series:
    """Polls merged in order, a later value replacing an earlier one at the same step (how a status page keeps them)."""
    merged: dict[str, dict[int, float]] = {}
    for poll in polls:
        for tag, points in poll.items():
            merged.setdefault(tag, {}).update(points)
    return {tag: sorted(series.items()) for tag, series in merged.items()}


POINTS = {step: {"train/loss": 1.0 / (step + 1), "eval/auc": 0.5 + step / 1000} for step in range(0, 200, 10)}
POINTS[200] = {"train/loss": 0.01, "ps/0/pulls_per_sec": 123.5}


def test_read_scalars_reads_every_tag_and_step_by_step(tmp_path: Path) -> None:
    _write(tmp_path / "run" / "nested", POINTS)  # searched recursively
    assert read_scalars(str(tmp_path / "run")) == _expected(POINTS)
    assert read_scalars(str(tmp_path / "empty")) == {}


def test_read_scalars_agrees_with_tensorboards_reader(tmp_path: Path) -> None:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    _write(tmp_path, POINTS)
    acc = accumulator.EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    acc.Reload()
    theirs = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    assert read_scalars(str(tmp_path)) == theirs


def test_a_file_tensorboardx_wrote_reads_the_same(tmp_path: Path) -> None:
    tensorboardx = pytest.importorskip("tensorboardX")
    writer = tensorboardx.SummaryWriter(logdir=str(tmp_path))
    for step, values in POINTS.items():
        for tag, value in values.items():
            writer.add_scalar(tag, value, step)
    writer.close()
    assert read_scalars(str(tmp_path)) == _expected(POINTS)


def test_each_write_is_readable_before_the_writer_closes(tmp_path: Path) -> None:
    writer = SummaryWriter(str(tmp_path))
    tail = ScalarTail(str(tmp_path))
    try:
        writer.scalars({"train/loss": 0.5}, 10)
        assert tail.poll() == {"train/loss": [(10, 0.5)]}
        writer.scalars({"train/loss": 0.25, "eval/auc": 0.75}, 20)
        assert tail.poll() == {"train/loss": [(20, 0.25)], "eval/auc": [(20, 0.75)]}
    finally:
        writer.close()
    unused = SummaryWriter(str(tmp_path))  # a worker that could have been elected chief and was not: no file
    unused.close()
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("events.out.tfevents")]) == 1
    second = SummaryWriter(str(tmp_path))  # another writer in the same second: a file of its own
    second.session_start(20)  # read by TensorBoard, skipped by psflow's readers
    second.close()
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("events.out.tfevents")]) == 2
    assert read_scalars(str(tmp_path)) == {"train/loss": [(10, 0.5), (20, 0.25)], "eval/auc": [(20, 0.75)]}


def test_newest_write_wins_across_event_files(tmp_path: Path) -> None:
    _write(tmp_path / "first", {10: {"train/loss": 1.0}, 20: {"train/loss": 2.0}, 30: {"train/loss": 3.0}})
    time.sleep(0.01)  # a later wall time
    _write(tmp_path / "restarted", {20: {"train/loss": 20.0}, 40: {"train/loss": 40.0}})
    assert read_scalars(str(tmp_path)) == {"train/loss": [(10, 1.0), (20, 20.0), (30, 3.0), (40, 40.0)]}


def test_tail_returns_only_what_was_appended_and_retries_a_partial_record(tmp_path: Path) -> None:
    source = _write(tmp_path / "written", POINTS)
    data = source.read_bytes()
    live = tmp_path / "live" / source.name
    live.parent.mkdir()
    live.write_bytes(b"")
    tail = ScalarTail(str(tmp_path / "live"))
    polls: list[Series] = []
    for end in [*range(0, len(data), 37), len(data)]:  # cuts inside headers, data and checksums of records
        with open(live, "r+b") as f:
            f.seek(0, os.SEEK_END)
            f.write(data[f.tell() : end])
        polls.append(tail.poll())
    assert tail.poll() == {}
    assert _merge(polls) == _expected(POINTS)
    # Each point came exactly once: only what was appended since the last poll.
    assert sum(len(p) for poll in polls for p in poll.values()) == sum(len(v) for v in POINTS.values())


def test_tail_picks_up_new_files_and_newer_writes_of_a_step(tmp_path: Path) -> None:
    tail = ScalarTail(str(tmp_path))
    assert tail.poll() == {}  # the directory does not exist yet
    _write(tmp_path / "a", {10: {"train/loss": 1.0}, 20: {"train/loss": 2.0}})
    polls = [tail.poll()]
    assert polls[0] == {"train/loss": [(10, 1.0), (20, 2.0)]}
    time.sleep(0.01)
    _write(tmp_path / "b", {20: {"train/loss": 5.0, "eval/auc": 0.75}, 30: {"train/loss": 3.0}})
    polls.append(tail.poll())
    assert polls[1] == {"train/loss": [(20, 5.0), (30, 3.0)], "eval/auc": [(20, 0.75)]}
    assert tail.poll() == {}
    assert _merge(polls) == read_scalars(str(tmp_path))


def test_damaged_records_are_skipped_and_logged_never_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    points = {step: {"train/loss": float(step)} for step in range(1, 6)}
    good = _write(tmp_path / "good", points)
    data = bytearray(good.read_bytes())
    # Record 0 is file_version; records 1..5 hold steps 1..5. Find each record's header offset.
    heads, pos = [], 0
    while pos < len(data):
        heads.append(pos)
        pos += 16 + int.from_bytes(data[pos : pos + 8], "little")
    bad_data = bytearray(data)
    bad_data[heads[2] + 12 + 3] ^= 0xFF  # step 2's data: its data checksum no longer matches
    (tmp_path / "crc").mkdir()
    (tmp_path / "crc" / good.name).write_bytes(bytes(bad_data))
    bad_frame = bytearray(data)
    bad_frame[heads[4]] ^= 0x01  # step 4's length: framing lost from there on
    (tmp_path / "frame").mkdir()
    (tmp_path / "frame" / good.name).write_bytes(bytes(bad_frame))
    with caplog.at_level(logging.WARNING, logger="psflow.train.summary"):
        assert read_scalars(str(tmp_path / "crc")) == {"train/loss": [(1, 1.0), (3, 3.0), (4, 4.0), (5, 5.0)]}
        tail = ScalarTail(str(tmp_path / "frame"))
        assert tail.poll() == {"train/loss": [(1, 1.0), (2, 2.0), (3, 3.0)]}
        with open(tmp_path / "frame" / good.name, "ab") as f:
            f.write(data[heads[1] :])  # appended after the damage: never reached
        assert tail.poll() == {}
    messages = [r.getMessage() for r in caplog.records]
    assert any("data checksum mismatch" in m for m in messages), messages
    assert any("length checksum mismatch" in m and "not read" in m for m in messages), messages


def test_a_file_replaced_by_a_shorter_one_is_read_again(tmp_path: Path) -> None:
    long = _write(tmp_path / "long", POINTS)
    tail = ScalarTail(str(tmp_path / "long"))
    assert tail.poll() == _expected(POINTS)
    time.sleep(0.01)
    short = _write(tmp_path / "short", {500: {"train/loss": 5.0}})
    shutil.copyfile(short, long)
    assert tail.poll() == {"train/loss": [(500, 5.0)]}


@pytest.mark.skipif(not os.path.isdir("/sys/kernel"), reason="needs Linux's /sys, where no one can create a file")
def test_a_summary_directory_where_no_file_can_be_created_is_refused_when_the_writer_is_made(tmp_path: Path) -> None:
    """The event file is created by the first write (no empty file from a worker never elected chief), but a
    directory where nothing can be created is still refused at once, naming it: a real run with --summary-dir
    /sys/kernel trained all its steps, saved its checkpoints and only then failed at the chief's first summary
    (phase failed). Nothing is left in a directory that works."""
    from psflow.data.api import DataError

    with pytest.raises(DataError, match="/sys/kernel"):
        SummaryWriter("/sys/kernel")
    SummaryWriter(str(tmp_path)).close()
    assert list(tmp_path.iterdir()) == []
