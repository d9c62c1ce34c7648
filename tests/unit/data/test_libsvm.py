"""LIBSVM parsing: bundled a9a, the fast/slow parsers agree, malformed lines are named."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from conftest import same_batch
from hypothesis import given, settings
from hypothesis import strategies as st

from psflow.data import DEFAULT_SPARSE_FEATURE, BadRecordError, DatasetConfig, open_dataset, read_all
from psflow.data.libsvm import _parse_fast, _parse_slow, parse_libsvm

_same = same_batch


def test_a9a_statistics(a9a_paths: tuple[Path, Path]) -> None:
    train, test = a9a_paths
    batch = read_all(str(train), "libsvm")
    assert list(batch.sparse) == [DEFAULT_SPARSE_FEATURE] and batch.dense == {}
    column = batch.column()
    assert batch.num_examples == 32_561
    assert int(batch.labels.sum()) == 7_841  # +1 -> 1.0, -1 -> 0.0
    assert column.ids.min() == 1 and column.ids.max() == 123  # ids not shifted
    assert abs(batch.nnz / batch.num_examples - 13.87) < 0.01
    assert np.all(column.values == 1.0)
    batch.validate()
    held_out = read_all(str(test), "libsvm")
    assert held_out.num_examples == 16_281 and int(held_out.labels.sum()) == 3_846
    first = held_out.slice(0, 1).column()
    assert first.ids[-1] == 123 and first.values[-1] == 0.0  # the explicit zero is kept as an entry


def test_fast_and_slow_parsers_agree_on_a9a(a9a_paths: tuple[Path, Path]) -> None:
    data = a9a_paths[0].read_bytes()[:400_000]
    data = data[: data.rfind(b"\n") + 1]
    fast = _parse_fast(data)
    assert fast is not None
    assert _same(fast.batch, _parse_slow(data).batch)


TRICKY = (
    b"+1 3:1 11:0.5 \n"  # trailing space, float value
    b"\n"  # blank line
    b"-1\t7:-2.5e-3\t\t8:0\r\n"  # tabs, CRLF, explicit zero
    b"0 \n"  # no features
    b"1 9223372036854775807:1 5:1e3 6:.5 7:5. 8:+2 9:-0\n"  # big id, exponent forms
    b"   \n"
    b"0.5 00012:3\n"  # fractional label, leading zeros
)


def test_tricky_but_valid_lines() -> None:
    parsed = parse_libsvm(TRICKY)
    assert parsed.errors == []
    assert parsed.rows.tolist() == [0, 2, 3, 4, 6]
    batch = parsed.batch
    assert batch.labels.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0]
    column = batch.column(DEFAULT_SPARSE_FEATURE)
    assert column.indptr.tolist() == [0, 2, 4, 4, 10, 11]
    assert column.ids.tolist() == [3, 11, 7, 8, 2**63 - 1, 5, 6, 7, 8, 9, 12]
    assert column.values.tolist() == pytest.approx([1, 0.5, -2.5e-3, 0, 1, 1000, 0.5, 5, 2, 0, 3])
    assert np.signbit(column.values[9])  # "-0" is -0.0
    assert _same(batch, _parse_slow(TRICKY).batch)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"1 x:1", "malformed token 'x:1'"),
        (b"1 3:1:2", "malformed token '3:1:2'"),
        (b"1 3", "malformed token '3'"),
        (b"1 3:", "bad value in token '3:'"),
        (b"1 :4", "malformed token ':4'"),
        (b"1 -3:1", "malformed token '-3:1'"),
        (b"1 3.5:1", "malformed token '3.5:1'"),
        (b"1 3:abc", "bad value in token '3:abc'"),
        (b"1 3:nan", "bad value in token '3:nan'"),
        (b"1 3:1e999", "bad value in token '3:1e999'"),
        (b"yes 3:1", "bad label 'yes'"),
        (b"3:1 4:1", "bad label '3:1'"),
        (b"1 qid:3 4:1", "qid tokens are not supported"),
        (b"1 4:1 # comment", "malformed token '#'"),
        (b"1 99999999999999999999:1", "feature id 99999999999999999999 is too large"),
        (b"1 4:1\x00", "bad value in token"),
    ],
)
def test_malformed_line_is_named(tmp_path: Path, line: bytes, message: str) -> None:
    path = tmp_path / "bad.txt"
    path.write_bytes(b"1 1:1\n\n-1 2:1\n" + line + b"\n1 5:1\n")
    with pytest.raises(BadRecordError) as info:
        read_all(str(path), "libsvm")
    assert info.value.path == str(path) and info.value.record == 4  # 1-based, the blank line counts
    assert str(info.value).startswith(f"{path}:4: ")
    assert message in str(info.value)
    assert info.value.offset == len(b"1 1:1\n\n-1 2:1\n")


def test_skipping_malformed_lines_counts_them(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("1 1:1\nbad line\n0 2:1\n1 3:x\n0 4:1\n")
    config = DatasetConfig((str(path),), "libsvm", batch_size=10, skip_bad_records=True)
    with open_dataset(config, start=False) as dataset:
        (batch,) = list(dataset)
        stats = dataset.stats
    assert batch.column().ids.tolist() == [1, 2, 4]
    assert stats.bad_records == 2 and stats.records_read == 3
    assert stats.last_bad is not None and stats.last_bad.startswith(f"{path}:4: ")


def test_gzip_input(a9a_paths: tuple[Path, Path], tmp_path: Path) -> None:
    packed = tmp_path / "a9a.t.gz"
    packed.write_bytes(gzip.compress(a9a_paths[1].read_bytes()))
    assert _same(read_all(str(packed), "libsvm"), read_all(str(a9a_paths[1]), "libsvm"))


def test_last_line_without_newline(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes(b"1 1:1\n0 2:1")
    assert read_all(str(path), "libsvm").column().ids.tolist() == [1, 2]


numbers = st.one_of(
    st.integers(-1000, 1000).map(str),
    st.floats(-1e6, 1e6, allow_nan=False).map(repr),
    st.sampled_from(["1", "0", "-0", "+1", ".5", "5.", "1e-3", "2E+2"]),
)
tokens = st.one_of(
    st.tuples(st.integers(0, 2**40), numbers).map(lambda t: f"{t[0]}:{t[1]}"),
    st.sampled_from(["x:1", "1:", ":1", "qid:1", "1:2:3", "1", "#", "1:inf", "nan"]),
)
lines = st.tuples(numbers | st.sampled_from(["x", "+-1"]), st.lists(tokens, max_size=6), st.sampled_from([" ", "  ", "\t"]))


@settings(max_examples=200, deadline=None)
@given(st.lists(lines | st.just(("", [], " ")), min_size=1, max_size=12), st.sampled_from(["\n", "\r\n"]))
def test_fast_parser_never_disagrees_with_slow(parts: list[tuple[str, list[str], str]], newline: str) -> None:
    data = "".join(label + sep + sep.join(toks) + newline for label, toks, sep in parts).encode()
    slow = _parse_slow(data)
    fast = _parse_fast(data)
    if fast is not None:  # the fast parser either declines or gives exactly the slow result
        assert fast.errors == [] and slow.errors == []
        assert fast.rows.tolist() == slow.rows.tolist()
        assert _same(fast.batch, slow.batch)
    parsed = parse_libsvm(data)
    assert [i for i, _ in parsed.errors] == [i for i, _ in slow.errors]
