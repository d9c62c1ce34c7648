"""The hand-written Example decoder and encoder, checked against the protobuf runtime."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import same_batch
from google.protobuf import descriptor_pb2, message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from psflow.data import (
    Batch,
    FixedLenFeature,
    Ragged,
    Schema,
    SparseColumn,
    SparseFeature,
    VarLenFeature,
    encode_example,
    parse_examples,
)
from psflow.data.example import to_batch
from psflow.data.example_encode import encode_batch_examples, encode_examples
from psflow.data.example_pb import descriptor_proto, example_class
from psflow.data.hashing import bucket_strings

# Every test runs with the C loops and with the numpy loops (psflow.data.native).
pytestmark = pytest.mark.usefixtures("implementation")

REPO = Path(__file__).resolve().parents[3]

# proto2 rules parse the same wire format without insisting on UTF-8 map keys,
# which the decoder under test (like TensorFlow's own fast parser) does not check.
EXAMPLE = example_class()
LENIENT_EXAMPLE = example_class(check_utf8=False)
KIND_DTYPE = {"bytes_list": "bytes", "float_list": "float32", "int64_list": "int64"}


def _shape(desc: descriptor_pb2.DescriptorProto) -> Any:
    fields = [(f.name, f.number, f.label, f.type, f.type_name, f.options.packed, f.oneof_index) for f in desc.field]
    return desc.name, fields, [_shape(n) for n in desc.nested_type], desc.options.map_entry


def test_committed_proto_matches_the_runtime_descriptor(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools", reason="protoc (grpcio-tools) is a development dependency")
    out = tmp_path / "example.pb"
    command = [sys.executable, "-m", "grpc_tools.protoc", f"-I{REPO}", f"--descriptor_set_out={out}", "psflow/data/example.proto"]
    subprocess.run(command, check=True)
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    assert (compiled.name, compiled.package, compiled.syntax) == ("psflow/data/example.proto", "psflow.data", "proto3")
    assert [_shape(m) for m in compiled.message_type] == [_shape(m) for m in descriptor_proto().message_type]


def _protobuf_view(ex: Any) -> dict[bytes, tuple[str | None, list[Any]]]:
    out = {}
    for key, feature in ex.features.feature.items():
        kind = feature.WhichOneof("kind")
        values = list(getattr(feature, kind).value) if kind else []
        out[key.encode("utf-8") if isinstance(key, str) else key] = (kind, values)
    return out


def _our_view(records: list[bytes], keys: dict[bytes, str], fast: bool) -> list[dict[bytes, tuple[str, list[Any]]]]:
    schema = Schema({k.decode("utf-8"): VarLenFeature(dtype) for k, dtype in keys.items()}, label_key=None)
    parsed = parse_examples(records, schema, fast=fast)
    rows: list[dict[bytes, tuple[str, list[Any]]]] = [{} for _ in records]
    for key, dtype in keys.items():
        column = parsed.features[key.decode("utf-8")]
        for i in range(len(records)):
            rows[i][key] = (dtype, column.values[column.indptr[i] : column.indptr[i + 1]].tolist())
    assert parsed.errors == []
    return rows


def _same_values(dtype: str, ours: list[Any], theirs: list[Any]) -> bool:
    if dtype == "float32":
        return np.asarray(ours, np.float32).tobytes() == np.asarray(theirs, np.float32).tobytes()
    return list(ours) == list(theirs)


float32s = st.floats(width=32, allow_nan=False)
int64s = st.integers(-(2**63), 2**63 - 1)
feature_values = st.one_of(
    st.tuples(st.just("int64_list"), st.lists(int64s, max_size=8)),
    st.tuples(st.just("float_list"), st.lists(float32s, max_size=8)),
    st.tuples(st.just("bytes_list"), st.lists(st.binary(max_size=12), max_size=4)),
)
feature_maps = st.dictionaries(st.text(alphabet="abcxyzé_✓", min_size=0, max_size=6), feature_values, max_size=5)


def _build(features: dict[str, tuple[str, list[Any]]]) -> Any:
    ex = EXAMPLE()
    ex.features.SetInParent()  # as tf.train.Example(features=tf.train.Features(...)) does
    for key, (kind, values) in features.items():
        getattr(ex.features.feature[key], kind).value.extend(values)
    return ex


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(feature_maps, min_size=1, max_size=6), st.booleans())
def test_decoder_agrees_with_protobuf(maps: list[dict[str, tuple[str, list[Any]]]], deterministic: bool) -> None:
    records = [_build(m).SerializeToString(deterministic=deterministic) for m in maps]
    keys = {k.encode("utf-8"): KIND_DTYPE[kind] for m in maps for k, (kind, _) in m.items()}
    # A key used with two kinds in different records is read as one of them; the others are errors.
    keys = {k: v for k, v in keys.items() if all(KIND_DTYPE[m[k.decode()][0]] == v for m in maps if k.decode() in m)}
    for fast in (True, False):
        ours = _our_view(records, keys, fast)
        for record, row in zip(records, ours, strict=True):
            theirs = _protobuf_view(EXAMPLE.FromString(record))
            for key, (dtype, values) in row.items():
                kind, their_values = theirs.get(key, (None, []))
                assert _same_values(dtype, values, their_values), (key, values, their_values)


def _prefix_free(features: dict[str, Any]) -> bool:
    keys = [k.encode("utf-8") for k in features]
    return not any(a != b and b.startswith(a) for a in keys for b in keys)


# Keys that are prefixes of one another ("a", "ab") are left out: upb (protobuf's
# Python runtime) puts the longer first, C++ protobuf and encode_example the shorter.
@settings(max_examples=150, deadline=None)
@given(feature_maps.filter(_prefix_free))
def test_encoder_equals_deterministic_protobuf(features: dict[str, tuple[str, list[Any]]]) -> None:
    ours = encode_example({k: (KIND_DTYPE[kind], values) for k, (kind, values) in features.items()})
    assert ours == _build(features).SerializeToString(deterministic=True)


# ---- unusual but valid encodings, written field by field ----


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(number: int, wire: int, payload: bytes) -> bytes:
    head = _varint(number << 3 | wire)
    return head + (_varint(len(payload)) + payload if wire == 2 else payload)


unknown_fields = st.lists(
    st.one_of(
        st.builds(lambda n, v: _field(n, 0, _varint(v)), st.integers(4, 30), st.integers(0, 2**64 - 1)),
        st.builds(lambda n, b: _field(n, 1, b), st.integers(4, 30), st.binary(min_size=8, max_size=8)),
        st.builds(lambda n, b: _field(n, 5, b), st.integers(4, 30), st.binary(min_size=4, max_size=4)),
        st.builds(lambda n, b: _field(n, 2, b), st.integers(4, 30), st.binary(max_size=6)),
    ),
    max_size=2,
).map(b"".join)


@st.composite
def odd_lists(draw: st.DrawFn) -> tuple[int, bytes]:
    """A list message (kind number, body) with packed and unpacked runs and unknown fields mixed."""
    kind = draw(st.sampled_from([1, 2, 3]))
    parts = []
    for _ in range(draw(st.integers(0, 3))):
        if kind == 1:
            parts.append(b"".join(_field(1, 2, b) for b in draw(st.lists(st.binary(max_size=5), max_size=3))))
        elif kind == 2:
            values = draw(st.lists(float32s, max_size=4))
            if draw(st.booleans()):
                parts.append(_field(1, 2, struct.pack(f"<{len(values)}f", *values)))
            else:
                parts.append(b"".join(_field(1, 5, struct.pack("<f", v)) for v in values))
        else:
            values = draw(st.lists(int64s, max_size=4))
            if draw(st.booleans()):
                parts.append(_field(1, 2, b"".join(_varint(v) for v in values)))
            else:
                parts.append(b"".join(_field(1, 0, _varint(v)) for v in values))
        parts.append(draw(unknown_fields))
    return kind, b"".join(parts)


@st.composite
def odd_examples(draw: st.DrawFn) -> bytes:
    """Repeated `features` fields, repeated keys, value-before-key entries, split Feature messages..."""
    chunks = []
    for _ in range(draw(st.integers(0, 3))):
        entries = []
        for _ in range(draw(st.integers(0, 3))):
            key = _field(1, 2, draw(st.sampled_from([b"a", b"b", b"ids", b""])))
            feature = b"".join(_field(kind, 2, body) for kind, body in draw(st.lists(odd_lists(), max_size=2)))
            feature += draw(unknown_fields)
            pieces = [key, _field(2, 2, feature)]
            if draw(st.booleans()):
                pieces.reverse()
            if draw(st.booleans()):
                pieces = pieces[:1]
            entries.append(_field(1, 2, b"".join(pieces) + draw(unknown_fields)))
        chunks.append(_field(1, 2, b"".join(entries) + draw(unknown_fields)))
        chunks.append(draw(unknown_fields))
    return b"".join(chunks)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(odd_examples(), min_size=1, max_size=4))
def test_unusual_encodings_decode_as_protobuf_does(records: list[bytes]) -> None:
    for key in (b"a", b"b", b"ids", b""):
        for dtype, kind in (("int64", "int64_list"), ("float32", "float_list"), ("bytes", "bytes_list")):
            schema = Schema({key.decode(): VarLenFeature(dtype)}, label_key=None)
            for fast in (True, False):
                parsed = parse_examples(records, schema, fast=fast)
                bad = dict(parsed.errors)
                column = parsed.features[key.decode()]
                for i, record in enumerate(records):
                    their_kind, their_values = _protobuf_view(LENIENT_EXAMPLE.FromString(record)).get(key, (None, []))
                    if their_kind not in (None, kind):
                        assert i in bad and "schema wants" in bad[i]
                        continue
                    assert i not in bad
                    ours = column.values[column.indptr[i] : column.indptr[i + 1]].tolist()
                    assert _same_values(dtype, ours, their_values)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_damaged_records_are_refused_like_protobuf(data: st.DataObject) -> None:
    features = data.draw(feature_maps.filter(bool))
    record = bytearray(_build(features).SerializeToString())
    for _ in range(data.draw(st.integers(1, 3))):
        record[data.draw(st.integers(0, len(record) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()):
        record = record[: data.draw(st.integers(0, len(record)))]
    try:
        LENIENT_EXAMPLE.FromString(bytes(record))
        accepted = True
    except message.DecodeError:
        accepted = False
    schema = Schema({"x": VarLenFeature("int64")}, label_key=None)
    for fast in (True, False):
        errors = parse_examples([bytes(record)], schema, fast=fast).errors
        assert (not errors or "schema wants" in errors[0][1]) == accepted, errors


def test_per_record_schema_errors_name_the_problem() -> None:
    schema = Schema(
        {
            "label": FixedLenFeature((), "float32"),
            "dense": FixedLenFeature((3,), "int64", default=[7, 8, 9]),
            "x": SparseFeature("ids", "values"),
        }
    )
    records = [
        encode_example({"label": ("float32", [1.0]), "ids": ("int64", [1, 2]), "values": ("float32", [0.5, 0.25])}),
        encode_example({"ids": ("int64", [1])}),  # no label
        encode_example({"label": ("float32", [1.0, 2.0])}),
        encode_example({"label": ("int64", [1])}),
        encode_example({"label": ("float32", [0.0]), "ids": ("int64", [1, 2]), "values": ("float32", [1.0])}),
        encode_example({"label": ("float32", [0.0]), "dense": ("int64", [1, 2])}),
        b"\x0a\x05\x0a\x03",
    ]
    parsed = parse_examples(records, schema)
    errors = dict(parsed.errors)
    assert sorted(errors) == [1, 2, 3, 4, 5, 6]
    assert errors[1] == "missing required feature 'label'"
    assert "has 2 values, schema wants 1" in errors[2]
    assert "is a int64_list, schema wants float32" in errors[3]
    assert "2 ids ('ids') but 1 values ('values')" in errors[4]
    assert "'dense' has 2 values, schema wants 3" in errors[5]
    assert errors[6].startswith("malformed Example")
    assert parsed.features["dense"][0].tolist() == [7, 8, 9]  # default applied
    ids, values = parsed.features["x"]
    assert ids.values[ids.indptr[0] : ids.indptr[1]].tolist() == [1, 2]
    assert values.values[values.indptr[0] : values.indptr[1]].tolist() == [0.5, 0.25]


def test_ragged_is_exported() -> None:
    parsed = parse_examples([encode_example({"v": ("int64", [3, 4])})], Schema({"v": VarLenFeature("int64")}, label_key=None))
    assert isinstance(parsed.features["v"], Ragged)


# ---- many features per Example: the fast decoder against the general one ----

MULTI = Schema(
    {
        "label": FixedLenFeature((), "float32"),
        "dense": FixedLenFeature((3,), "float32", default=0.5),
        "ids": VarLenFeature("int64", vocabulary_size=1000),
        "site": VarLenFeature("string", hash_buckets=97),
        "weighted": SparseFeature("w_ids", "w_vals"),
        "unweighted": SparseFeature("u_ids", None, vocabulary_size=50),
        **{f"C{k}": VarLenFeature("int64") for k in range(1, 27)},
    }
)
_MULTI_KINDS = {"label": "float_list", "dense": "float_list", "ids": "int64_list", "site": "bytes_list", "w_ids": "int64_list",
                "w_vals": "float_list", "u_ids": "int64_list", **{f"C{k}": "int64_list" for k in range(1, 27)}}


@st.composite
def multi_examples(draw: st.DrawFn) -> dict[str, tuple[str, list[Any]]]:
    """Examples with most of MULTI's keys: missing, empty, out-of-vocabulary, wrong-kind and unknown features mixed in."""
    features: dict[str, tuple[str, list[Any]]] = {}
    for key, kind in _MULTI_KINDS.items():
        if draw(st.integers(0, 9)) == 0:
            continue  # missing
        if draw(st.integers(0, 49)) == 0:
            kind = draw(st.sampled_from(["int64_list", "float_list", "bytes_list"]))  # wrong kind, now and then
        size = {"label": st.just(1), "dense": st.sampled_from([0, 3, 3, 3, 2])}.get(key, st.integers(0, 4))
        n = draw(size)
        if kind == "float_list":
            values: list[Any] = draw(st.lists(float32s, min_size=n, max_size=n))
        elif kind == "bytes_list":
            values = draw(st.lists(st.binary(max_size=20), min_size=n, max_size=n))
        else:
            values = draw(st.lists(st.integers(-3, 1100), min_size=n, max_size=n))
        features[key] = (kind, values)
    if key_values := draw(st.one_of(st.none(), feature_values)):
        features["unread"] = key_values
    return features


