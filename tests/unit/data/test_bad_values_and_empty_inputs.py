"""Values that would surface as a NaN loss far from their record, and inputs with nothing in them
(issue 17, item 10): refused naming the file and line (or record), on every parser path."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from psflow.data import BadRecordError, DataError, read_all, require_records
from psflow.data.libsvm import _parse_fast, _parse_slow, parse_libsvm
from psflow.data.schema import default_sparse_schema
from psflow.data.text import FLOAT32_OVERFLOW, overflows_float32


# ---- float32 overflow in LIBSVM -------------------------------------------------------------
def test_the_overflow_bound_is_where_float32_rounds_to_infinity() -> None:
    below = np.nextafter(FLOAT32_OVERFLOW, 0.0)
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(FLOAT32_OVERFLOW)) and np.isfinite(np.float32(below))
        assert np.isinf(np.float32(-FLOAT32_OVERFLOW))
    assert overflows_float32([FLOAT32_OVERFLOW, -1e39, 1e39, 3.4028235e38, below, 0.0, np.nan]).tolist() == [
        True, True, True, False, False, False, False]


@pytest.mark.parametrize("token", [b"3:1e39", b"3:-1e39", b"3:3.5e38", b"3:1e308"])
def test_a_value_that_overflows_float32_is_a_malformed_line_on_both_parsers(token: bytes) -> None:
    data = b"1 1:0.5\n0 " + token + b" 4:1\n1 2:2.5e-3\n"
    assert _parse_fast(data) is None  # the fast parser hands the buffer to the line-by-line one
    for parsed in (parse_libsvm(data), _parse_slow(data)):
        ((line, message),) = parsed.errors
        assert line == 1 and "overflows float32" in message and token.decode() in message
        assert parsed.batch.num_examples == 2 and np.isfinite(parsed.batch.column().values).all()


def test_the_largest_values_that_fit_float32_are_kept() -> None:
    data = b"1 1:3.4028235e38 2:-3.4028235e38 3:1e-50\n"
    parsed = parse_libsvm(data)
    assert parsed.errors == [] and parsed.batch.column().values.tolist() == [
        float(np.finfo(np.float32).max), -float(np.finfo(np.float32).max), 0.0]
    assert _parse_fast(data) is not None


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(allow_nan=False, allow_infinity=False, width=64), min_size=1, max_size=8))
def test_fast_and_slow_parsers_agree_on_which_values_overflow(values: list[float]) -> None:
    data = b"".join(b"1 %d:%r\n" % (i, v) for i, v in enumerate(values))
    slow, full = _parse_slow(data), parse_libsvm(data)
    assert [line for line, _ in full.errors] == [line for line, _ in slow.errors] == [
        i for i, v in enumerate(values) if abs(v) >= FLOAT32_OVERFLOW]
    assert full.batch.column().values.tolist() == slow.batch.column().values.tolist()


def test_the_reader_names_the_file_and_line_of_an_overflowing_value(tmp_path: Path) -> None:
    path = tmp_path / "train.txt"
    path.write_text("1 1:1\n\n0 3:1e39\n")
    with pytest.raises(BadRecordError, match=rf"^{path}:3: value in token '3:1e39' overflows float32"):
        read_all(str(path), "libsvm")
    batch = read_all(str(path), "libsvm", skip_bad_records=True)  # the skip policy skips it and counts it
    assert batch.num_examples == 1


# ---- empty inputs ------------------------------------------------------------------------------
def test_an_empty_file_is_refused_naming_it(tmp_path: Path) -> None:
    empty, blank = tmp_path / "empty.txt", tmp_path / "blank.txt"
    empty.write_bytes(b"")
    blank.write_bytes(b"\n  \n\n")
    for path in (empty, blank):
        with pytest.raises(DataError, match=rf"^--train {path}: the file holds no libsvm records"):
            require_records(str(path), "libsvm", what="--train")


def test_an_empty_gzip_file_and_an_empty_tfrecord_file_are_refused(tmp_path: Path) -> None:
    gz = tmp_path / "empty.txt.gz"
    with gzip.open(gz, "wb"):
        pass
    with pytest.raises(DataError, match="holds no libsvm records"):
        require_records(str(gz), "libsvm", what="--eval")
    tf = tmp_path / "empty.tfrecord"
    tf.write_bytes(b"")
    with pytest.raises(DataError, match=rf"--train {tf}: the file holds no tfrecord records"):
        require_records(str(tf), "tfrecord", what="--train", schema=default_sparse_schema())
    criteo = tmp_path / "empty.tsv"
    criteo.write_bytes(b"\n")
    with pytest.raises(DataError, match="holds no criteo records"):
        require_records(str(criteo), "criteo", what="--train", num_features=8)


def test_several_files_are_refused_only_when_none_holds_a_record(tmp_path: Path) -> None:
    for name in ("part-0", "part-1", "part-2"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(DataError, match=r"^--train: none of the 3 files holds a libsvm record \(.*part-0, .*part-2\)"):
        require_records(str(tmp_path / "part-*"), "libsvm", what="--train")
    (tmp_path / "part-1").write_text("1 1:1\n")  # an empty shard among others is fine (Spark writes them)
    require_records(str(tmp_path / "part-*"), "libsvm", what="--train")


def test_a_malformed_first_record_counts_as_a_record(tmp_path: Path) -> None:
    """The check is about emptiness; the reading itself reports the bad line with its number."""
    path = tmp_path / "bad.txt"
    path.write_text("\nnot libsvm\n")
    require_records(str(path), "libsvm", what="--train")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such file"):
        require_records(str(tmp_path / "nope.txt"), "libsvm", what="--train")
