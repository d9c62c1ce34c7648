"""Converting text to sharded TFRecord, and the `psflow convert` hooks."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import same_batch

from psflow.data import BadRecordError, Schema, add_convert_arguments, convert, default_sparse_schema, read_all, read_records, run_convert
from psflow.data.convert import schema_path, shard_names
from psflow.data.example_encode import encode_sparse_examples

_same = same_batch


def test_libsvm_to_sharded_tfrecord(a9a_paths: tuple[Path, Path], tmp_path: Path) -> None:
    source = str(a9a_paths[1])
    written = convert([source], "libsvm", str(tmp_path / "out" / "a9a"), num_shards=4)
    assert [os.path.basename(p) for p in written] == [f"a9a-{k:05d}-of-00004.tfrecord" for k in range(4)]
    counts = [sum(1 for _ in read_records(p)) for p in written]
    assert counts == [4071, 4070, 4070, 4070]  # record i -> shard i % 4
    original = read_all(source, "libsvm")
    for k, path in enumerate(written):
        assert _same(read_all(path, "tfrecord"), original.take(np.arange(k, original.num_examples, 4)))
    assert not list((tmp_path / "out").glob("*.tmp"))
    assert Schema.from_file(schema_path(str(tmp_path / "out" / "a9a"))) == default_sparse_schema()
    # LIBSVM input still gives the bytes psflow always wrote.
    column = original.column()
    records = [r for path in written for r in read_records(path)]
    old = encode_sparse_examples(original.labels, column.indptr, column.ids, column.values)
    assert sorted(records) == sorted(old)


def test_round_robin_preserves_records_exactly(tmp_path: Path) -> None:
    src = tmp_path / "in.txt"
    src.write_text("".join(f"{i % 2} {i}:{i / 4} {i + 1000}:1\n" for i in range(10)))
    written = convert([str(src)], "libsvm", str(tmp_path / "o"), num_shards=3, compression="gzip")
    assert all(p.endswith(".tfrecord.gz") for p in written)
    original = read_all(str(src), "libsvm")
    for k, path in enumerate(written):
        rows = list(range(k, 10, 3))
        assert _same(read_all(path, "tfrecord"), original.take(np.array(rows)))


CRITEO_LINES = [
    "1\t5\t-2\t\t0\t3\t1000000\t\t\t\t\t\t\t\t68fd1e64\t\tabc\t0123456789abcdef01\t" + "\t".join(["deadbeef"] * 22),
    "0\t" + "\t".join(str(7 * k - 20) for k in range(13)) + "\t" + "\t".join(f"{k:08x}" for k in range(26)),
    "0" + "\t" * 39,
]


def test_criteo_round_trip_through_the_written_schema(tmp_path: Path) -> None:
    src = tmp_path / "day.tsv"
    src.write_text("\n".join(CRITEO_LINES * 5) + "\n")
    written = convert([str(src)], "criteo", str(tmp_path / "c"), num_features=1 << 12, num_shards=2)
    schema = Schema.from_file(schema_path(str(tmp_path / "c")))
    assert list(schema.features)[:3] == ["label", "I1", "I2"] and schema.features["C26"].vocabulary_size == 1 << 12
    original = read_all(str(src), "criteo", num_features=1 << 12)
    for k, path in enumerate(written):
        back = read_all(path, "tfrecord", schema=schema)
        assert _same(back, original.take(np.arange(k, original.num_examples, 2)))


def test_criteo_sample_round_trip(tmp_path: Path, criteo_file: Path) -> None:
    """The synthetic data, and the real sample where present."""
    written = convert([str(criteo_file)], "criteo", str(tmp_path / "c"), num_features=1 << 16)
    schema = Schema.from_file(schema_path(str(tmp_path / "c")))
    assert _same(read_all(written, "tfrecord", schema=schema), read_all(str(criteo_file), "criteo", num_features=1 << 16))


def test_failed_conversion_leaves_nothing(tmp_path: Path) -> None:
    src = tmp_path / "bad.txt"
    src.write_text("1 1:1\n1 nope\n")
    with pytest.raises(BadRecordError, match="bad.txt:2:"):
        convert([str(src)], "libsvm", str(tmp_path / "o"), num_shards=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.txt"]
    written = convert([str(src)], "libsvm", str(tmp_path / "o"), skip_bad_records=True)
    assert sum(1 for _ in read_records(written[0])) == 1


def test_command_line_hooks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.txt"
    src.write_text("1 1:1\n0 2:1\n")
    parser = argparse.ArgumentParser(prog="psflow convert")
    add_convert_arguments(parser)
    args = parser.parse_args([str(src), "--format", "libsvm", "--output-prefix", str(tmp_path / "x"), "--num-shards", "2"])
    assert run_convert(args) == 0
    assert capsys.readouterr().out.split() == [*shard_names(str(tmp_path / "x"), 2), str(tmp_path / "x.schema.yaml")]
    bad = parser.parse_args([str(tmp_path / "missing.txt"), "--format", "libsvm", "--output-prefix", str(tmp_path / "y")])
    assert run_convert(bad) == 1
    assert "missing.txt: no such file" in capsys.readouterr().err
