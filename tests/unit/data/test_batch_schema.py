"""Batch operations and Schema loading."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import same_batch

from psflow.data import (
    DEFAULT_SPARSE_FEATURE,
    Batch,
    BatchSpec,
    FixedLenFeature,
    Schema,
    SparseColumn,
    SparseFeature,
    VarLenFeature,
    batch_spec,
    default_sparse_schema,
)
from psflow.data.batch import gather_ranges


def _batch() -> Batch:
    return Batch(
        labels=np.array([1, 0, 1], dtype=np.float32),
        sparse={
            "a": SparseColumn(np.array([0, 2, 2, 5]), np.array([1, 2, 3, 4, 5]), np.array([0.5, 1, 1, 2, 3], dtype=np.float32)),
            "b": SparseColumn(np.array([0, 1, 2, 3]), np.array([7, 8, 9]), np.ones(3, dtype=np.float32)),
        },
        dense={"d": np.arange(6, dtype=np.float32).reshape(3, 2)},
    )


def test_slice_take_concat() -> None:
    b = _batch()
    b.validate()
    s = b.slice(1, 3)
    assert s.sparse["a"].indptr.tolist() == [0, 0, 3] and s.sparse["a"].ids.tolist() == [3, 4, 5]
    assert s.sparse["b"].ids.tolist() == [8, 9] and s.dense["d"].tolist() == [[2, 3], [4, 5]]
    t = b.take(np.array([2, 0]))
    assert t.sparse["a"].indptr.tolist() == [0, 3, 5] and t.sparse["a"].ids.tolist() == [3, 4, 5, 1, 2]
    assert t.labels.tolist() == [1, 1] and t.sparse["b"].ids.tolist() == [9, 7]
    c = Batch.concat([b.slice(0, 1), b.slice(1, 3)])
    assert same_batch(c, b)
    assert c.num_examples == 3 and c.nnz == 8
    with pytest.raises(ValueError, match="at least one"):
        Batch.concat([])
    empty = b.slice(3, 3)
    assert empty.dense["d"].shape == (0, 2) and list(empty.sparse) == ["a", "b"]


def test_validate_names_the_problem() -> None:
    b = _batch()
    b.sparse["a"].indptr = np.array([0, 3, 2, 5], dtype=np.int64)
    with pytest.raises(ValueError, match="sparse feature 'a': indptr decreases"):
        b.validate()
    b = _batch()
    b.sparse["b"].values = b.sparse["b"].values.astype(np.float64)
    with pytest.raises(ValueError, match="'b': values must be float32"):
        b.validate()


def test_gather_ranges() -> None:
    got = gather_ranges(np.array([5, 0, 9], dtype=np.int64), np.array([2, 0, 3], dtype=np.int64), step=2)
    assert got.tolist() == [5, 7, 9, 11, 13]
    assert gather_ranges(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)).tolist() == []


def test_schema_round_trips_through_json_and_yaml(tmp_path: Path) -> None:
    schema = Schema(
        {
            "label": FixedLenFeature((), "float"),
            "sparse": SparseFeature("ids", None),
            "dense": FixedLenFeature((2, 3), "int64", default=0),
        }
    )
    (tmp_path / "s.json").write_text(json.dumps(schema.to_dict()))
    assert Schema.from_file(tmp_path / "s.json") == schema
    (tmp_path / "s.yaml").write_text(
        "label: label\nfeatures:\n  label: {kind: fixed, dtype: float32}\n"
        "  sparse: {kind: sparse, ids_key: ids, values_key: null}\n"
        "  dense: {kind: fixed, shape: [2, 3], dtype: int64, default: 0}\n"
    )
    assert Schema.from_file(tmp_path / "s.yaml") == schema
    assert schema.batch_layout() == (["sparse"], ["dense"])
    assert default_sparse_schema().example_keys() == {"label": "float32", "ids": "int64", "values": "float32"}


def test_schema_errors_name_the_feature(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="feature 'x': kind must be"):
        Schema.from_dict({"features": {"x": {"kind": "dense"}}})
    with pytest.raises(ValueError, match="unknown feature dtype 'int8'"):
        VarLenFeature("int8")
    with pytest.raises(ValueError, match="label 'label' must be a scalar"):
        Schema({"label": FixedLenFeature((2,), "float32")})
    with pytest.raises(ValueError, match="both as int64 and as float32"):
        Schema({"a": SparseFeature("ids", "ids")}, label_key=None).example_keys()
    assert Schema({"a": SparseFeature("i", "v"), "b": SparseFeature("j", "w")}, label_key=None).batch_layout() == (["a", "b"], [])
    (tmp_path / "bad.yaml").write_text("features: [")
    with pytest.raises(ValueError, match="bad.yaml: cannot parse schema"):
        Schema.from_file(tmp_path / "bad.yaml")


CRITEO_LIKE_YAML = """
label: label
features:
  label: {kind: fixed, dtype: float32}
  I1:    {kind: fixed, dtype: float32, default: 0.0}
  C1:    {kind: varlen, dtype: int64, vocabulary_size: 1048576}
  site:  {kind: varlen, dtype: string, hash_buckets: 100000, optional: true}
  query: {kind: sparse, ids_key: query_ids, values_key: query_weights, vocabulary_size: 50000}
  emb:   {kind: fixed, shape: [4, 8], dtype: float32, default: 0.0}
  raw:   {kind: varlen, dtype: float32}
