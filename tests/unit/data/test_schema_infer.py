"""Dense-feature normalizers (``normalizer: log1p``) and TFRecord schema inference (``psflow schema infer``)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from conftest import same_batch

from psflow.cli.main import main as cli_main
from psflow.data import (
    DEFAULT_SPARSE_FEATURE,
    Batch,
    FixedLenFeature,
    Schema,
    TFRecordWriter,
    VarLenFeature,
    default_sparse_schema,
    encode_example,
    parse_examples,
    read_all,
)
from psflow.data.api import DataError
from psflow.data.example import to_batch
from psflow.data.example_encode import encode_batch_examples
from psflow.data.features import spec_from_dict, spec_to_dict
from psflow.data.infer import InferredSchema, infer_first_file, infer_schema, schema_yaml
from psflow.train.build import data_schema, model_config
from psflow.train.config import ConfigError, TrainConfig

COUNTS = FixedLenFeature((), "float32", 0.0, normalizer="log1p")


def _write(path: Path, examples: list[dict[str, tuple[str, Any]]]) -> str:
    with TFRecordWriter(str(path)) as writer:
        for features in examples:
            writer.write(encode_example(features))
    return str(path)


# --------------------------------------------------------------------------
# Normalizer: parse, round trip, apply, bad names


def test_normalizer_parses_and_round_trips(tmp_path: Path) -> None:
    assert spec_from_dict({"kind": "fixed", "dtype": "float32", "default": 0.0, "normalizer": "log1p"}) == COUNTS
    assert spec_from_dict({"kind": "fixed", "normalizer": "none"}) == FixedLenFeature((), "float32")
    assert spec_to_dict(COUNTS) == {"kind": "fixed", "shape": [], "dtype": "float32", "default": 0.0, "normalizer": "log1p"}
    assert "normalizer" not in spec_to_dict(FixedLenFeature((), "float32", normalizer="none"))
    schema = Schema({"label": FixedLenFeature(), "I1": COUNTS,
                     "I2": FixedLenFeature((2,), "float32", 0.0, normalizer="signed_log1p"), "C1": VarLenFeature("int64")})
    assert Schema.from_dict(schema.to_dict()) == schema
    (tmp_path / "s.json").write_text(json.dumps(schema.to_dict()))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(schema.to_dict()))
    assert Schema.from_file(tmp_path / "s.json") == schema == Schema.from_file(tmp_path / "s.yaml")


def test_normalizer_flag_spelling() -> None:
    schema = Schema.from_flags(["I1:float:log1p", "emb:float:2x3:signed_log1p", "I2:float::none", "I3:float"])
    assert schema.features["I1"] == FixedLenFeature((), "float32", normalizer="log1p")
    assert schema.features["emb"] == FixedLenFeature((2, 3), "float32", normalizer="signed_log1p")
    assert schema.features["I2"] == schema.features["I3"] == FixedLenFeature((), "float32")
    with pytest.raises(ValueError, match=r"--feature 'I1:float:log2'.*unknown normalizer 'log2'"):
        Schema.from_flags(["I1:float:log2"])


def test_bad_normalizers_are_named() -> None:
    with pytest.raises(ValueError, match=r"schema feature 'I7': unknown normalizer 'log'; use log1p, signed_log1p or none"):
        Schema.from_dict({"features": {"label": {"kind": "fixed"}, "I7": {"kind": "fixed", "normalizer": "log"}}})
    with pytest.raises(ValueError, match=r"schema feature 'n': normalizer log1p applies to float32 features, this one is int64"):
        Schema.from_dict({"features": {"label": {"kind": "fixed"}, "n": {"kind": "fixed", "dtype": "int64", "normalizer": "log1p"}}})
    with pytest.raises(ValueError, match=r"unknown option\(s\) \['normalizer'\] for kind varlen"):
        spec_from_dict({"kind": "varlen", "dtype": "int64", "normalizer": "log1p"})
    with pytest.raises(ValueError, match="schema label 'label' takes no normalizer"):
        Schema({"label": FixedLenFeature(normalizer="log1p")})


@pytest.mark.parametrize("fast", [True, False])
def test_normalizer_is_applied_at_parse_time(fast: bool) -> None:
    schema = Schema({"label": FixedLenFeature(), "I1": COUNTS,
                     "S": FixedLenFeature((2,), "float32", 0.0, normalizer="signed_log1p"),
                     "raw": FixedLenFeature((), "float32", 0.0)})
    rows: list[dict[str, tuple[str, Any]]] = [
        {"label": ("float32", [1]), "I1": ("float32", [0.0]), "S": ("float32", [-3.0, 3.0]), "raw": ("float32", [5.0])},
        {"label": ("float32", [0]), "I1": ("float32", [1e6]), "S": ("float32", [0.0, -0.5]), "raw": ("float32", [-7.0])},
        {"label": ("float32", [0])},  # defaults: normalized too (log1p(0) = 0)
        {"label": ("float32", [1]), "I1": ("float32", [-0.5]), "raw": ("float32", [2.0])},
        {"label": ("float32", [1]), "I1": ("float32", [math.nan])},  # NaN stays NaN, as in TF
    ]
    parsed = parse_examples([encode_example(r) for r in rows], schema, fast=fast)
    assert parsed.errors == []
    want = np.log1p(np.array([0.0, 1e6, 0.0, -0.5, math.nan])).astype(np.float32)
    np.testing.assert_array_equal(parsed.features["I1"], want)
    assert parsed.features["I1"].dtype == np.float32
    signed = np.array([[-math.log1p(3), math.log1p(3)], [0.0, -math.log1p(0.5)], [0, 0], [0, 0], [0, 0]], dtype=np.float32)
    np.testing.assert_array_equal(parsed.features["S"], signed)
    np.testing.assert_array_equal(parsed.features["raw"], np.array([5, -7, 0, 2, 0], dtype=np.float32))
    batch = to_batch(parsed, schema)
    np.testing.assert_array_equal(batch.dense["I1"], want)


@pytest.mark.parametrize("fast", [True, False])
def test_log1p_of_a_value_at_or_below_minus_one_is_a_bad_record(fast: bool) -> None:
    schema = Schema({"label": FixedLenFeature(), "I1": COUNTS})
    rows = [{"label": ("float32", [1]), "I1": ("float32", [v])} for v in (2.0, -1.0, 3.0, -2.5)]
    parsed = parse_examples([encode_example(r) for r in rows], schema, fast=fast)
    assert [row for row, _ in parsed.errors] == [1, 3]
    assert "feature 'I1': value -1 is <= -1, outside the domain of its normalizer log1p" in parsed.errors[0][1]
    assert "value -2.5" in parsed.errors[1][1]
    np.testing.assert_array_equal(parsed.features["I1"][[0, 2]], np.log1p(np.array([2.0, 3.0])).astype(np.float32))


def test_a_bad_log1p_value_is_named_with_file_and_record(tmp_path: Path) -> None:
    path = _write(tmp_path / "neg.tfrecord", [{"label": ("float32", [1]), "I1": ("float32", [v])} for v in (1.0, 4.0, -3.0)])
    schema = Schema({"label": FixedLenFeature(), "I1": COUNTS})
    with pytest.raises(DataError, match=rf"{path}: record 2 at byte \d+: feature 'I1': value -3 is <= -1"):
        read_all([path], "tfrecord", schema=schema)
    batch = read_all([path], "tfrecord", schema=schema, skip_bad_records=True)
    assert batch.num_examples == 2


def test_a_normalized_schema_is_not_written_back() -> None:
    batch = Batch(np.zeros(1, dtype=np.float32), {}, {"I1": np.ones(1, dtype=np.float32)})
    with pytest.raises(ValueError, match="feature 'I1': the schema normalizes it"):
        encode_batch_examples(batch, Schema({"label": FixedLenFeature(), "I1": COUNTS}))


# --------------------------------------------------------------------------
# Inference


def _mixed_file(tmp_path: Path, n: int = 30) -> str:
    rows = []
    for i in range(n):
        row: dict[str, tuple[str, Any]] = {
            "label": ("float32", [i % 2]),
            "clicks": ("float32", [float(i * 7 % 40)]),     # counts: integral, >= 0, some > 1 -> log1p
            "ratio": ("float32", [i / 7.0]),                # not integral -> none
            "flag": ("float32", [float(i % 2)]),            # integral but never > 1 -> none
            "delta": ("float32", [float(i - 5)]),           # integral with negatives -> none
            "vec": ("float32", [0.5, 2.0, float(i)]),      # three values each -> dense [3]
            "C2": ("int64", [i % 5]),
            "C10": ("int64", [i, i + 1]),
            "site": ("bytes", [f"s{i % 3}".encode()]),
            "weights": ("float32", [0.5] * (i % 3)),      # varying length -> left out
        }
        if i % 4:
            row["rare"] = ("int64", [i])                   # absent from some records -> optional
        rows.append(row)
    return _write(tmp_path / "mixed.tfrecord", rows)


def test_inference_on_a_file_written_by_psflow(tmp_path: Path) -> None:
    inferred = infer_schema(_mixed_file(tmp_path), num_features=1000)
    f = inferred.schema.features
    assert inferred.schema.label_key == "label" and f["label"] == FixedLenFeature((), "float32")
    assert f["clicks"] == FixedLenFeature((), "float32", 0.0, normalizer="log1p")
    for name in ("ratio", "flag", "delta"):
        assert f[name] == FixedLenFeature((), "float32", 0.0), name
    assert f["vec"] == FixedLenFeature((3,), "float32", 0.0)
    assert f["C2"] == f["C10"] == VarLenFeature("int64")
    assert f["rare"] == VarLenFeature("int64", optional=True)
    assert f["site"] == VarLenFeature("bytes", hash_buckets=1000)
    assert "weights" not in f and len(inferred.notes) == 1 and "'weights'" in inferred.notes[0]
    # label, then dense, then sparse, each in natural order (C2 before C10)
    assert list(f) == ["label", "clicks", "delta", "flag", "ratio", "vec", "C2", "C10", "rare", "site"]
    assert inferred.records == 30 and not inferred.is_default
    text = inferred.describe()
    assert "dense float32, normalizer log1p (1): clicks" in text and "ids int64, id space 1000 (3): C2 C10 rare?" in text
    assert "left out: 'weights'" in text
    # the schema reads the file, the counts log1p'd
    batch = read_all([inferred.path], "tfrecord", schema=inferred.schema, num_features=1000)
    assert list(batch.sparse) == ["C2", "C10", "rare", "site"] and batch.num_examples == 30
    np.testing.assert_array_equal(batch.dense["clicks"], np.log1p(np.arange(30) * 7 % 40).astype(np.float32))


def test_inference_samples_only_the_first_records(tmp_path: Path) -> None:
    rows = [{"label": ("int64", [1]), "x": ("float32", [0.5 if i < 5 else 3.0])} for i in range(20)]
    path = _write(tmp_path / "f.tfrecord", rows)
    assert infer_schema(path, sample=5).schema.features["x"].normalizer is None  # type: ignore[union-attr]
    full = infer_schema(path)
    assert full.schema.features["label"] == FixedLenFeature((), "int64") and full.records == 20
    assert full.schema.features["x"] == FixedLenFeature((), "float32", 0.0)  # 0.5 is not integral


def test_the_label_key_can_be_named(tmp_path: Path) -> None:
    path = _write(tmp_path / "y.tfrecord", [{"clicked": ("int64", [i % 2]), "n": ("float32", [i])} for i in range(4)])
    inferred = infer_schema(path, label="clicked")
    assert inferred.schema.label_key == "clicked" and list(inferred.schema.features) == ["clicked", "n"]
    assert inferred.schema.features["n"] == COUNTS


def test_sparse_lr_files_keep_the_default_schema(fixtures_dir: Path) -> None:
    # Written by real TensorFlow: label, ids, values (the sparse-LR layout of psflow convert --format libsvm).
    for name in ("sparse_lr.tfrecord", "sparse_lr.tfrecord.gz"):
        inferred = infer_schema(str(fixtures_dir / name))
        assert inferred.sparse_lr and inferred.is_default and inferred.schema == default_sparse_schema()
        assert f"sparse feature {DEFAULT_SPARSE_FEATURE!r} from ids + values" in inferred.describe()
    config = TrainConfig.flat(format="tfrecord", train=(str(fixtures_dir / "sparse_lr.tfrecord"),), num_features=1 << 20)
    assert data_schema(config) is None  # exactly as before inference: the reader's default
    assert list(model_config(config).features.sparse) == [DEFAULT_SPARSE_FEATURE]


def test_a_sparse_lr_file_with_an_int64_label_gets_that_label(tmp_path: Path) -> None:
    path = _write(tmp_path / "lr.tfrecord", [{"label": ("int64", [1]), "ids": ("int64", [3, 4]), "values": ("float32", [1, 1])}])
    inferred = infer_schema(path)
    assert inferred.sparse_lr and not inferred.is_default
    assert inferred.schema.features["label"] == FixedLenFeature((), "int64")


def test_bad_input_is_named(tmp_path: Path, fixtures_dir: Path) -> None:
    empty = tmp_path / "empty.tfrecord"
    empty.write_bytes(b"")
    with pytest.raises(DataError, match=rf"{empty}: the file has no records"):
        infer_schema(str(empty))
    mixed = str(fixtures_dir / "mixed.tfrecord")  # written by TensorFlow: dense, ids, name; no label
    with pytest.raises(DataError, match=rf"{mixed}: no label key 'label' in the first 50 records \(keys: dense, ids, name\);"
                                        " name the label with --label KEY"):
        infer_schema(mixed)
    with pytest.raises(DataError, match=r"label 'name' must be one float or int64 per record"):
        infer_schema(mixed, label="name")
    two = _write(tmp_path / "two.tfrecord", [{"label": ("float32", [1]), "x": ("float32", [1.5])},
                                             {"label": ("float32", [0]), "x": ("int64", [2])}])
    with pytest.raises(DataError, match=rf"{two}: feature 'x' is a float list in record 0 and a int64 list in record 1; "
                                        "mixed types"):
        infer_schema(two)
    big = _write(tmp_path / "big.tfrecord", [{"label": ("float32", [1]), "C1": ("int64", [5, 70])}])
    with pytest.raises(DataError, match=rf"{big}: feature 'C1': id 70 .* outside the id space \[0, 64\) \(--num-features\) "
                                        "of inferred id features; raise --num-features to at least 71"):
        infer_schema(big, num_features=64)
    assert infer_schema(big, num_features=71).schema.features["C1"] == VarLenFeature("int64")
    text = tmp_path / "data.tsv"
    text.write_text("1\t2\t3\n" * 10)
    with pytest.raises(DataError, match=rf"{text}: record 0 .*is it a TFRecord file\?"):
        infer_schema(str(text))


def test_train_config_infers_and_reports_errors_as_config_errors(tmp_path: Path) -> None:
    path = _mixed_file(tmp_path)
    config = TrainConfig.flat(format="tfrecord", train=(str(tmp_path / "*.tfrecord"),), num_features=1000)
    schema = data_schema(config)
    assert schema is not None and schema == infer_schema(path, num_features=1000).schema
    spec = model_config(config).features
    assert spec.sparse == {"C2": 1000, "C10": 1000, "rare": 1000, "site": 1000}
    assert spec.dense == {"clicks": 1, "delta": 1, "flag": 1, "ratio": 1, "vec": 3}
    with pytest.raises(ConfigError, match=r"schema inference \(no --schema given\): .*no label key 'y'"):
        data_schema(TrainConfig.flat(format="tfrecord", train=(path,), label="y"))
    with pytest.raises(ConfigError, match="no files match"):
        data_schema(TrainConfig.flat(format="tfrecord", train=(str(tmp_path / "nothing-*"),)))
    # a schema or --feature flags are used as given, never inferred
    assert data_schema(TrainConfig.flat(format="tfrecord", train=(path,), features=("flag:float",))) == \
        Schema({"label": FixedLenFeature(), "flag": FixedLenFeature()})


def test_the_inferred_yaml_reads_back(tmp_path: Path) -> None:
    inferred = infer_first_file([_mixed_file(tmp_path)], num_features=1000)
    out = tmp_path / "schema.yaml"
    out.write_text(schema_yaml(inferred))
    assert Schema.from_file(out) == inferred.schema
    assert "# Left out: 'weights'" in out.read_text()


# --------------------------------------------------------------------------
# psflow schema infer


def test_cli_schema_infer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _mixed_file(tmp_path)
    assert cli_main(["schema", "infer", path, "--num-features", "1000"]) == 0
    out, err = capsys.readouterr()
    assert f"inferred TFRecord schema from {path} (first 30 records)" in err
    (tmp_path / "schema.yaml").write_text(out)
    assert Schema.from_file(tmp_path / "schema.yaml") == infer_schema(path, num_features=1000).schema
    assert cli_main(["schema", "infer", str(tmp_path / "*.tfrecord"), "--num-features", "1000", "--json"]) == 0
    out, _ = capsys.readouterr()
    assert Schema.from_dict(json.loads(out)) == infer_schema(path, num_features=1000).schema
    assert cli_main(["schema", "infer", path, "--label", "nope"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("psflow schema infer: error: ") and "no label key 'nope'" in err
    assert cli_main(["schema", "infer", str(tmp_path / "missing.tfrecord")]) == 1
    assert "no such file" in capsys.readouterr().err


# --------------------------------------------------------------------------
# TSV and its TFRecord copy: the same batches


def _criteo_copy(lines: list[str], path: Path) -> str:
    """The TFRecord copy of Criteo TSV lines, as TF's Wide & Deep data: label and I float (missing: 0.0), C bytes."""
    rows = []
    for line in lines:
        fields = line.rstrip("\n").split("\t")
        row: dict[str, tuple[str, Any]] = {"label": ("float32", [float(fields[0])])}
        for k in range(13):
            row[f"I{k + 1}"] = ("float32", [float(fields[1 + k] or 0)])
        for k in range(26):
            if fields[14 + k]:
                row[f"C{k + 1}"] = ("bytes", [fields[14 + k].encode()])
        rows.append(row)
    return _write(path, rows)