def _same_parsed(a: Any, b: Any) -> bool:
    if isinstance(a, tuple):
        return all(_same_parsed(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, Ragged):
        return a.indptr.tolist() == b.indptr.tolist() and _same_parsed(a.values, b.values)
    return bool(a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes())


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(multi_examples(), min_size=1, max_size=8), st.booleans())
def test_multi_feature_fast_decoder_agrees_with_protobuf(maps: list[dict[str, tuple[str, list[Any]]]], deterministic: bool) -> None:
    records = [_build(m).SerializeToString(deterministic=deterministic) for m in maps]
    fast, general = parse_examples(records, MULTI), parse_examples(records, MULTI, fast=False)
    assert fast.errors == general.errors
    assert fast.present == general.present
    for name in MULTI.features:
        assert _same_parsed(fast.features[name], general.features[name]), name
    good = np.array(sorted(set(range(len(records))) - {row for row, _ in fast.errors}), dtype=np.int64)
    assert same_batch(to_batch(fast, MULTI, good), to_batch(general, MULTI, good))
    for i in good.tolist():  # the strings hashed as documented, whatever the decoder
        strings = _protobuf_view(EXAMPLE.FromString(records[i])).get(b"site", (None, []))[1]
        site = fast.features["site"]
        assert site.values[site.indptr[i] : site.indptr[i + 1]].tolist() == bucket_strings(strings, "site", 97).tolist()


