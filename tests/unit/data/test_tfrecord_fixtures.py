"""Files written by real TensorFlow: exact decoding, byte-identical writing, corruption refused."""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import same_batch

from psflow.data import (
    DEFAULT_SPARSE_FEATURE,
    BadRecordError,
    DatasetConfig,
    FixedLenFeature,
    Ragged,
    Schema,
    SparseFeature,
    TFRecordWriter,
    TooManyBadRecordsError,
    VarLenFeature,
    encode_example,
    open_dataset,
    parse_examples,
    read_all,
    read_records,
)
from psflow.data.example import encode_sparse_examples

SPARSE = Schema(
    {"label": FixedLenFeature((), "float32"), "ids": VarLenFeature("int64"), "values": VarLenFeature("float32")},
    label_key="label",
)
MIXED = Schema(
    {"dense": FixedLenFeature((13,), "float32"), "name": FixedLenFeature((), "string"), "ids": VarLenFeature("int64")},
    label_key=None,
)
FILES = {"sparse_lr.tfrecord": SPARSE, "sparse_lr.tfrecord.gz": SPARSE, "mixed.tfrecord": MIXED}


# Every test runs with the C loops and with the numpy loops (psflow.data.native).
pytestmark = pytest.mark.usefixtures("implementation")

def test_fixture_files_are_intact(fixtures_dir: Path, fixtures_json: dict[str, Any]) -> None:
    for name, info in fixtures_json["files"].items():
        data = (fixtures_dir / name).read_bytes()
        assert len(data) == info["bytes"]
        assert hashlib.sha256(data).hexdigest() == info["sha256"], name


@pytest.mark.parametrize("name", sorted(FILES))
def test_framing_matches_tensorflow(fixtures_dir: Path, fixtures_json: dict[str, Any], name: str) -> None:
    records = list(read_records(str(fixtures_dir / name)))
    info = fixtures_json["files"][name]
    assert len(records) == info["num_records"]
    assert [len(r) for r in records] == info["serialized_example_lengths"]


def _want(value: Any, got: Any) -> None:
    """Asserts a decoded value equals the JSON one bit for bit (floats as float32, bytes exact)."""
    if isinstance(value, dict):
        assert got == bytes.fromhex(value["hex"])
        if value["utf8"] is not None:
            assert got.decode("utf-8") == value["utf8"]
    elif isinstance(value, list):
        want = np.asarray(value, dtype=got.dtype)
        assert got.dtype in (np.float32, np.int64)
        assert got.tobytes() == want.tobytes(), (got, want)
    else:
        assert np.float32(got).tobytes() == np.float32(value).tobytes()


@pytest.mark.parametrize("fast", [True, False], ids=["vectorized", "general"])
@pytest.mark.parametrize("name", sorted(FILES))
def test_decodes_every_field_exactly(fixtures_dir: Path, fixtures_json: dict[str, Any], name: str, fast: bool) -> None:
    records = list(read_records(str(fixtures_dir / name)))
    parsed = parse_examples(records, FILES[name], fast=fast)
    assert parsed.errors == []
    expected = fixtures_json["files"][name]["records"]
    assert parsed.num_examples == len(expected)
    for i, record in enumerate(expected):
        assert set(record) == set(FILES[name].features)
        for key, value in record.items():
            column = parsed.features[key]
            got = column.values[column.indptr[i] : column.indptr[i + 1]] if isinstance(column, Ragged) else column[i]
            _want(value, got)


def test_edge_values_survive(fixtures_dir: Path) -> None:
    records = list(read_records(str(fixtures_dir / "mixed.tfrecord")))
    parsed = parse_examples(records, MIXED)
    ids = parsed.features["ids"]
    assert ids.values[ids.indptr[3] : ids.indptr[4]].tolist() == [0, -1, 1, 2**63 - 1, -(2**63), 127, 128, 300, -300]
    dense = parsed.features["dense"][1]
    assert np.signbit(dense[0]) and dense[0] == 0.0  # -0.0 kept
    assert np.float32(1.4e-45) in dense  # smallest subnormal kept


