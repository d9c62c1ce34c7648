"""``tf.train.Example`` wire format: vectorized decoding by schema, and encoding.

The message layout is in ``example.proto`` next to this file (field numbers as
in TensorFlow's ``example.proto``).  Two decoders give the same results:

* the *fast* decoder, written here, walks all records of a chunk at once with
  numpy, for the layout every protobuf serializer writes (each message field
  once, map entries as key then value, packed numeric lists) -- about 6x the
  speed of the general one on sparse-LR records;
* the *general* decoder is the protobuf runtime, one record at a time
  (:mod:`~psflow.data.example_pb`), for any valid encoding: unknown fields,
  repeated ``features`` fields, repeated map keys, unpacked lists...

A chunk that contains a record the fast decoder does not recognise (or that
would be malformed) is decoded entirely by the general decoder, so what a
record decodes to never depends on its neighbours.  Map keys are not checked
to be UTF-8, here as in TensorFlow's own parser.  The tests check the fast
decoder and the encoder against protobuf.

Per-record problems (malformed bytes, a feature of the wrong kind, a missing
required feature, a wrong value count, ids and values of unequal length) are
returned as ``(row, message)`` pairs; the records around them decode normally.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from psflow.data import example_pb
from psflow.data.batch import SparseBatch, gather_ranges
from psflow.data.native import NATIVE
from psflow.data.schema import FixedLenFeature, Schema, SparseFeature, VarLenFeature

__all__ = [
    "Ragged",
    "ParsedExamples",
    "parse_examples",
    "decode_chunk",
    "to_sparse_batch",
    "encode_example",
    "encode_sparse_examples",
]

_KIND_OF_DTYPE = {"bytes": 1, "float32": 2, "int64": 3}
_KIND_NAME = {0: "no value", 1: "bytes_list", 2: "float_list", 3: "int64_list"}
_PAD = 16


@dataclass
class Ragged:
    """Variable-length values of ``n`` examples: example ``i`` has ``values[indptr[i]:indptr[i + 1]]``."""

    indptr: npt.NDArray[np.int64]
    values: npt.NDArray[Any]


@dataclass
class _KeyColumn:
    """One Example key across a chunk: its kind per record (0: absent/unset) and its values."""

    kind: npt.NDArray[np.int8]
    counts: npt.NDArray[np.int64]
    values: npt.NDArray[Any]


@dataclass
class ParsedExamples:
    """Decoded features of ``n`` examples.

    Attributes:
        features: schema feature name -> FixedLen: array ``[n, *shape]``;
            VarLen: :class:`Ragged`; SparseFeature: ``(Ragged ids, Ragged values)``
            sharing one ``indptr``.  Rows listed in ``errors`` hold placeholders
            (defaults or no values).
        errors: ``(row, message)`` for every record that failed.
    """

    features: dict[str, Any]
    errors: list[tuple[int, str]]

    @property
    def num_examples(self) -> int:
        """Number of rows, bad ones included."""
        for value in self.features.values():
            if isinstance(value, Ragged):
                return len(value.indptr) - 1
            if isinstance(value, tuple):
                return len(value[0].indptr) - 1
            return int(value.shape[0])
        return 0


# --------------------------------------------------------------------------
# Fast decoder


def _read(raw: npt.NDArray[np.uint8], pos: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Bytes at ``pos`` (positions past the buffer read as 0; callers check ranges)."""
    return raw[np.minimum(pos, len(raw) - 1)].astype(np.int64)