def test_multi_feature_errors_name_the_feature() -> None:
    base = {"label": ("float32", [1.0]), "w_ids": ("int64", [1]), "w_vals": ("float32", [2.0]), "u_ids": ("int64", [3])}
    records = [
        encode_example(base),
        encode_example({**base, "ids": ("int64", [5, 1000, -1])}),
        encode_example({**base, "u_ids": ("int64", [50])}),
        encode_example({**base, "site": ("int64", [1])}),
    ]
    schema = Schema({k: v for k, v in MULTI.features.items() if not k.startswith("C")})
    for fast in (True, False):
        errors = dict(parse_examples(records, schema, fast=fast).errors)
        assert errors == {
            1: "feature 'ids': id 1000 is outside [0, 1000) (vocabulary_size)",
            2: "feature 'unweighted': id 50 is outside [0, 50) (vocabulary_size)",
            3: "feature 'site' is a int64_list, schema wants bytes",
        }


def test_strings_without_buckets_decode_as_bytes() -> None:
    records = [encode_example({"s": ("bytes", [b"a", b"", b"\xff\x00"])}), encode_example({})]
    for fast in (True, False):
        column = parse_examples(records, Schema({"s": VarLenFeature("string")}, label_key=None), fast=fast).features["s"]
        assert column.indptr.tolist() == [0, 3, 3] and column.values.tolist() == [b"a", b"", b"\xff\x00"]


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 6), st.integers(0, 2**32))
def test_vectorized_encoder_writes_what_encode_example_writes(n: int, seed: int) -> None:
    keys = {"a": "int64", "b": "float32", "ab": "int64", "C1": "int64"}
    rng = np.random.default_rng(seed)
    lists = {k: [rng.integers(-(2**62), 2**62, rng.integers(0, 4)) >> rng.integers(0, 62) for _ in range(n)] for k in keys}
    features = {}
    for key, dtype in keys.items():
        counts = [len(v) for v in lists[key]]
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        values = np.concatenate([np.zeros(0, dtype=np.int64), *lists[key]])
        features[key] = (dtype, values.astype(np.float32) if dtype == "float32" else values, indptr)
    got = encode_examples(n, features)
    want = [encode_example({k: (keys[k], lists[k][i].astype(np.float32) if keys[k] == "float32" else lists[k][i]) for k in keys})
            for i in range(n)]
    assert got == want