def test_sparse_schema_batches_and_gzip_agree(fixtures_dir: Path) -> None:
    plain = read_all(str(fixtures_dir / "sparse_lr.tfrecord"), "tfrecord")
    packed = read_all(str(fixtures_dir / "sparse_lr.tfrecord.gz"), "tfrecord")
    assert plain.num_examples == packed.num_examples == 200
    assert same_batch(plain, packed)
    assert list(plain.sparse) == [DEFAULT_SPARSE_FEATURE] and plain.dense == {}
    column = plain.column()
    assert column.indptr[151] - column.indptr[150] == 0  # record 150: present but empty lists
    plain.validate()


def test_mixed_schema_to_batch(fixtures_dir: Path) -> None:
    with pytest.raises(ValueError, match="'name': a bytes FixedLenFeature is not a batch feature"):
        MIXED.batch_layout()
    schema = Schema({"dense": MIXED.features["dense"], "ids": VarLenFeature("int64")}, label_key=None)
    batch = read_all(str(fixtures_dir / "mixed.tfrecord"), "tfrecord", schema=schema)
    assert batch.num_examples == 50 and list(batch.sparse) == ["ids"] and list(batch.dense) == ["dense"]
    assert batch.dense["dense"].shape == (50, 13) and batch.dense["dense"].dtype == np.float32
    assert np.all(batch.column("ids").values == 1.0)  # an int64 VarLen is a sparse feature with values 1.0


def test_writer_reproduces_tensorflow_bytes(fixtures_dir: Path, tmp_path: Path) -> None:
    for name, schema in (("sparse_lr.tfrecord", SPARSE), ("mixed.tfrecord", MIXED)):
        records = list(read_records(str(fixtures_dir / name)))
        parsed = parse_examples(records, schema)
        out = tmp_path / name
        with TFRecordWriter(str(out)) as writer:
            for i in range(len(records)):
                features = {}
                for key, spec in schema.features.items():
                    column = parsed.features[key]
                    if isinstance(column, Ragged):
                        features[key] = (spec.dtype, column.values[column.indptr[i] : column.indptr[i + 1]])
                    else:
                        values = column[i].reshape(-1) if spec.dtype != "bytes" else [column[i]]
                        features[key] = (spec.dtype, values)
                writer.write(encode_example(features))
        assert out.read_bytes() == (fixtures_dir / name).read_bytes(), name


def test_sparse_encoder_reproduces_tensorflow_bytes(fixtures_dir: Path) -> None:
    records = list(read_records(str(fixtures_dir / "sparse_lr.tfrecord")))
    parsed = parse_examples(records, SPARSE)
    ids, values = parsed.features["ids"], parsed.features["values"]
    assert encode_sparse_examples(parsed.features["label"], ids.indptr, ids.values, values.values) == records


def test_gzip_writer_round_trip(fixtures_dir: Path, tmp_path: Path) -> None:
    records = list(read_records(str(fixtures_dir / "sparse_lr.tfrecord")))
    out = tmp_path / "copy.tfrecord.gz"
    with TFRecordWriter(str(out), "gzip") as writer:
        for record in records:
            writer.write(record)
    assert gzip.decompress(out.read_bytes()) == (fixtures_dir / "sparse_lr.tfrecord").read_bytes()
    # "auto" detects gzip by content too, not only by the .gz suffix.
    renamed = tmp_path / "copy_without_suffix"
    shutil.copy(out, renamed)
    assert list(read_records(str(renamed))) == records


def _flip(src: Path, dst: Path, offset: int) -> None:
    data = bytearray(src.read_bytes())
    data[offset] ^= 0x01
    dst.write_bytes(bytes(data))


