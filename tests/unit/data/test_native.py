"""The C loops (psflow.data._native) against their numpy twins, on random and malformed input."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import crc32c
import numpy as np
import pytest
from conftest import require_native, same_batch, same_batches
from hypothesis import given, settings
from hypothesis import strategies as st

from psflow.data import (
    BadRecordError,
    Batch,
    DatasetConfig,
    FixedLenFeature,
    Schema,
    SparseFeature,
    TFRecordWriter,
    VarLenFeature,
    example_encode,
    native,
    open_dataset,
)
from psflow.data import criteo as criteo_module
from psflow.data import example_wire as wire_module
from psflow.data import tfrecord as tfrecord_module
from psflow.data.batch import gather_ranges
from psflow.data.example import encode_sparse_examples
from psflow.native import loader


@pytest.fixture(autouse=True)
def _native() -> None:
    require_native()


def _c() -> Any:
    assert native.NATIVE is not None
    return native.NATIVE


def _record(data: bytes) -> bytes:
    header = struct.pack("<Q", len(data))
    return header + struct.pack("<I", tfrecord_module.masked_crc32c(header)) + data + struct.pack("<I", tfrecord_module.masked_crc32c(data))


def _varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@given(st.lists(st.binary(max_size=300), max_size=20), st.binary(max_size=40))
def test_frame_matches_the_python_walk(records: list[bytes], tail: bytes) -> None:
    buf = b"".join(_record(r) for r in records) + tail
    heads, end = tfrecord_module._frame(buf)
    want_heads, want_end = tfrecord_module._frame_numpy(buf)
    assert heads.tolist() == want_heads.tolist()
    assert end == want_end
    assert len(heads) >= len(records)  # the tail may happen to frame as more records; never fewer


def test_frame_stops_at_a_huge_length_without_reading_past_the_buffer() -> None:
    buf = _record(b"abc") + struct.pack("<Q", 2**64 - 1) + b"\0" * 20
    heads, end = tfrecord_module._frame(buf)
    assert heads.tolist() == [0] and end == 3 + 16


def test_frame_refuses_a_too_small_output() -> None:
    buf = _record(b"x") * 4
    with pytest.raises(ValueError, match="heads is too small"):
        _c().frame(buf, np.empty(2, dtype=np.int64))


@given(st.binary(max_size=2000))
def test_crc32c_matches_the_crc32c_package_on_both_paths(data: bytes) -> None:
    want = crc32c.crc32c(data)
    assert _c().crc32c(data) == want
    assert _c().crc32c(data, software=True) == want


@given(st.lists(st.binary(max_size=200), min_size=1, max_size=30), st.data())
def test_masked_crc_ranges_match_the_package(parts: list[bytes], data: st.DataObject) -> None:
    pad = data.draw(st.binary(max_size=7))  # unaligned starts
    buf = pad + b"".join(parts)
    lengths = np.array([len(p) for p in parts], dtype=np.int64)
    starts = len(pad) + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    got = np.empty(len(parts), dtype=np.uint32)
    _c().masked_crc32c_ranges(buf, starts, lengths, got)
    assert got.tolist() == [tfrecord_module.masked_crc32c(p) for p in parts]
    assert got.tolist() == tfrecord_module._masked_crcs_numpy(buf, starts, starts + lengths).tolist()


varint_values = st.one_of(st.integers(0, 127), st.integers(0, 2**21), st.integers(-(2**63), 2**64 - 1))


@given(st.lists(st.lists(varint_values, max_size=12), min_size=1, max_size=10), st.binary(max_size=5))
def test_decode_varints_matches_numpy(lists: list[list[int]], pad: bytes) -> None:
    bodies = [b"".join(_varint(v) for v in values) for values in lists]
    buf = np.frombuffer(pad + b"".join(bodies) + b"\x00" * 3, dtype=np.uint8)
    lengths = np.array([len(b) for b in bodies], dtype=np.int64)
    p0 = len(pad) + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    p1 = p0 + lengths
    got = wire_module.decode_varints(buf, p0, p1)
    want = wire_module.decode_varints_numpy(buf, p0, p1)
    assert got is not None and want is not None
    assert got[0].tolist() == want[0].tolist() == [np.int64(np.uint64(v % 2**64).view(np.int64)) for vs in lists for v in vs]
    assert got[1].tolist() == want[1].tolist() == [len(v) for v in lists]


@given(st.binary(min_size=1, max_size=40), st.integers(0, 39), st.integers(0, 40))
def test_malformed_varints_are_refused_like_numpy(data: bytes, a: int, b: int) -> None:
    a, b = min(a, len(data)), min(max(a, b), len(data))
    buf = np.frombuffer(data, dtype=np.uint8)
    p0, p1 = np.array([a], dtype=np.int64), np.array([b], dtype=np.int64)
    got = wire_module.decode_varints(buf, p0, p1)
    want = wire_module.decode_varints_numpy(buf, p0, p1)
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        assert got[0].tolist() == want[0].tolist() and got[1].tolist() == want[1].tolist()


def test_an_eleven_byte_varint_and_a_cut_varint_are_refused() -> None:
    buf = np.frombuffer(b"\x80" * 10 + b"\x01" + b"\x96\x01", dtype=np.uint8)
    assert wire_module.decode_varints(buf, np.array([0]), np.array([11])) is None  # 11 bytes
    assert wire_module.decode_varints(buf, np.array([11]), np.array([12])) is None  # ends inside
    values, counts = wire_module.decode_varints(buf, np.array([11]), np.array([13])) or (None, None)
    assert values is not None and counts is not None and values.tolist() == [150] and counts.tolist() == [1]


@given(st.lists(st.binary(max_size=64), min_size=1, max_size=20))
def test_copy_ranges_concatenates_like_a_gather(parts: list[bytes]) -> None:
    buf = np.frombuffer(b"".join(parts) + b"!", dtype=np.uint8)
    lengths = np.array([len(p) for p in parts], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    assert _c().copy_ranges(buf, starts, lengths, out) == lengths.sum()
    assert out.tobytes() == b"".join(parts) == buf[gather_ranges(starts, lengths)].tobytes()


@pytest.mark.parametrize("start,length", [(-1, 1), (0, 11), (10, 1), (5, -1), (2**62, 2**62)])
def test_ranges_outside_the_buffer_raise_before_reading(start: int, length: int) -> None:
    buf = bytes(10)
    starts, lengths = np.array([start], dtype=np.int64), np.array([length], dtype=np.int64)
    with pytest.raises(ValueError, match="outside the 10-byte buffer"):
        _c().masked_crc32c_ranges(buf, starts, lengths, np.empty(1, dtype=np.uint32))
    with pytest.raises(ValueError, match="outside the 10-byte buffer"):
        _c().copy_ranges(buf, starts, lengths, np.empty(64, dtype=np.uint8))
    if length >= 0:
        with pytest.raises(ValueError, match="outside the 10-byte buffer"):
            _c().decode_varints(buf, starts, starts + lengths, np.empty(64, dtype=np.int64), np.empty(1, dtype=np.int64))


def test_wrong_dtypes_and_short_outputs_raise() -> None:
    buf = bytes(16)
    one = np.array([0], dtype=np.int64)
    with pytest.raises(TypeError, match="starts must be an int64 array"):
        _c().masked_crc32c_ranges(buf, one.astype(np.int32), one, np.empty(1, dtype=np.uint32))
    with pytest.raises(TypeError, match="out must be a uint32 array"):
        _c().masked_crc32c_ranges(buf, one, one, np.empty(1, dtype=np.int64))
    with pytest.raises(ValueError, match="differ in length"):
        _c().masked_crc32c_ranges(buf, one, one, np.empty(2, dtype=np.uint32))
    with pytest.raises(ValueError, match="values is too small"):
        _c().decode_varints(buf, one, one + 16, np.empty(15, dtype=np.int64), np.empty(1, dtype=np.int64))
    with pytest.raises(ValueError, match="out has 3 bytes"):
        _c().copy_ranges(buf, one, one + 4, np.empty(3, dtype=np.uint8))
    with pytest.raises(ValueError, match="not C-contiguous"):
        _c().frame(buf, np.empty(4, dtype=np.int64)[::2])


def _write_sparse(path: Path, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, 40, n)
    indptr = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = rng.integers(0, 2**40, int(indptr[-1])).astype(np.int64)
    values = rng.standard_normal(int(indptr[-1])).astype(np.float32)
    labels = rng.integers(0, 2, n).astype(np.float32)
    with TFRecordWriter(str(path)) as writer:
        for record in encode_sparse_examples(labels, indptr, ids, values):
            writer.write(record)


def _read(path: Path, monkeypatch: pytest.MonkeyPatch, loops: Any, schema: Schema | None = None) -> tuple[list[Batch], str | None]:
    monkeypatch.setattr(tfrecord_module, "NATIVE", loops)
    monkeypatch.setattr(wire_module, "NATIVE", loops)
    config = DatasetConfig((str(path),), "tfrecord", batch_size=300, prefetch=0, num_epochs=1, block_size=4096, schema=schema)
    batches: list[Batch] = []
    try:
        with open_dataset(config, start=False) as dataset:
            batches.extend(dataset)
    except BadRecordError as e:
        return batches, str(e)
    return batches, None


@pytest.mark.parametrize("damage", [None, "data", "length"])
def test_a_file_reads_the_same_through_both_implementations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, damage: str | None) -> None:
    path = tmp_path / "part.tfrecord"
    _write_sparse(path, 2000, seed=7)
    if damage is not None:
        raw = bytearray(path.read_bytes())
        heads, _ = tfrecord_module._frame_numpy(bytes(raw))
        at = int(heads[1234]) + (20 if damage == "data" else 2)
        raw[at] ^= 0x40
        path.write_bytes(bytes(raw))
    c_batches, c_error = _read(path, monkeypatch, native.NATIVE)
    np_batches, np_error = _read(path, monkeypatch, None)
    assert c_error == np_error
    assert (c_error is None) == (damage is None)
    if damage is not None:
        assert c_error is not None and "record 1234" in c_error
    assert len(c_batches) == len(np_batches) > 0
    assert same_batches(c_batches, np_batches)


def test_the_environment_switch_picks_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loader.ENV, "0")
    assert loader.load_extension("psflow.data._native") is None
    monkeypatch.setenv(loader.ENV, "1")
    assert loader.load_extension("psflow.data._native") is not None
    assert native.implementation() == "c"


def _entries(found: Any) -> list[tuple[int, ...]] | None:
    if found is None:
        return None
    columns = [found.rec, found.key_start, found.key_len, found.kind, found.body_start, found.body_end]
    return sorted(zip(*(c.tolist() for c in columns), strict=True))


feature_maps = st.dictionaries(
    st.text(max_size=6),
    st.one_of(
        st.tuples(st.just("int64"), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5)),
        st.tuples(st.just("float32"), st.lists(st.floats(width=32, allow_nan=False), max_size=5)),
        st.tuples(st.just("bytes"), st.lists(st.binary(max_size=4), max_size=3)),
    ),
    max_size=4,
)


@settings(max_examples=300)
@given(st.lists(feature_maps, min_size=1, max_size=5), st.data())
def test_walk_matches_numpy_on_valid_and_damaged_records(maps: list[dict[str, tuple[str, list[Any]]]], data: st.DataObject) -> None:
    records = [bytearray(example_encode.encode_example(m)) for m in maps]
    for record in records:  # damage some bytes of some records
        for _ in range(data.draw(st.integers(0, 2))):
            if record:
                record[data.draw(st.integers(0, len(record) - 1))] = data.draw(st.integers(0, 255))
    blob = b"".join(bytes(r) for r in records)
    raw = np.frombuffer(blob + bytes(16), dtype=np.uint8)
    lengths = np.array([len(r) for r in records], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    assert _entries(wire_module.walk(raw, starts, lengths)) == _entries(wire_module.walk_numpy(raw, starts, lengths))


def test_walk_refuses_a_too_small_output() -> None:
    record = example_encode.encode_example({"a": ("int64", [1])})
    with pytest.raises(ValueError, match=r"out must be int64 \[6, cap\]"):
        _c().walk_examples(record, np.array([0]), np.array([len(record)]), np.empty((6, 1), dtype=np.int64))


# ---- match_keys and split_bytes_lists ----

key_texts = st.sampled_from([b"", b"a", b"ab", b"abc", b"label", b"C1", b"C10", b"C2", b"ids", b"x" * 9, b"x" * 17, b"\xff\x00"])


@settings(max_examples=300)
@given(st.lists(key_texts, max_size=12), st.lists(key_texts, max_size=30), st.binary(max_size=5))
def test_match_keys_matches_numpy(wanted: list[bytes], seen: list[bytes], pad: bytes) -> None:
    blob = pad + b"".join(seen)
    raw = np.frombuffer(blob + bytes(16), dtype=np.uint8)
    lengths = np.array([len(k) for k in seen], dtype=np.int64)
    starts = len(pad) + np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)[: len(seen)]
    got = wire_module.match_keys(raw, starts, lengths, wanted)
    want = wire_module.match_keys_numpy(raw, starts, lengths, wanted)
    assert got.tolist() == want.tolist() == [wanted.index(k) if k in wanted else -1 for k in seen]  # first index wins


def test_match_keys_numpy_survives_a_hash_collision(monkeypatch: pytest.MonkeyPatch) -> None:
    raw = np.frombuffer(b"abcd" + bytes(16), dtype=np.uint8)
    starts, lengths = np.array([0, 2, 0]), np.array([2, 2, 4])
    monkeypatch.setattr(wire_module, "hash_strings", lambda data, s, n, salt: np.zeros(len(s), dtype=np.uint64))
    assert wire_module.match_keys_numpy(raw, starts, lengths, [b"cd", b"ab", b"zz"]).tolist() == [1, 0, -1]


def test_match_keys_checks_its_arguments() -> None:
    buf = bytes(8)
    one = np.array([0], dtype=np.int64)
    out = np.empty(1, dtype=np.int64)
    with pytest.raises(ValueError, match="outside the 8-byte buffer"):
        _c().match_keys(buf, one, one + 9, out, b"k", np.array([0, 1]))
    with pytest.raises(ValueError, match="match_keys: key: range 0 .* outside the 1-byte buffer"):
        _c().match_keys(buf, one, one, out, b"k", np.array([0, 2]))
    with pytest.raises(ValueError, match="key: range 1"):
        _c().match_keys(buf, one, one, out, b"kk", np.array([0, 2, 1]))  # decreasing
    with pytest.raises(ValueError, match="key_offsets must have 1"):
        _c().match_keys(buf, one, one, out, b"", np.zeros(0, dtype=np.int64))
    with pytest.raises(ValueError, match="out and starts differ in length"):
        _c().match_keys(buf, one, one, np.empty(2, dtype=np.int64), b"k", np.array([0, 1]))
    with pytest.raises(TypeError, match="key_offsets must be an int64 array"):
        _c().match_keys(buf, one, one, out, b"k", np.array([0, 1], dtype=np.int32))
    _c().match_keys(buf, one, one, out, b"", np.array([0]))  # no wanted key
    assert out.tolist() == [-1]


def _bytes_body(items: list[bytes]) -> bytes:
    return b"".join(b"\x0a" + _varint(len(item)) + item for item in items)


@settings(max_examples=300)
@given(st.lists(st.lists(st.binary(max_size=140), max_size=5), min_size=1, max_size=8), st.data())
def test_split_bytes_lists_matches_numpy_on_valid_and_damaged_bodies(lists: list[list[bytes]], data: st.DataObject) -> None:
    bodies = [bytearray(_bytes_body(items)) for items in lists]
    damaged = data.draw(st.booleans())
    if damaged:
        for body in bodies:
            if body and data.draw(st.booleans()):
                body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    blob = b"".join(bytes(b) for b in bodies)
    raw = np.frombuffer(blob + bytes(16), dtype=np.uint8)
    lengths = np.array([len(b) for b in bodies], dtype=np.int64)
    b0 = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    got = wire_module.split_bytes_lists(raw, b0, b0 + lengths)
    want = wire_module.split_bytes_lists_numpy(raw, b0, b0 + lengths)
    assert (got is None) == (want is None)
    if got is not None and want is not None:
        assert [a.tolist() for a in got] == [a.tolist() for a in want]
    if not damaged:
        assert got is not None
        starts, sizes, counts = got
        assert [blob[s : s + n] for s, n in zip(starts.tolist(), sizes.tolist(), strict=True)] == [i for items in lists for i in items]
        assert counts.tolist() == [len(items) for items in lists]


def test_split_bytes_lists_refuses_non_canonical_bodies_and_bad_arguments() -> None:
    raw = np.frombuffer(b"\x0a\x02ab" + b"\x12\x00" + b"\x0a\x05ab" + b"\x0a\x80\x80\x80\x80\x80\x01" + bytes(16), dtype=np.uint8)
    for lo, hi in ((4, 6), (6, 10), (10, 17)):  # wrong tag, item past the body, six-byte varint
        for split in (wire_module.split_bytes_lists, wire_module.split_bytes_lists_numpy):
            assert split(raw, np.array([lo]), np.array([hi])) is None, (lo, hi)
    one = np.array([0], dtype=np.int64)
    n = np.empty(1, dtype=np.int64)
    with pytest.raises(ValueError, match="split_bytes_lists: range 0 .* outside"):
        _c().split_bytes_lists(bytes(4), one, one + 5, n, n, n)
    with pytest.raises(ValueError, match="starts or lengths is too small"):
        _c().split_bytes_lists(bytes(4), one, one + 4, np.empty(1, dtype=np.int64), n, n)
    with pytest.raises(ValueError, match="b0, b1 and counts differ in length"):
        two = np.empty(2, dtype=np.int64)
        _c().split_bytes_lists(bytes(4), one, one + 4, two, two, two)


def _write_criteo_like(path: Path, n: int, seed: int) -> Schema:
    """Examples with 13 float and 26 int64 features, a string feature and a weighted sparse one; returns their schema."""
    rng = np.random.default_rng(seed)
    schema = Schema({"label": FixedLenFeature(), **{f"I{k}": FixedLenFeature() for k in range(1, 14)},
                     **{f"C{k}": VarLenFeature("int64") for k in range(1, 27)},
                     "site": VarLenFeature("string", hash_buckets=1000), "q": SparseFeature("qi", "qv")})
    with TFRecordWriter(str(path)) as writer:
        for i in range(n):
            features: dict[str, tuple[str, Any]] = {"label": ("float32", [i % 2])}
            features.update((f"I{k}", ("float32", rng.standard_normal(1))) for k in range(1, 14))
            features.update((f"C{k}", ("int64", rng.integers(0, 2**40, rng.integers(0, 3)))) for k in range(1, 27))
            features["site"] = ("bytes", [bytes(rng.integers(0, 256, rng.integers(0, 30)).astype(np.uint8)) for _ in range(i % 3)])
            q = rng.integers(0, 4)
            features["qi"], features["qv"] = ("int64", rng.integers(0, 100, q)), ("float32", rng.standard_normal(q))
            writer.write(example_encode.encode_example(features))
    return schema


def test_a_multi_feature_file_reads_the_same_through_both_implementations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "multi.tfrecord"
    schema = _write_criteo_like(path, 1500, seed=3)
    c_batches, c_error = _read(path, monkeypatch, native.NATIVE, schema)
    np_batches, np_error = _read(path, monkeypatch, None, schema)
    assert c_error is None and np_error is None
    assert sum(b.num_examples for b in c_batches) == 1500
    assert list(c_batches[0].sparse) == [*(f"C{k}" for k in range(1, 27)), "site", "q"]
    assert list(c_batches[0].dense) == [f"I{k}" for k in range(1, 14)]
    assert same_batches(c_batches, np_batches)


def _grid(found: Any) -> Any:
    return None if found is None else (found.kind.tolist(), found.p0.tolist(), found.p1.tolist(), found.decoded.tolist())


@settings(max_examples=300)
@given(st.lists(feature_maps, min_size=1, max_size=5), st.lists(st.text(max_size=6), max_size=4), st.data())
def test_place_entries_matches_numpy(maps: list[dict[str, tuple[str, list[Any]]]], wanted: list[str], data: st.DataObject) -> None:
    records = [bytearray(example_encode.encode_example(m)) for m in maps]
    for record in records:  # damage some bytes of some records
        for _ in range(data.draw(st.integers(0, 1))):
            if record:
                record[data.draw(st.integers(0, len(record) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans()) and records[0]:  # now and then an unpacked list: still well formed, not canonical
        records.append(bytearray(example_encode.encode_example({"u": ("int64", [1, 2])}).replace(b"\x0a\x02\x01\x02", b"\x08\x01\x08\x02")))
    blob = b"".join(bytes(r) for r in records)
    raw = np.frombuffer(blob + bytes(16), dtype=np.uint8)
    lengths = np.array([len(r) for r in records], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    keys = [k.encode("utf-8") for k in dict.fromkeys([*wanted, *(k for m in maps for k in m), "u"])]
    want = np.array([data.draw(st.integers(1, 3)) for _ in keys], dtype=np.int64)
    for walk in (wire_module.walk, wire_module.walk_numpy):
        entries = walk(raw, starts, lengths)
        if entries is None:
            continue
        match = wire_module.match_keys(raw, entries.key_start, entries.key_len, keys)
        got = wire_module.place_entries(raw, entries, match, want, len(records))
        assert _grid(got) == _grid(wire_module.place_entries_numpy(raw, entries, match, want, len(records)))


def test_place_entries_refuses_repeated_keys_and_checks_its_arguments() -> None:
    record = example_encode.encode_example({"a": ("int64", [1])})
    twice = record[:1] + bytes([record[1] * 2]) + record[2:] * 2  # the map entry of "a" twice in one Example
    raw = np.frombuffer(twice + bytes(16), dtype=np.uint8)
    starts, lengths = np.array([0]), np.array([len(twice)])
    entries = wire_module.walk(raw, starts, lengths)
    assert entries is not None and len(entries.rec) == 2
    match = wire_module.match_keys(raw, entries.key_start, entries.key_len, [b"a"])
    for place in (wire_module.place_entries, wire_module.place_entries_numpy):
        assert place(raw, entries, match, np.array([3]), 1) is None
    table = np.zeros((6, 2), dtype=np.int64)
    out = (np.empty(2, dtype=np.int8), np.empty(2, dtype=np.int64), np.empty(2, dtype=np.int64), np.empty(2, dtype=np.uint8))
    with pytest.raises(ValueError, match="want entries int64 \\[6, cap\\]"):
        _c().place_entries(raw, table, 3, np.zeros(3, dtype=np.int64), np.array([3]), 2, *out)
    with pytest.raises(ValueError, match="k \\* n slots"):
        _c().place_entries(raw, table, 2, np.zeros(2, dtype=np.int64), np.array([3]), 3, *out)
    with pytest.raises(ValueError, match="want\\[0\\] = 4 is not a list kind"):
        _c().place_entries(raw, table, 2, np.zeros(2, dtype=np.int64), np.array([4]), 2, *out)
    table[5, 1] = 10**9  # a body end past the buffer
    with pytest.raises(ValueError, match="entry 1 .* outside the grid or the"):
        _c().place_entries(raw, table, 2, np.zeros(2, dtype=np.int64), np.array([3]), 2, *out)
    with pytest.raises(TypeError, match="kind must be an int8 array"):
        _c().place_entries(raw, table, 2, np.zeros(2, dtype=np.int64), np.array([3]), 2, np.empty(2, dtype=np.uint8), *out[1:])


# ---- Criteo TSV lines: criteo_lines against the numpy parser ----------------------------------------------------

_CRITEO_NUM_FEATURES = [1, 2, 1000, 1 << 20, 1_000_003, 2**63 + 5, 2**64 - 1]
_INT_JUNK = ["-", "+", "--2", "+-3", "5x", " 5", "5 ", "1.5", "0x10", "\r", "1e3", "\xff", "17" * 9, "-" + "9" * 17, "+" + "0" * 17]
_LABELS = ["0", "1"] * 6 + ["", "2", "01", "1 ", "x", "-1", "\r"]


def _random_criteo_lines(rng: np.random.Generator, count: int) -> list[bytes]:
    """Lines, mostly well formed: missing, negative, signed, zero-padded and too long integers, empty and odd
    categorical bytes; now and then a bad label or integer, a field too many or too few, a CR ending, a blank line."""
    lines = []
    for _ in range(count):
        if rng.random() < 0.05:
            lines.append([b"\n", b"\r\n", b"\t\n", b" \n"][rng.integers(4)])
            continue
        dirty = rng.random() < 0.3
        fields = [(_LABELS[rng.integers(len(_LABELS))] if dirty else _LABELS[rng.integers(2)]).encode()]
        for _ in range(13):
            r = rng.random()
            if r < 0.2:
                text = ""
            elif r < 0.9 or not dirty:  # up to 16 digits in clean lines, up to 18 (too many) in dirty ones
                most = 18 if dirty else 16
                digits = int(rng.integers(0, 2**17) if r < 0.7 else rng.integers(0, 10 ** int(rng.integers(1, most + 1))))
                text = ["", "-", "+"][rng.integers(3)] + str(digits).rjust(int(rng.integers(1, most + 1)) if rng.random() < 0.1 else 1, "0")
            else:
                text = _INT_JUNK[rng.integers(len(_INT_JUNK))]
            fields.append(text.encode("latin-1"))
        for _ in range(26):
            r = rng.random()
            if r < 0.1:
                fields.append(b"")
            elif r < 0.8:
                fields.append(f"{int(rng.integers(0, 2**32)):08x}".encode())
            else:
                odd = rng.integers(0, 256, int(rng.integers(0, 25)), dtype=np.uint8).tobytes().replace(b"\n", b"n")
                fields.append(odd if dirty else odd.replace(b"\t", b"t"))
        damage = int(rng.integers(8)) if dirty else 0  # 1: a field too few, 2: one too many, 3: a trailing tab, 4: CR LF
        if damage == 1:
            del fields[rng.integers(len(fields))]
        elif damage == 2:
            fields.insert(int(rng.integers(len(fields) + 1)), b"extra")
        lines.append(b"\t".join(fields) + {3: b"\t", 4: b"\r"}.get(damage, b"") + b"\n")
    return lines


def _same_parse(got: Any, want: Any) -> None:
    assert same_batch(got.batch, want.batch)
    assert got.rows.dtype == want.rows.dtype == np.int64 and got.rows.tolist() == want.rows.tolist()
    assert got.errors == want.errors
    got.batch.validate()


def _check_both_parsers(blob: bytes, num_features: int) -> Any:
    newlines = np.flatnonzero(np.frombuffer(blob, dtype=np.uint8) == 10)
    want = criteo_module._parse_numpy(blob, num_features, None)
    _same_parse(criteo_module._parse_native(blob, num_features, None), want)
    _same_parse(criteo_module._parse_native(blob, num_features, newlines), want)
    _same_parse(criteo_module._parse_numpy(blob, num_features, newlines), want)
    return want


@pytest.mark.parametrize("seed", range(8))
def test_criteo_lines_match_numpy_on_random_lines(seed: int) -> None:
    rng = np.random.default_rng(seed)
    lines = _random_criteo_lines(rng, 400)
    want = _check_both_parsers(b"".join(lines), _CRITEO_NUM_FEATURES[seed % len(_CRITEO_NUM_FEATURES)])
    assert want.batch.num_examples > 200 and len(want.errors) > 20  # both kinds of lines are there
    for at in range(0, 40, 3):  # short buffers: hashing the last field reads up to the buffer's end, not past it
        _check_both_parsers(b"".join(lines[at : at + 2]), 1 << 20)


_GOOD_INT = st.one_of(st.just(""), st.integers(-(10**16) + 1, 10**16 - 1).map(str))
_ANY_INT = st.one_of(_GOOD_INT, st.integers(-(10**18), 10**18).map(lambda v: f"{v:+}"), st.sampled_from(_INT_JUNK))
_CAT = st.one_of(st.just(b""), st.binary(max_size=20).map(lambda b: b.replace(b"\n", b"n")))
_HYPOTHESIS_LINE = st.one_of(
    st.tuples(st.sampled_from(["0", "1"]), st.lists(_GOOD_INT, min_size=13, max_size=13), st.lists(_CAT, min_size=26, max_size=26)),
    st.tuples(st.sampled_from(_LABELS), st.lists(_ANY_INT, min_size=12, max_size=14), st.lists(_CAT, min_size=25, max_size=27)),
).map(lambda line: b"\t".join([line[0].encode(), *(i.encode() for i in line[1]), *line[2]]))


@given(
    st.lists(st.tuples(st.one_of(_HYPOTHESIS_LINE, st.just(b"")), st.sampled_from([b"\n", b"\n", b"\r\n", b"\t\n"])), max_size=6),
    st.sampled_from(_CRITEO_NUM_FEATURES),
)
def test_criteo_lines_match_numpy_on_hypothesis_lines(lines: list[tuple[bytes, bytes]], num_features: int) -> None:
    _check_both_parsers(b"".join(line + end for line, end in lines), num_features)


def test_criteo_lines_match_numpy_on_a_real_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """A few thousand lines (of the bundled sample when present, else generated), each damaged here and there."""
    from conftest import CRITEO_SAMPLE

    rng = np.random.default_rng(5)
    if CRITEO_SAMPLE.is_file():
        lines = CRITEO_SAMPLE.read_bytes().splitlines(keepends=True)[:3000]
    else:
        cats = [rng.integers(0, 2**32, 26) for _ in range(3000)]
        lines = [("\t".join([str(rng.integers(0, 2)), *(str(v) if v >= 0 else "" for v in rng.integers(-3, 5000, 13)),
                             *(f"{c:08x}" if c % 7 else "" for c in cs)]) + "\n").encode() for cs in cats]
    for at in rng.choice(len(lines), 40, replace=False).tolist():  # bad labels, integers, field counts, blank lines
        line = lines[at]
        lines[at] = [b"7" + line[1:], line.replace(b"\t", b"\tx", 1), line.replace(b"\t", b"", 1), b"\n", b"\t" + line][at % 5]
    blob = b"".join(lines)
    for num_features in (1 << 20, 1_000_003):
        want = criteo_module._parse_numpy(blob, num_features, None)
        assert want.batch.num_examples > 2900 and len(want.errors) >= 20
        _same_parse(criteo_module._parse_native(blob, num_features, None), want)
        monkeypatch.setattr(criteo_module, "NATIVE", None)  # parse_criteo follows the switch
        _same_parse(criteo_module.parse_criteo(blob, num_features), want)
        monkeypatch.setattr(criteo_module, "NATIVE", native.NATIVE)
        _same_parse(criteo_module.parse_criteo(blob, num_features), want)


@pytest.mark.parametrize(
    "line,status",
    [
        (b"", 1),
        (b"1" + b"\t" * 38, 2),
        (b"1" + b"\t" * 40, 2),
        (b"2" + b"\t" * 39, 3),
        (b"\t" * 39, 3),
        (b"10" + b"\t" * 39, 3),
        (b"1\t+" + b"\t" * 38, 4),
        (b"1\t\t\t-9999999999999999\t\t12345678901234567" + b"\t" * 34, 8),
        (b"2\t\tx" + b"\t" * 38, 2),  # 41 fields: the field count wins
        (b"0\t+0\t-0\t9999999999999999\t0000000000000001" + b"\t" * 35, 0),
    ],
)
def test_criteo_lines_status_codes(line: bytes, status: int) -> None:
    blob = line + b"\n"
    got = np.empty(1, dtype=np.int8)
    ints = np.empty((13, 1), dtype=np.int64)
    good = _c().criteo_lines(blob, None, criteo_module._CAT_SALTS, 10, np.empty(1, dtype=np.float32), ints,
                             np.empty((26, 1), dtype=np.int64), got)
    assert got.tolist() == [status] and good == (status == 0)
    if status == 0:
        assert ints[:4, 0].tolist() == [0, 0, 9999999999999999, 1]
    want = criteo_module._parse_numpy(blob, 10, None)
    assert [len(want.rows), len(want.errors)] == [int(status == 0), int(status >= 2)]


def test_criteo_dense_table_gives_the_formula_bits() -> None:
    """The C path's table lookup of sign(v) * log1p(|v|) equals the formula's bits, wherever a value sits in the array."""
    reach = criteo_module._DENSE_REACH
    values = np.concatenate([np.arange(-reach - 3, reach + 4), [-(10**16) + 1, 10**16 - 1, 2**40, -(2**40)]]).astype(np.int64)
    values = np.random.default_rng(0).permutation(values)
    got = criteo_module._dense_by_table(values.reshape(1, -1))
    assert got.dtype == np.float32 and got.shape == (1, values.size)
    assert got[0].view(np.uint32).tolist() == criteo_module.signed_log1p(values).view(np.uint32).tolist()
    assert criteo_module._dense_by_table(np.zeros((13, 2), dtype=np.int64)).tolist() == [[0.0, 0.0]] * 13


def test_criteo_lines_checks_its_arguments() -> None:
    blob = b"1" + b"\t" * 39 + b"\n\n"
    salts = criteo_module._CAT_SALTS

    def out(n: int) -> tuple[Any, ...]:
        labels, status = np.empty(n, dtype=np.float32), np.empty(n, dtype=np.int8)
        return labels, np.empty((13, n), dtype=np.int64), np.empty((26, n), dtype=np.int64), status

    assert _c().count_newlines(blob) == 2 and _c().count_newlines(b"") == 0 and _c().count_newlines(b"ab") == 0
    assert _c().criteo_lines(blob, None, salts, 7, *out(2)) == 1
    assert _c().criteo_lines(blob, np.array([40, 41]), salts, 7, *out(2)) == 1
    assert _c().criteo_lines(b"", None, salts, 7, *out(0)) == 0
    with pytest.raises(ValueError, match="buf has 2 lines but status has 3 slots"):
        _c().criteo_lines(blob, None, salts, 7, *out(3))
    with pytest.raises(ValueError, match="buf has 2 lines but status has 1 slots"):
        _c().criteo_lines(blob, None, salts, 7, *out(1))
    with pytest.raises(ValueError, match="2 newlines but 1 status slots"):
        _c().criteo_lines(blob, np.array([40, 41]), salts, 7, *out(1))
    for bad in ([41, 40], [40, 40], [-1, 40], [40, 42], [40, 2**62]):
        with pytest.raises(ValueError, match="out of order or outside the 42-byte buffer"):
            _c().criteo_lines(blob, np.array(bad), salts, 7, *out(2))
    assert _c().criteo_lines(blob, None, salts, 0, *out(2)) == 1  # 0: raw 64-bit ids (tests/unit/data/test_criteo.py)
    with pytest.raises(ValueError, match="num_features must be >= 0"):
        _c().criteo_lines(blob, None, salts, -1, *out(2))
    with pytest.raises(ValueError, match="want salts \\[26\\]"):
        _c().criteo_lines(blob, None, salts[:25], 7, *out(2))
    labels, ints, ids, status = out(2)
    with pytest.raises(ValueError, match="ints \\[13, n\\]"):
        _c().criteo_lines(blob, None, salts, 7, labels, ints[:12], ids, status)
    with pytest.raises(TypeError, match="salts must be a uint64 array"):
        _c().criteo_lines(blob, None, salts.view(np.int64), 7, labels, ints, ids, status)
    with pytest.raises(TypeError, match="labels must be a float32 array"):
        _c().criteo_lines(blob, None, salts, 7, labels.astype(np.float64), ints, ids, status)
    with pytest.raises(TypeError, match="newlines must be an int64 array"):
        _c().criteo_lines(blob, np.array([40, 41], dtype=np.int32), salts, 7, labels, ints, ids, status)
    with pytest.raises(ValueError, match="not C-contiguous"):
        _c().criteo_lines(blob, None, salts, 7, labels, np.empty((13, 4), dtype=np.int64)[:, ::2], ids, status)