def test_batch_examples_read_back_as_the_batch() -> None:
    schema = Schema({"label": FixedLenFeature(), "d": FixedLenFeature((2,), "int64"), "x": VarLenFeature("int64"),
                     "y": SparseFeature("yi", "yv"), "z": SparseFeature("zi", None)})
    batch = Batch(
        np.array([1, 0, 1], dtype=np.float32),
        {"x": SparseColumn(np.array([0, 2, 2, 3]), np.array([5, -6, 2**62]), np.ones(3, dtype=np.float32)),
         "y": SparseColumn(np.array([0, 1, 1, 2]), np.array([1, 2]), np.array([0.5, -0.0], dtype=np.float32)),
         "z": SparseColumn(np.array([0, 0, 0, 1]), np.array([9]), np.ones(1, dtype=np.float32))},
        {"d": np.array([[1, 2], [3, 4], [5, -6]], dtype=np.int64)},
    )
    records = encode_batch_examples(batch, schema)
    assert same_batch(to_batch(parse_examples(records, schema), schema), batch)
    assert records[0] == encode_example({"label": ("float32", [1.0]), "d": ("int64", [1, 2]), "x": ("int64", [5, -6]),
                                         "yi": ("int64", [1]), "yv": ("float32", [0.5]), "zi": ("int64", [])})
    batch.sparse["x"].values[0] = 2.0
    with pytest.raises(ValueError, match="'x': the schema reads its values as 1.0"):
        encode_batch_examples(batch, schema)