def test_flipped_data_byte_is_refused_with_file_record_and_offset(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / "sparse_lr.tfrecord"
    lengths = [len(r) for r in read_records(str(src))]
    header_of_12 = sum(length + 16 for length in lengths[:12])
    bad = tmp_path / "data.tfrecord"
    _flip(src, bad, header_of_12 + 12 + 5)  # a byte inside record 12's data
    with pytest.raises(BadRecordError) as info:
        list(read_records(str(bad)))
    assert info.value.record == 12 and info.value.offset == header_of_12
    assert str(info.value) == f"{bad}: record 12 at byte {header_of_12}: data checksum mismatch"
    with pytest.raises(BadRecordError, match=r"record 12 at byte \d+: data checksum mismatch"):
        read_all(str(bad), "tfrecord")
    # Skipping drops exactly that record and counts it.
    config = DatasetConfig((str(bad),), "tfrecord", batch_size=1000, skip_bad_records=True, max_bad_records=1)
    with open_dataset(config, start=True) as dataset:
        (batch,) = list(dataset)
        assert batch.num_examples == 199
        assert dataset.stats.bad_records == 1 and dataset.stats.per_file[str(bad)].bad_records == 1
    config = DatasetConfig((str(bad),), "tfrecord", skip_bad_records=True, max_bad_records=0)
    with pytest.raises(TooManyBadRecordsError), open_dataset(config, start=True) as dataset:
        list(dataset)


def test_flipped_length_byte_is_framing_damage(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / "sparse_lr.tfrecord"
    lengths = [len(r) for r in read_records(str(src))]
    header_of_7 = sum(length + 16 for length in lengths[:7])
    bad = tmp_path / "length.tfrecord"
    _flip(src, bad, header_of_7 + 1)
    with pytest.raises(BadRecordError, match=rf"length.tfrecord: record 7 at byte {header_of_7}: length checksum"):
        list(read_records(str(bad)))
    # With skipping, the records before the damage survive; the rest of the file is unreadable.
    batch = read_all(str(bad), "tfrecord", skip_bad_records=True)
    assert batch.num_examples == 7


def test_truncated_file_is_refused(fixtures_dir: Path, tmp_path: Path) -> None:
    data = (fixtures_dir / "sparse_lr.tfrecord").read_bytes()
    for cut in (len(data) - 3, len(data) - 200, 5):
        bad = tmp_path / f"cut{cut}.tfrecord"
        bad.write_bytes(data[:cut])
        with pytest.raises(BadRecordError, match="truncated record") as info:
            list(read_records(str(bad)))
        assert info.value.path == str(bad) and info.value.offset is not None and info.value.offset <= cut


def test_truncated_gzip_is_refused(fixtures_dir: Path, tmp_path: Path) -> None:
    data = (fixtures_dir / "sparse_lr.tfrecord.gz").read_bytes()
    bad = tmp_path / "cut.tfrecord.gz"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(BadRecordError, match="cut.tfrecord.gz") as info:
        read_all(str(bad), "tfrecord")
    assert info.value.offset is not None


def test_crc_check_can_be_disabled(fixtures_dir: Path, tmp_path: Path) -> None:
    src = fixtures_dir / "sparse_lr.tfrecord"
    bad = tmp_path / "data.tfrecord"
    _flip(src, bad, len(src.read_bytes()) - 2)  # inside the last record's data checksum
    assert len(list(read_records(str(bad), check_crc=False))) == 200
    assert read_all(str(bad), "tfrecord", check_crc=False).num_examples == 200


def test_schema_with_sparse_feature_matches_varlen_pair(fixtures_dir: Path) -> None:
    records = list(read_records(str(fixtures_dir / "sparse_lr.tfrecord")))
    schema = Schema({"label": FixedLenFeature((), "float32"), "x": SparseFeature("ids", "values")})
    pair = parse_examples(records, schema).features["x"]
    separate = parse_examples(records, SPARSE).features
    assert pair[0].values.tobytes() == separate["ids"].values.tobytes()
    assert pair[1].values.tobytes() == separate["values"].values.tobytes()
