"""check_records: what the launcher reads of its inputs before anything starts (issue 16)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from psflow.data import DataError, TFRecordWriter, check_records, default_sparse_schema, encode_example

LINE = "1 3:1 11:1 14:1\n"


def test_a_small_input_is_read_to_its_end_and_counted(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text(LINE * 30 + "\n\n")  # blank lines are not records
    (tmp_path / "b.txt").write_text(LINE * 12)
    assert check_records(str(tmp_path / "*.txt"), "libsvm", what="--train") == 42


def test_past_the_byte_budget_only_each_files_head_is_read_and_the_count_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "big.txt"
    path.write_text(LINE * 20_000 + "1 x:2\n")  # ~320 KB; the bad line is past the head and the budget
    assert check_records(str(path), "libsvm", what="--train", head_records=100, count_bytes=1000) is None
    with pytest.raises(DataError, match="big.txt:20001: malformed token 'x:2'"):
        check_records(str(path), "libsvm", what="--train")  # within the default budget: read whole


def test_a_malformed_record_in_a_head_names_the_flag_file_and_line(tmp_path: Path) -> None:
    good, bad = tmp_path / "a.txt", tmp_path / "b.txt"
    good.write_text(LINE * 5)
    bad.write_text(LINE * 3 + "1 3:1 oops\n")
    with pytest.raises(DataError, match=rf"^--eval: {bad}:4: malformed token 'oops' \(want <id>:<value>\)$"):
        check_records([str(good), str(bad)], "libsvm", what="--eval", count_bytes=0)


def test_skip_bad_records_skips_them_and_counts_only_good_ones(tmp_path: Path) -> None:
    path = tmp_path / "a.txt.gz"
    with gzip.open(path, "wt") as f:
        f.write(LINE * 4 + "garbage\n")
    assert check_records(str(path), "libsvm", what="--train", skip_bad_records=True) == 4
    only_bad = tmp_path / "bad.txt"
    only_bad.write_text("garbage\n")
    assert check_records(str(only_bad), "libsvm", what="--train", skip_bad_records=True) == 0  # a record: not empty


def test_empty_and_missing_inputs_name_the_flag(tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    with pytest.raises(DataError, match=rf"^--train {empty}: the file holds no libsvm records"):
        check_records(str(empty), "libsvm", what="--train")
    with pytest.raises(DataError, match=rf"^--train: {tmp_path}/nope.txt: no such file$"):
        check_records(str(tmp_path / "nope.txt"), "libsvm", what="--train")
    with pytest.raises(DataError, match=r"^--train: no files match"):
        check_records(str(tmp_path / "nope-*"), "libsvm", what="--train")


def test_a_tfrecord_with_a_bad_checksum_is_named(tmp_path: Path) -> None:
    path = tmp_path / "data.tfrecord"
    with TFRecordWriter(str(path)) as writer:
        for k in range(10):
            writer.write(encode_example({"label": ("float32", [1.0]), "ids": ("int64", [k]), "values": ("float32", [1.0])}))
    assert check_records(str(path), "tfrecord", what="--train", schema=default_sparse_schema()) == 10
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"^--train: {path}: record 0 at byte 0: data checksum mismatch"):
        check_records(str(path), "tfrecord", what="--train", schema=default_sparse_schema())