def _varint_at(raw: npt.NDArray[np.uint8], pos: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Decodes the varint at each position; returns (values, byte counts), count 0 when longer than 5 bytes."""
    b = _read(raw, pos)
    value = b & 0x7F
    nbytes = np.ones_like(value)
    cont = b >= 0x80
    for j in range(1, 5):
        idx = np.flatnonzero(cont)
        if idx.size == 0:
            return value, nbytes
        bj = _read(raw, pos[idx] + j)
        value[idx] |= (bj & 0x7F) << (7 * j)
        nbytes[idx] += 1
        cont[idx] = bj >= 0x80
    nbytes[cont] = 0
    return value, nbytes


@dataclass
class _Entries:
    rec: npt.NDArray[np.int64]
    key_start: npt.NDArray[np.int64]
    key_len: npt.NDArray[np.int64]
    kind: npt.NDArray[np.int64]
    body_start: npt.NDArray[np.int64]
    body_end: npt.NDArray[np.int64]


def _walk(raw: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]) -> _Entries | None:
    """Finds every map entry of every record; None if any record is not in the canonical layout.

    Entries come record by record (C) or entry round by entry round (numpy); callers only rely on
    the order of entries within a record, which both keep.
    """
    if NATIVE is not None:
        cap = int(lengths.sum()) // 6 + 1  # every entry takes at least 6 bytes
        out = np.empty((6, cap), dtype=np.int64)
        count = NATIVE.walk_examples(raw, starts, lengths, out)
        if count < 0:
            return None
        return _Entries(*(out[j, :count] for j in range(6)))
    return _walk_numpy(raw, starts, lengths)


def _walk_numpy(raw: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64]) -> _Entries | None:
    """:func:`_walk` in numpy (no extension)."""
    ends = starts + lengths
    nonempty = np.flatnonzero(lengths > 0)
    p = starts[nonempty]
    size, nb = _varint_at(raw, p + 1)
    cur = p + 1 + nb + size
    if np.any((_read(raw, p) != 0x0A) | (nb == 0) | (cur != ends[nonempty])):
        return None
    cur = p + 1 + nb
    end = ends[nonempty]
    has_entries = cur < end
    recs, cur, end = nonempty[has_entries], cur[has_entries], end[has_entries]
    parts: list[tuple[npt.NDArray[np.int64], ...]] = []
    while recs.size:
        # entry: 0x0A len { 0x0A len key  0x12 len { tag len list } }
        le, nb1 = _varint_at(raw, cur + 1)
        e0 = cur + 1 + nb1
        e1 = e0 + le
        lk, nb2 = _varint_at(raw, e0 + 1)
        k0 = e0 + 1 + nb2
        k1 = k0 + lk
        lf, nb3 = _varint_at(raw, k1 + 1)
        f0 = k1 + 1 + nb3
        tag = _read(raw, f0)
        ll, nb4 = _varint_at(raw, f0 + 1)
        l0 = f0 + 1 + nb4
        has_kind = lf > 0
        bad = (_read(raw, cur) != 0x0A) | (nb1 == 0) | (e1 > end)
        bad |= (_read(raw, e0) != 0x0A) | (nb2 == 0) | (_read(raw, k1) != 0x12) | (nb3 == 0) | (f0 + lf != e1)
        bad |= has_kind & (((tag & 7) != 2) | (tag < 0x08) | (tag > 0x1F) | (nb4 == 0) | (l0 + ll != e1))
        if bad.any():
            return None
        kind = np.where(has_kind, tag >> 3, 0)
        parts.append((recs, k0, lk, kind, np.where(has_kind, l0, e1), e1))
        more = e1 < end
        recs, cur, end = recs[more], e1[more], end[more]
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return _Entries(empty, empty, empty, empty, empty, empty)
    cols = [np.concatenate([part[i] for part in parts]) for i in range(6)]
    return _Entries(*cols)


def _match_key(raw: npt.NDArray[np.uint8], entries: _Entries, key: bytes) -> npt.NDArray[np.int64]:
    """Indices of entries whose key equals ``key``."""
    idx = np.flatnonzero(entries.key_len == len(key))
    for j, ch in enumerate(key):
        if idx.size == 0:
            break
        idx = idx[raw[entries.key_start[idx] + j] == ch]
    return idx


def _decode_varints(
    raw: npt.NDArray[np.uint8], p0: npt.NDArray[np.int64], p1: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """Decodes packed varints in each byte range; returns (int64 values, count per range) or None if malformed."""
    if NATIVE is not None:
        values = np.empty(int((p1 - p0).sum()), dtype=np.int64)
        counts = np.empty(len(p0), dtype=np.int64)
        total = NATIVE.decode_varints(raw, p0, p1, values, counts)
        return None if total < 0 else (values[:total], counts)
    return _decode_varints_numpy(raw, p0, p1)


def _decode_varints_numpy(
    raw: npt.NDArray[np.uint8], p0: npt.NDArray[np.int64], p1: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """:func:`_decode_varints` in numpy (no extension)."""
    lengths = p1 - p0
    b = raw[gather_ranges(p0, lengths)]
    term = b < 0x80
    bounds = np.cumsum(lengths)
    if not term[bounds[lengths > 0] - 1].all():
        return None  # a range ends inside a varint
    ends = np.flatnonzero(term)
    vstart = np.zeros_like(ends)
    vstart[1:] = ends[:-1] + 1
    vlen = ends - vstart + 1
    maxlen = int(vlen.max()) if vlen.size else 0
    if maxlen > 10:
        return None
    low = b & np.uint8(0x7F)
    value = low[vstart].astype(np.uint64)
    for j in range(1, maxlen):
        part = low[np.minimum(vstart + j, ends)].astype(np.uint64)
        part[vlen <= j] = 0
        value |= part << np.uint64(7 * j)
    counts = np.diff(np.searchsorted(ends, bounds), prepend=0)
    return value.view(np.int64), counts


def _fast_columns(
    raw: npt.NDArray[np.uint8], starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64], keys: Mapping[str, str]
) -> dict[str, _KeyColumn] | None:
    entries = _walk(raw, starts, lengths)
    if entries is None:
        return None
    n = len(starts)
    columns: dict[str, _KeyColumn] = {}
    decoded = np.zeros(len(entries.rec), dtype=bool)
    for key, dtype in keys.items():
        sel = _match_key(raw, entries, key.encode("utf-8"))
        rec = entries.rec[sel]
        if rec.size and np.bincount(rec, minlength=n).max() > 1:
            return None  # a repeated map key: the general decoder applies last-wins
        kind = np.zeros(n, dtype=np.int8)
        kind[rec] = entries.kind[sel]
        use = sel[entries.kind[sel] == _KIND_OF_DTYPE[dtype]]
        use = use[np.argsort(entries.rec[use], kind="stable")]  # values must come in record order
        result = _decode_lists(raw, _KIND_OF_DTYPE[dtype], entries.body_start[use], entries.body_end[use])
        if result is None:
            return None
        values, per_entry = result
        counts = np.zeros(n, dtype=np.int64)
        counts[entries.rec[use]] = per_entry
        decoded[use] = True
        columns[key] = _KeyColumn(kind, counts, values)
    # Features the schema does not read must still be well formed, as protobuf
    # requires: a record's fate may not depend on which decoder its chunk used.
    for list_kind in (1, 2, 3):
        rest = np.flatnonzero(~decoded & (entries.kind == list_kind))
        if rest.size and _decode_lists(raw, list_kind, entries.body_start[rest], entries.body_end[rest]) is None:
            return None
    return columns


def _decode_lists(
    raw: npt.NDArray[np.uint8], kind: int, b0: npt.NDArray[np.int64], b1: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]] | None:
    """Decodes list message bodies ``[b0, b1)`` of one kind; returns (all values, count per body) or None if not canonical."""
    counts = np.zeros(len(b0), dtype=np.int64)
    if kind == 1:
        items: list[bytes] = []
        data = raw.tobytes() if b0.size else b""
        for i, (s, e) in enumerate(zip(b0.tolist(), b1.tolist(), strict=True)):
            found = _bytes_list(data, s, e)
            if found is None:
                return None
            counts[i] = len(found)
            items.extend(found)
        values: npt.NDArray[Any] = np.empty(len(items), dtype=object)
        values[:] = items
        return values, counts
    nonempty = b1 > b0
    size, nb = _varint_at(raw, b0 + 1)
    p0 = b0 + 1 + nb
    if np.any(nonempty & ((_read(raw, b0) != 0x0A) | (nb == 0) | (p0 + size != b1))):
        return None  # not one packed field (unpacked elements, several runs, unknown fields...)
    p0 = np.where(nonempty, p0, b0)
    if kind == 2:
        nbytes = b1 - p0
        if np.any(nbytes % 4):
            return None
        if NATIVE is not None:
            out = np.empty(int(nbytes.sum()) // 4, dtype=np.float32)  # the extension is little-endian only, like "<f4"
            NATIVE.copy_ranges(raw, p0, nbytes, out)
            return out, nbytes // 4
        floats = np.ndarray((len(raw) - 3,), dtype="<f4", buffer=raw.data, strides=(1,))
        return floats[gather_ranges(p0, nbytes // 4, step=4)].astype(np.float32), nbytes // 4
    return _decode_varints(raw, p0, b1)


def _bytes_list(data: bytes, start: int, end: int) -> list[bytes] | None:
    """Items of a canonically encoded BytesList body; None if not canonical."""
    items = []
    pos = start
    try:
        while pos < end:
            if data[pos] != 0x0A:
                return None
            size, pos = _varint(data, pos + 1, end)
            if pos + size > end:
                return None
            items.append(data[pos : pos + size])
            pos += size
    except _Malformed:
        return None
    return items


# --------------------------------------------------------------------------
# General decoder: the protobuf runtime, one record at a time


class _Malformed(Exception):
    pass


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    value = 0
    shift = 0
    while True:
        if pos >= end or shift >= 70:
            raise _Malformed("truncated or overlong varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7


_KIND_FIELD = {"bytes_list": 1, "float_list": 2, "int64_list": 3}


def _general_columns(
    buf: bytes, starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64], keys: Mapping[str, str]
) -> tuple[dict[str, _KeyColumn], list[tuple[int, str]]]:
    # proto2 rules: the same wire format without UTF-8 checks on keys, as in the fast path.
    example_class = example_pb.example_class(check_utf8=False)
    decode_error = importlib.import_module("google.protobuf.message").DecodeError
    n = len(starts)
    errors: list[tuple[int, str]] = []
    kinds = {k: np.zeros(n, dtype=np.int8) for k in keys}
    counts = {k: np.zeros(n, dtype=np.int64) for k in keys}
    values: dict[str, list[Any]] = {k: [] for k in keys}
    view = memoryview(buf)
    for row, (s, length) in enumerate(zip(starts.tolist(), lengths.tolist(), strict=True)):
        try:
            feature_map = example_class.FromString(view[s : s + length]).features.feature
        except decode_error as e:
            errors.append((row, f"malformed Example: {e}"))
            continue
        for key, dtype in keys.items():
            if key not in feature_map:
                continue
            feature = feature_map[key]
            kind = feature.WhichOneof("kind")
            if kind is None:
                continue
            kinds[key][row] = _KIND_FIELD[kind]
            if _KIND_FIELD[kind] == _KIND_OF_DTYPE[dtype]:
                got = getattr(feature, kind).value
                counts[key][row] = len(got)
                values[key].extend(got)
    columns = {}
    for key, dtype in keys.items():
        if dtype == "bytes":
            array: npt.NDArray[Any] = np.empty(len(values[key]), dtype=object)
            array[:] = values[key]
        else:
            array = np.asarray(values[key], dtype=np.dtype(dtype))
        columns[key] = _KeyColumn(kinds[key], counts[key], array)
    return columns, errors


# --------------------------------------------------------------------------
# Assembly by schema


def _indptr(counts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr


def _default_row(spec: FixedLenFeature) -> npt.NDArray[Any]:
    size = spec.size
    if spec.dtype == "bytes":
        row: npt.NDArray[Any] = np.empty(size, dtype=object)
        default = spec.default if spec.default is not None else b""
        row[:] = list(default) if isinstance(default, (list, tuple)) else [default] * size
        return row
    default = 0 if spec.default is None else spec.default
    return np.broadcast_to(np.asarray(default, dtype=spec.dtype).reshape(-1), (size,))


def _fixed(name: str, spec: FixedLenFeature, col: _KeyColumn, bad: dict[int, str]) -> npt.NDArray[Any]:
    n, size = len(col.counts), spec.size
    present = col.counts == size
    if size and present.all():
        return col.values.reshape((n, *spec.shape))
    out = np.empty((n, size), dtype=object if spec.dtype == "bytes" else np.dtype(spec.dtype))
    out[:] = _default_row(spec)
    rows = np.flatnonzero(present)
    if size and rows.size:
        indptr = _indptr(col.counts)
        out[rows] = col.values[gather_ranges(indptr[rows], col.counts[rows])].reshape(-1, size)
    for row in np.flatnonzero(~present).tolist():
        count = int(col.counts[row])
        if count == 0 and spec.default is None:
            bad.setdefault(row, f"missing required feature {name!r}")
        elif count:
            bad.setdefault(row, f"feature {name!r} has {count} values, schema wants {size} (shape {spec.shape})")
    return out.reshape((n, *spec.shape))


def _assemble(
    schema: Schema, columns: Mapping[str, _KeyColumn], keys: Mapping[str, str], errors: list[tuple[int, str]], n: int
) -> ParsedExamples:
    bad: dict[int, str] = dict(errors)
    for key, dtype in keys.items():
        col = columns[key]
        wrong = np.flatnonzero((col.kind != 0) & (col.kind != _KIND_OF_DTYPE[dtype]))
        for row in wrong.tolist():
            bad.setdefault(row, f"feature {key!r} is a {_KIND_NAME[int(col.kind[row])]}, schema wants {dtype}")
    features: dict[str, Any] = {}
    for name, spec in schema.features.items():
        if isinstance(spec, FixedLenFeature):
            features[name] = _fixed(name, spec, columns[name], bad)
        elif isinstance(spec, VarLenFeature):
            col = columns[name]
            features[name] = Ragged(_indptr(col.counts), col.values)
        else:
            features[name] = _sparse(name, spec, columns, bad, n)
    return ParsedExamples(features, sorted(bad.items()))


def _sparse(name: str, spec: SparseFeature, columns: Mapping[str, _KeyColumn], bad: dict[int, str], n: int) -> tuple[Ragged, Ragged]:
    ids = columns[spec.ids_key]
    indptr = _indptr(ids.counts)
    if spec.values_key is None:
        return Ragged(indptr, ids.values), Ragged(indptr, np.ones(len(ids.values), dtype=np.float32))
    vals = columns[spec.values_key]
    mismatch = np.flatnonzero(ids.counts != vals.counts)
    if mismatch.size == 0:
        return Ragged(indptr, ids.values), Ragged(indptr, vals.values)
    for row in mismatch.tolist():
        bad.setdefault(
            row,
            f"sparse feature {name!r}: {int(ids.counts[row])} ids ({spec.ids_key!r}) "
            f"but {int(vals.counts[row])} values ({spec.values_key!r})",
        )
    # Keep only rows where both agree, so ids and values share one indptr.
    keep = ids.counts == vals.counts
    counts = np.where(keep, ids.counts, 0)
    out_indptr = _indptr(counts)
    rows = np.flatnonzero(keep)
    id_sel = gather_ranges(indptr[rows], counts[rows])
    val_sel = gather_ranges(_indptr(vals.counts)[rows], counts[rows])
    return Ragged(out_indptr, ids.values[id_sel]), Ragged(out_indptr, vals.values[val_sel])


def decode_chunk(
    buf: bytes,
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    schema: Schema,
    *,
    fast: bool = True,
) -> ParsedExamples:
    """Decodes the serialized Examples at ``buf[starts[i]:starts[i] + lengths[i]]``.

    Args:
        buf: bytes holding the records.
        starts, lengths: int64 arrays, one entry per record.
        schema: what to extract.
        fast: try the vectorized decoder first (False: general decoder only).

    Returns:
        Features of every record; failed records are listed in ``errors``.
    """
    keys = schema.example_keys()
    n = len(starts)
    columns: dict[str, _KeyColumn] | None = None
    if fast and n:
        raw = np.frombuffer(buf + bytes(_PAD), dtype=np.uint8)
        columns = _fast_columns(raw, starts, lengths, keys)
    errors: list[tuple[int, str]] = []
    if columns is None:
        columns, errors = _general_columns(buf, starts, lengths, keys)
    return _assemble(schema, columns, keys, errors, n)


def parse_examples(records: Sequence[bytes], schema: Schema, *, fast: bool = True) -> ParsedExamples:
    """Decodes serialized Examples (see :func:`decode_chunk`)."""
    lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
    starts = np.zeros(len(records), dtype=np.int64)
    if len(records) > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    return decode_chunk(b"".join(records), starts, lengths, schema, fast=fast)


def to_sparse_batch(parsed: ParsedExamples, schema: Schema, rows: npt.NDArray[np.int64] | None = None) -> SparseBatch:
    """Builds a SparseBatch from decoded features (only ``rows``, if given).

    Raises:
        ValueError: the schema does not fit a SparseBatch (see :meth:`Schema.batch_layout`).
    """
    sparse_name, dense_names = schema.batch_layout()
    n = parsed.num_examples
    if schema.label_key is not None:
        labels = np.asarray(parsed.features[schema.label_key], dtype=np.float32).reshape(n)
    else:
        labels = np.zeros(n, dtype=np.float32)
    if sparse_name is None:
        indptr = np.zeros(n + 1, dtype=np.int64)
        ids = np.zeros(0, dtype=np.int64)
        values = np.zeros(0, dtype=np.float32)
    else:
        sparse = parsed.features[sparse_name]
        if isinstance(sparse, Ragged):
            indptr, ids = sparse.indptr, sparse.values
            values = np.ones(len(ids), dtype=np.float32)
        else:
            indptr, ids, values = sparse[0].indptr, sparse[0].values, sparse[1].values
    batch = SparseBatch(
        labels=labels,
        indptr=indptr,
        ids=ids.astype(np.int64, copy=False),
        values=values.astype(np.float32, copy=False),
        dense={name: parsed.features[name] for name in dense_names},
    )
    return batch if rows is None else batch.take(rows)


# --------------------------------------------------------------------------
# Encoding


def _put_varint(value: int) -> bytes:
    value &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(number: int, body: bytes) -> bytes:
    return _put_varint(number << 3 | 2) + _put_varint(len(body)) + body


def _encode_list(kind: int, values: Any) -> bytes:
    if kind == 1:
        body = b"".join(_len_field(1, bytes(v)) for v in values)
    elif kind == 2:
        packed = np.asarray(values, dtype="<f4").tobytes()
        body = _len_field(1, packed) if packed else b""
    else:
        packed = b"".join(_put_varint(int(v)) for v in np.asarray(values, dtype=np.int64).tolist())
        body = _len_field(1, packed) if packed else b""
    return _len_field(kind, body)


def encode_example(features: Mapping[str, tuple[str, Any]]) -> bytes:
    """Serializes one Example, deterministically (map entries in byte-wise sorted key order).

    The bytes equal protobuf's ``SerializeToString(deterministic=True)`` of an
    Example whose ``features`` field is set (as TensorFlow's writers set it,
    even when empty).  (Exception: where one key is a prefix of another,
    upb -- protobuf's Python runtime -- writes the longer key first; C++
    protobuf and this function write the shorter first.)

    Args:
        features: key -> (dtype, values) with dtype ``"int64"``, ``"float32"``
            or ``"bytes"`` and a flat sequence of values.
    """
    entries = []
    for key in sorted(features, key=lambda k: k.encode("utf-8")):
        dtype, values = features[key]
        feature = _encode_list(_KIND_OF_DTYPE[dtype], values)
        entries.append(_len_field(1, _len_field(1, key.encode("utf-8")) + _len_field(2, feature)))
    return _len_field(1, b"".join(entries))


def _varint_bytes(values: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Vectorized varint encoding: returns (concatenated bytes, byte count per value)."""
    v = values.astype(np.int64).view(np.uint64)
    nbytes = np.ones(len(v), dtype=np.int64)
    for j in range(1, 10):
        nbytes += v >= (np.uint64(1) << np.uint64(7 * j))
    out = np.zeros((len(v), 10), dtype=np.uint8)
    for j in range(10):
        out[:, j] = ((v >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8) | np.where(nbytes > j + 1, 0x80, 0)
    keep = np.arange(10) < nbytes[:, None]
    return out[keep], nbytes


def encode_sparse_examples(
    labels: npt.NDArray[Any], indptr: npt.NDArray[np.int64], ids: npt.NDArray[np.int64], values: npt.NDArray[Any]
) -> list[bytes]:
    """Serializes sparse-LR Examples (``label``, ``ids``, ``values``), like :func:`encode_example`.

    Vectorized varint encoding; one short Python step per example.
    """
    id_bytes, id_nbytes = _varint_bytes(np.asarray(ids, dtype=np.int64))
    id_ends = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(id_nbytes, out=id_ends[1:])
    id_blob = id_bytes.tobytes()
    value_blob = np.asarray(values, dtype="<f4").tobytes()
    label_blob = np.asarray(labels, dtype="<f4").tobytes()
    k_ids = _len_field(1, b"ids")
    k_label = _len_field(1, b"label")
    k_values = _len_field(1, b"values")
    out = []
    bounds = indptr.tolist()
    byte_bounds = id_ends[indptr].tolist()
    for i in range(len(bounds) - 1):
        a, b = bounds[i], bounds[i + 1]
        packed_ids = id_blob[byte_bounds[i] : byte_bounds[i + 1]]
        packed_values = value_blob[4 * a : 4 * b]
        ids_list = _len_field(1, packed_ids) if packed_ids else b""
        values_list = _len_field(1, packed_values) if packed_values else b""
        body = (
            _len_field(1, k_ids + _len_field(2, _len_field(3, ids_list)))
            + _len_field(1, k_label + _len_field(2, _len_field(2, _len_field(1, label_blob[4 * i : 4 * i + 4]))))
            + _len_field(1, k_values + _len_field(2, _len_field(2, values_list)))
        )
        out.append(_len_field(1, body))
    return out