"""


def test_new_options_round_trip_through_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(CRITEO_LIKE_YAML)
    schema = Schema.from_file(tmp_path / "s.yaml")
    assert schema.features["C1"] == VarLenFeature("int64", vocabulary_size=1 << 20)
    assert schema.features["site"] == VarLenFeature("bytes", hash_buckets=100_000, optional=True)
    assert schema.features["query"] == SparseFeature("query_ids", "query_weights", vocabulary_size=50_000)
    assert Schema.from_dict(schema.to_dict()) == schema
    (tmp_path / "s.json").write_text(json.dumps(schema.to_dict()))
    assert Schema.from_file(tmp_path / "s.json") == schema
    assert schema.to_dict()["features"]["site"] == {"kind": "varlen", "dtype": "bytes", "hash_buckets": 100_000, "optional": True}
    with pytest.raises(ValueError, match="'raw': a float32 VarLenFeature is not a batch feature by itself.*SparseFeature"):
        schema.batch_layout()


def test_batch_layout_and_spec_follow_the_schema_order() -> None:
    schema = Schema.from_dict(yaml.safe_load(CRITEO_LIKE_YAML))
    schema = Schema({k: v for k, v in schema.features.items() if k != "raw"})
    assert schema.batch_layout() == (["C1", "site", "query"], ["I1", "emb"])
    spec = schema.batch_spec(1000)
    assert spec == BatchSpec({"C1": 1 << 20, "site": 100_000, "query": 50_000}, {"I1": 1, "emb": 32})
    plain = Schema({"label": FixedLenFeature(), "x": VarLenFeature("int64"), "y": SparseFeature("i", None)})
    assert plain.batch_spec(77) == BatchSpec({"x": 77, "y": 77}, {})
    assert batch_spec("tfrecord", plain, 5) == plain.batch_spec(5)
    assert batch_spec("tfrecord", None, 5) == BatchSpec({DEFAULT_SPARSE_FEATURE: 5}, {})
    assert batch_spec("libsvm", None, 9) == BatchSpec({DEFAULT_SPARSE_FEATURE: 9}, {})
    with pytest.raises(ValueError, match="unknown format 'csv'"):
        batch_spec("csv", None, 9)


def test_batch_layout_refuses_what_a_batch_cannot_hold() -> None:
    with pytest.raises(ValueError, match="'s': a string VarLenFeature needs hash_buckets"):
        Schema({"s": VarLenFeature("string")}, label_key=None).batch_layout()
    with pytest.raises(ValueError, match="'n': a bytes FixedLenFeature is not a batch feature"):
        Schema({"n": FixedLenFeature((), "bytes")}, label_key=None).batch_layout()


def test_default_schema_keeps_its_example_keys() -> None:
    schema = default_sparse_schema()
    assert list(schema.features) == ["label", DEFAULT_SPARSE_FEATURE]
    assert schema.example_keys() == {"label": "float32", "ids": "int64", "values": "float32"}
    assert schema.batch_layout() == ([DEFAULT_SPARSE_FEATURE], [])


def test_feature_options_are_checked() -> None:
    with pytest.raises(ValueError, match="hash_buckets applies to string features"):
        VarLenFeature("int64", hash_buckets=10)
    with pytest.raises(ValueError, match="vocabulary_size applies to int64 features"):
        VarLenFeature("string", vocabulary_size=10)
    with pytest.raises(ValueError, match="vocabulary_size must be an integer >= 1, got 0"):
        SparseFeature("i", "v", vocabulary_size=0)
    with pytest.raises(ValueError, match=r"feature 'x': unknown option\(s\) \['buckets'\]"):
        Schema.from_dict({"features": {"x": {"kind": "varlen", "dtype": "string", "buckets": 3}}})
    with pytest.raises(ValueError, match="feature 'x': optional must be true or false"):
        Schema.from_dict({"features": {"x": {"kind": "varlen", "optional": "yes"}}})


def test_schema_from_flags() -> None:
    schema = Schema.from_flags(["I1:float", "emb:float:4x8", "C1:int64", "C2:int64:1000", "site:string:50",
                                "q:sparse:qi:qw:300", "r:sparse:ri", "s:sparse:si::20"])
    assert schema.label_key == "label" and schema.features["label"] == FixedLenFeature((), "float32")
    assert list(schema.features) == ["label", "I1", "emb", "C1", "C2", "site", "q", "r", "s"]
    assert schema.features["emb"] == FixedLenFeature((4, 8), "float32")
    assert schema.features["C2"] == VarLenFeature("int64", vocabulary_size=1000)
    assert schema.features["site"] == VarLenFeature("bytes", hash_buckets=50)
    assert schema.features["q"] == SparseFeature("qi", "qw", vocabulary_size=300)
    assert schema.features["r"] == SparseFeature("ri", None)
    assert schema.features["s"] == SparseFeature("si", None, vocabulary_size=20)
    assert Schema.from_flags(["x:int64"], label=None) == Schema({"x": VarLenFeature("int64")}, label_key=None)
    assert Schema.from_flags(["y:float", "x:int64"], label="y").label_key == "y"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("x", "want NAME:KIND"),
        (":int64", "want NAME:KIND"),
        ("x:int8", "unknown kind 'int8'"),
        ("x:string", "needs its hash bucket count"),
        ("x:string:many", "BUCKETS must be a positive integer, got 'many'"),
        ("x:int64:10:20", "too many fields"),
        ("x:float:4xy", "a dimension must be a positive integer"),
        ("x:sparse", "needs its ids key"),
        ("x:int64:0", "vocabulary_size must be an integer >= 1"),
    ],
)
def test_bad_feature_flags_are_named(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=f"--feature '{re.escape(spec)}': .*{message}"):
        Schema.from_flags([spec])


def test_a_feature_flag_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="'x:float': feature 'x' is named twice"):
        Schema.from_flags(["x:int64", "x:float"])