def test_tsv_and_its_tfrecord_copy_give_the_same_batch(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    lines = []
    for i in range(40):
        ints = ["" if rng.random() < 0.2 else str(int(rng.integers(0, 500))) for _ in range(13)]
        cats = [f"{int(rng.integers(0, 1 << 32)):08x}" for _ in range(26)]
        lines.append("\t".join([str(i % 2), *ints, *cats]) + "\n")
    tsv = tmp_path / "day.tsv"
    tsv.write_text("".join(lines))
    tfrecord = _criteo_copy(lines, tmp_path / "day.tfrecord")
    inferred = infer_schema(tfrecord, num_features=1 << 16)
    assert all(inferred.schema.features[f"I{k}"] == COUNTS for k in range(1, 14))
    text = read_all([str(tsv)], "criteo", num_features=1 << 16)
    copy = read_all([tfrecord], "tfrecord", schema=inferred.schema, num_features=1 << 16)
    assert list(copy.dense) == list(text.dense) and list(copy.sparse) == list(text.sparse)
    for name in text.dense:  # I with log1p: bit for bit
        assert copy.dense[name].tobytes() == text.dense[name].tobytes(), name
    # and the C strings hash as --format criteo hashes them (no value is missing here)
    assert same_batch(copy, text)


def test_a_criteo_file_and_its_copy_give_the_same_dense_values(tmp_path: Path, criteo_file: Path) -> None:
    """The synthetic data, and the real sample where present: both have negative counts."""
    lines = criteo_file.read_text().splitlines(keepends=True)[:2000]
    tfrecord = _criteo_copy(lines, tmp_path / "sample.tfrecord")
    text = read_all([str(criteo_file)], "criteo", num_features=1 << 20).slice(0, len(lines))
    cats = [f"C{k}:string:{1 << 20}" for k in range(1, 27)]
    # Every row, negative counts included: signed_log1p is --format criteo's transform.
    signed = Schema.from_flags([f"I{k}:float:signed_log1p" for k in range(1, 14)] + cats)
    signed = Schema({n: (VarLenFeature("bytes", hash_buckets=1 << 20, optional=True) if n.startswith("C") else s)
                     for n, s in signed.features.items()})
    copy = read_all([tfrecord], "tfrecord", schema=signed)
    for name in text.dense:
        assert copy.dense[name].tobytes() == text.dense[name].tobytes(), name
    # log1p (TF's transform) on the rows without a negative count: the same values; the others are bad records.
    plain = Schema({n: (FixedLenFeature((), "float32", 0.0, normalizer="log1p") if n.startswith("I") else s)
                    for n, s in signed.features.items()})
    negative = np.array([any(f.startswith("-") for f in line.split("\t")[1:14]) for line in lines])
    assert negative.any()
    copy = read_all([tfrecord], "tfrecord", schema=plain, skip_bad_records=True, max_bad_records=len(lines))
    assert copy.num_examples == int((~negative).sum())
    keep = np.flatnonzero(~negative)
    for name in text.dense:
        assert copy.dense[name].tobytes() == text.dense[name][keep].tobytes(), name


def test_is_default_means_exactly_the_default_schema() -> None:
    assert InferredSchema(default_sparse_schema(), "f", 1, 8).is_default
    assert not InferredSchema(Schema({"label": FixedLenFeature((), "int64")}), "f", 1, 8).is_default
