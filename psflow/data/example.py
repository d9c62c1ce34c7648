"""``tf.train.Example`` decoding by schema, and the batch it makes.

The message layout is in ``example.proto`` next to this file (field numbers as
in TensorFlow's ``example.proto``).  Two decoders give the same results:

* the *fast* decoder walks all records of a chunk at once
  (:mod:`~psflow.data.example_wire`: C loops, or their numpy twins), for the
  layout every protobuf serializer writes (each message field once, map
  entries as key then value, packed numeric lists); its cost per chunk is a
  fixed number of passes whatever the number of keys wanted: entries are
  matched to the schema's keys in one pass, then all int64 lists, all float
  lists and all string lists are decoded in one call each;
* the *general* decoder is the protobuf runtime, one record at a time
  (:mod:`~psflow.data.example_pb`), for any valid encoding: unknown fields,
  repeated ``features`` fields, repeated map keys, unpacked lists...

A chunk that contains a record the fast decoder does not recognise (or that
would be malformed) is decoded entirely by the general decoder, so what a
record decodes to never depends on its neighbours.  Map keys are not checked
to be UTF-8, here as in TensorFlow's own parser.  The tests check the fast
decoder and the encoder (:mod:`~psflow.data.example_encode`) against protobuf.

Per-record problems (malformed bytes, a feature of the wrong kind, a missing
required feature, a wrong value count, ids and values of unequal length, an
id outside its ``vocabulary_size``, a value outside the domain of a dense
feature's ``log1p`` normalizer) are returned as ``(row, message)`` pairs
naming the feature; the records around them decode normally.

Strings of a VarLenFeature with ``hash_buckets`` are hashed where they lie in
the chunk (:func:`~psflow.data.hashing.hash_strings`), so no Python object is
made per string.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from psflow.data import example_pb, example_wire
from psflow.data.batch import Batch, SparseColumn, gather_ranges
from psflow.data.example_encode import encode_example, encode_sparse_examples
from psflow.data.features import signed_log1p
from psflow.data.hashing import STRING_PAD, hash_strings, name_salt
from psflow.data.schema import FixedLenFeature, Schema, SparseFeature, VarLenFeature

__all__ = [
    "Ragged",
    "ParsedExamples",
    "parse_examples",
    "decode_chunk",
    "to_batch",
    "encode_example",
    "encode_sparse_examples",
]

_KIND_OF_DTYPE = {"bytes": 1, "float32": 2, "int64": 3}
_KIND_NAME = {0: "no value", 1: "bytes_list", 2: "float_list", 3: "int64_list"}
_KIND_FIELD = {"bytes_list": 1, "float_list": 2, "int64_list": 3}
_EMPTY_OF_KIND: dict[int, npt.NDArray[Any]] = {2: np.zeros(0, dtype=np.float32), 3: np.zeros(0, dtype=np.int64)}

Ints = npt.NDArray[np.int64]


@dataclass
class Ragged:
    """Variable-length values of ``n`` examples: example ``i`` has ``values[indptr[i]:indptr[i + 1]]``."""

    indptr: Ints
    values: npt.NDArray[Any]


@dataclass
class _Strings:
    """Byte strings lying in a buffer: string ``i`` is ``data[starts[i]:starts[i] + lengths[i]]``.

    ``data`` is followed by at least STRING_PAD bytes (for :func:`hash_strings`).
    """

    data: npt.NDArray[np.uint8]
    starts: Ints
    lengths: Ints

    @staticmethod
    def of(items: Sequence[bytes]) -> _Strings:
        lengths = np.fromiter((len(v) for v in items), dtype=np.int64, count=len(items))
        starts = np.zeros(len(items), dtype=np.int64)
        if len(items) > 1:
            np.cumsum(lengths[:-1], out=starts[1:])
        return _Strings(np.frombuffer(b"".join(items) + bytes(STRING_PAD), dtype=np.uint8), starts, lengths)

    def slice(self, lo: int, hi: int) -> _Strings:
        return _Strings(self.data, self.starts[lo:hi], self.lengths[lo:hi])

    def objects(self) -> npt.NDArray[Any]:
        """The strings as an object array of ``bytes`` (one Python object each: for non-batch uses)."""
        out: npt.NDArray[Any] = np.empty(len(self.starts), dtype=object)
        data = self.data.tobytes() if len(self.starts) else b""
        out[:] = [data[s : s + n] for s, n in zip(self.starts.tolist(), self.lengths.tolist(), strict=True)]
        return out

    def bucket_ids(self, name: str, buckets: int) -> Ints:
        """``hash_strings(s, name_salt(name)) % buckets`` for each string (vectorized)."""
        hashed = hash_strings(self.data, self.starts, self.lengths, name_salt(name))
        return (hashed % np.uint64(buckets)).astype(np.int64)


@dataclass
class _Columns:
    """The wanted Example keys across a chunk of ``n`` records; key ``j = index[key]`` has

    ``kind[j]``: its list kind per record (0: absent or unset), ``counts[j]``: its
    value count per record (0 unless of the wanted kind), ``values[j]``: the values,
    record after record.
    """

    index: dict[str, int]
    kind: npt.NDArray[np.int8]  # [k, n]
    counts: Ints  # [k, n]
    values: list[npt.NDArray[Any] | _Strings]

    def indptrs(self) -> Ints:
        """``[k, n + 1]``: each key's CSR row pointers."""
        out = np.zeros((self.counts.shape[0], self.counts.shape[1] + 1), dtype=np.int64)
        np.cumsum(self.counts, axis=1, out=out[:, 1:])
        return out


@dataclass
class ParsedExamples:
    """Decoded features of ``n`` examples.

    Attributes:
        features: schema feature name -> FixedLen: array ``[n, *shape]``;
            VarLen: :class:`Ragged` (a string feature with ``hash_buckets``:
            its int64 bucket ids; without: ``bytes`` objects); SparseFeature:
            ``(Ragged ids, Ragged values)`` sharing one ``indptr``.  Rows listed
            in ``errors`` hold placeholders (defaults or no values).
        errors: ``(row, message)`` for every record that failed.
        present: the Example keys read by the schema that at least one record
            has (with a value list set).
    """

    features: dict[str, Any]
    errors: list[tuple[int, str]]
    present: frozenset[str] = field(default_factory=frozenset)

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


def _fast_columns(raw: npt.NDArray[np.uint8], starts: Ints, lengths: Ints, keys: Mapping[str, str]) -> _Columns | None:
    """Every wanted key's column, or None where the general decoder must decode the chunk.

    The entries are laid out on a key x record grid (:func:`example_wire.place_entries`)
    with the keys grouped by list kind, so each kind's lists are one contiguous
    block, decoded in one call, in key then record order.
    """
    entries = example_wire.walk(raw, starts, lengths)
    if entries is None:
        return None
    n = len(starts)
    names = sorted(keys, key=lambda k: _KIND_OF_DTYPE[keys[k]])  # stable: grouped by list kind 1, 2, 3
    want = np.array([_KIND_OF_DTYPE[keys[k]] for k in names], dtype=np.int64)
    match = example_wire.match_keys(raw, entries.key_start, entries.key_len, [k.encode("utf-8") for k in names])
    grid = example_wire.place_entries(raw, entries, match, want, n)
    if grid is None:
        return None
    shape = (len(names), n)
    counts = np.zeros(shape, dtype=np.int64)
    values: dict[int, npt.NDArray[Any] | _Strings] = {}
    for list_kind in (1, 2, 3):
        lo, hi = (int(i) for i in np.searchsorted(want, [list_kind, list_kind + 1]))
        if lo == hi:
            continue
        result = _decode_values(raw, list_kind, grid.p0[lo * n : hi * n], grid.p1[lo * n : hi * n])
        if result is None:
            return None
        got, per_slot = result
        counts[lo:hi] = per_slot.reshape(hi - lo, n)
        ends = np.zeros(hi - lo + 1, dtype=np.int64)
        np.cumsum(counts[lo:hi].sum(axis=1), out=ends[1:])
        for j in range(lo, hi):
            a, b = ends[j - lo], ends[j - lo + 1]
            values[j] = got.slice(a, b) if isinstance(got, _Strings) else got[a:b]
    # Lists no column decoded (other keys, wanted keys of another kind) must still be well formed,
    # as protobuf requires: a record's fate may not depend on which decoder its chunk used.
    rest = np.flatnonzero(~grid.decoded)
    for list_kind in (1, 2, 3):
        some = rest[entries.kind[rest] == list_kind]
        if some.size and _decode_lists(raw, list_kind, entries.body_start[some], entries.body_end[some]) is None:
            return None
    return _Columns({name: j for j, name in enumerate(names)}, grid.kind.reshape(shape), counts, [values[j] for j in range(len(names))])


def _decode_values(raw: npt.NDArray[np.uint8], kind: int, p0: Ints, p1: Ints) -> tuple[npt.NDArray[Any] | _Strings, Ints] | None:
    """Decodes value ranges of one list kind as :func:`example_wire.place_entries` gives them: packed payloads
    (int64, float) or BytesList bodies; returns (all values, count per range) or None if malformed."""
    if kind == 1:
        split = example_wire.split_bytes_lists(raw, p0, p1)
        return None if split is None else (_Strings(raw, split[0], split[1]), split[2])
    if kind == 2:
        return example_wire.gather_floats(raw, p0, p1 - p0), (p1 - p0) // 4
    return example_wire.decode_varints(raw, p0, p1)


def _decode_lists(
    raw: npt.NDArray[np.uint8], kind: int, b0: Ints, b1: Ints
) -> tuple[npt.NDArray[Any] | _Strings, Ints] | None:
    """Decodes list message bodies ``[b0, b1)`` of one kind; returns (all values, count per body) or None if not canonical."""
    if kind == 1:
        split = example_wire.split_bytes_lists(raw, b0, b1)
        if split is None:
            return None
        return _Strings(raw, split[0], split[1]), split[2]
    if b0.size == 0:
        return _EMPTY_OF_KIND[kind], np.zeros(0, dtype=np.int64)
    nonempty = b1 > b0
    size, nb = example_wire.varint_at(raw, b0 + 1)
    p0 = b0 + 1 + nb
    if np.any(nonempty & ((example_wire.read_bytes(raw, b0) != 0x0A) | (nb == 0) | (p0 + size != b1))):
        return None  # not one packed field (unpacked elements, several runs, unknown fields...)
    p0 = np.where(nonempty, p0, b0)
    if kind == 2:
        nbytes = b1 - p0
        if np.any(nbytes % 4):
            return None
        return example_wire.gather_floats(raw, p0, nbytes), nbytes // 4
    return example_wire.decode_varints(raw, p0, b1)


# --------------------------------------------------------------------------
# General decoder: the protobuf runtime, one record at a time


def _general_columns(buf: bytes, starts: Ints, lengths: Ints, keys: Mapping[str, str]) -> tuple[_Columns, list[tuple[int, str]]]:
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
    arrays: list[npt.NDArray[Any] | _Strings] = [
        _Strings.of(values[key]) if dtype == "bytes" else np.asarray(values[key], dtype=np.dtype(dtype)) for key, dtype in keys.items()
    ]
    index = {key: j for j, key in enumerate(keys)}
    stacked_kinds = np.stack([kinds[k] for k in keys]) if keys else np.zeros((0, n), dtype=np.int8)
    stacked_counts = np.stack([counts[k] for k in keys]) if keys else np.zeros((0, n), dtype=np.int64)
    return _Columns(index, stacked_kinds, stacked_counts, arrays), errors


# --------------------------------------------------------------------------
# Assembly by schema


def _indptr(counts: Ints) -> Ints:
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


@dataclass
class _Key:
    """One key's column, as the assembly of a feature sees it."""

    kind: npt.NDArray[np.int8]
    counts: Ints
    indptr: Ints
    values: npt.NDArray[Any] | _Strings


def _fixed(name: str, spec: FixedLenFeature, col: _Key, bad: dict[int, str]) -> npt.NDArray[Any]:
    out = _fixed_values(name, spec, col, bad)
    return out if spec.normalizer is None else _normalize(name, spec.normalizer, out, bad)


def _normalize(name: str, normalizer: str, values: npt.NDArray[Any], bad: dict[int, str]) -> npt.NDArray[np.float32]:
    """Applies a dense feature's normalizer (see :data:`~psflow.data.features.NORMALIZERS`) to ``values``
    ``[n, *shape]``, in float64 rounded to float32; with ``log1p`` a row holding a value ``<= -1`` is bad."""
    if normalizer == "signed_log1p":
        return signed_log1p(values)
    wide = values.astype(np.float64)
    low = wide <= -1.0  # log1p is -inf there, NaN below (NaN itself compares False and stays NaN)
    if low.any():
        flat = low.reshape(len(low), -1)
        for row in np.flatnonzero(flat.any(axis=1)).tolist():
            value = float(wide.reshape(len(low), -1)[row][flat[row]][0])
            bad.setdefault(row, f"feature {name!r}: value {value:g} is <= -1, outside the domain of its normalizer log1p "
                                "(use normalizer signed_log1p or none for values that may be negative)")
        wide[low] = 0.0
    return np.log1p(wide).astype(np.float32)


def _fixed_values(name: str, spec: FixedLenFeature, col: _Key, bad: dict[int, str]) -> npt.NDArray[Any]:
    n, size = len(col.counts), spec.size
    values = col.values.objects() if isinstance(col.values, _Strings) else col.values
    present = col.counts == size
    if size and present.all():
        return values.reshape((n, *spec.shape))  # every record has its values: the common case
    out = np.empty((n, size), dtype=object if spec.dtype == "bytes" else np.dtype(spec.dtype))
    out[:] = _default_row(spec)
    rows = np.flatnonzero(present)
    if size and rows.size:
        out[rows] = values[gather_ranges(col.indptr[rows], col.counts[rows])].reshape(-1, size)
    for row in np.flatnonzero(~present).tolist():
        count = int(col.counts[row])
        if count == 0 and spec.default is None:
            bad.setdefault(row, f"missing required feature {name!r}")
        elif count:
            bad.setdefault(row, f"feature {name!r} has {count} values, schema wants {size} (shape {spec.shape})")
    return out.reshape((n, *spec.shape))


def _varlen(name: str, spec: VarLenFeature, col: _Key, bad: dict[int, str]) -> Ragged:
    if isinstance(col.values, _Strings):
        if spec.hash_buckets is None:
            return Ragged(col.indptr, col.values.objects())
        return Ragged(col.indptr, col.values.bucket_ids(name, spec.hash_buckets))
    if spec.vocabulary_size is not None:
        _check_vocabulary(name, col.values, col.indptr, spec.vocabulary_size, bad)
    return Ragged(col.indptr, col.values)


def _check_vocabulary(name: str, ids: Ints, indptr: Ints, size: int, bad: dict[int, str]) -> None:
    """Marks the rows holding an id outside ``[0, size)`` bad, naming the feature and the first such id."""
    if ids.size == 0 or (ids.min() >= 0 and ids.max() < size):
        return
    outside = np.flatnonzero((ids < 0) | (ids >= size))
    rows = np.searchsorted(indptr, outside, side="right") - 1
    first = np.unique(rows, return_index=True)
    for row, at in zip(first[0].tolist(), first[1].tolist(), strict=True):
        bad.setdefault(row, f"feature {name!r}: id {int(ids[outside[at]])} is outside [0, {size}) (vocabulary_size)")


def _sparse(name: str, spec: SparseFeature, ids: _Key, vals: _Key | None, bad: dict[int, str]) -> tuple[Ragged, Ragged]:
    id_values = np.asarray(ids.values)
    indptr = ids.indptr
    if spec.vocabulary_size is not None:
        _check_vocabulary(name, id_values, indptr, spec.vocabulary_size, bad)
    if vals is None:
        return Ragged(indptr, id_values), Ragged(indptr, np.ones(len(id_values), dtype=np.float32))
    weights = np.asarray(vals.values)
    if np.array_equal(ids.counts, vals.counts):
        return Ragged(indptr, id_values), Ragged(indptr, weights)
    for row in np.flatnonzero(ids.counts != vals.counts).tolist():
        bad.setdefault(
            row,
            f"sparse feature {name!r}: {int(ids.counts[row])} ids ({spec.ids_key!r}) "
            f"but {int(vals.counts[row])} values ({spec.values_key!r})",
        )
    # Keep only rows where both agree, so ids and values share one indptr.
    keep = ids.counts == vals.counts
    counts = np.where(keep, ids.counts, 0)
    rows = np.flatnonzero(keep)
    id_sel = gather_ranges(indptr[rows], counts[rows])
    val_sel = gather_ranges(vals.indptr[rows], counts[rows])
    out_indptr = _indptr(counts)
    return Ragged(out_indptr, id_values[id_sel]), Ragged(out_indptr, weights[val_sel])


def _assemble(schema: Schema, columns: _Columns, keys: Mapping[str, str], errors: list[tuple[int, str]]) -> ParsedExamples:
    bad: dict[int, str] = dict(errors)
    order = list(keys)  # the first problem of a record is named in schema key order, whatever the decoder
    kinds = columns.kind[[columns.index[k] for k in order]] if order else columns.kind
    want = np.array([_KIND_OF_DTYPE[keys[k]] for k in order], dtype=np.int8)
    for j, row in zip(*np.nonzero((kinds != 0) & (kinds != want[:, None])), strict=True):
        bad.setdefault(int(row), f"feature {order[j]!r} is a {_KIND_NAME[int(kinds[j, row])]}, schema wants {keys[order[j]]}")
    indptrs = columns.indptrs()

    def key(name: str) -> _Key:
        j = columns.index[name]
        return _Key(columns.kind[j], columns.counts[j], indptrs[j], columns.values[j])

    features: dict[str, Any] = {}
    for name, spec in schema.features.items():
        if isinstance(spec, FixedLenFeature):
            features[name] = _fixed(name, spec, key(name), bad)
        elif isinstance(spec, VarLenFeature):
            features[name] = _varlen(name, spec, key(name), bad)
        else:
            vals = key(spec.values_key) if spec.values_key is not None else None
            features[name] = _sparse(name, spec, key(spec.ids_key), vals, bad)
    names = list(columns.index)
    present = frozenset(names[j] for j in np.flatnonzero(np.any(columns.kind, axis=1)).tolist())
    return ParsedExamples(features, sorted(bad.items()), present)


def decode_chunk(buf: bytes, starts: Ints, lengths: Ints, schema: Schema, *, fast: bool = True) -> ParsedExamples:
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
    columns: _Columns | None = None
    if fast and n:
        raw = np.frombuffer(buf + bytes(example_wire.PAD), dtype=np.uint8)
        columns = _fast_columns(raw, starts, lengths, keys)
    errors: list[tuple[int, str]] = []
    if columns is None:
        columns, errors = _general_columns(buf, starts, lengths, keys)
    return _assemble(schema, columns, keys, errors)


def parse_examples(records: Sequence[bytes], schema: Schema, *, fast: bool = True) -> ParsedExamples:
    """Decodes serialized Examples (see :func:`decode_chunk`)."""
    lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
    starts = np.zeros(len(records), dtype=np.int64)
    if len(records) > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    return decode_chunk(b"".join(records), starts, lengths, schema, fast=fast)


def to_batch(parsed: ParsedExamples, schema: Schema, rows: Ints | None = None) -> Batch:
    """Builds a Batch from decoded features (only ``rows``, if given).

    Every sparse and dense feature of :meth:`Schema.batch_layout` becomes a
    column, in schema order; the label is ``schema.label_key`` (0.0 without one).

    Raises:
        ValueError: the schema does not fit a Batch (see :meth:`Schema.batch_layout`).
    """
    sparse_names, dense_names = schema.batch_layout()
    n = parsed.num_examples
    if schema.label_key is not None:
        labels = np.asarray(parsed.features[schema.label_key], dtype=np.float32).reshape(n)
    else:
        labels = np.zeros(n, dtype=np.float32)
    sparse = {name: _sparse_column(parsed.features[name]) for name in sparse_names}
    batch = Batch(labels, sparse, {name: parsed.features[name] for name in dense_names})
    return batch if rows is None else batch.take(rows)


def _sparse_column(feature: Ragged | tuple[Ragged, Ragged]) -> SparseColumn:
    if isinstance(feature, Ragged):
        ids = feature.values.astype(np.int64, copy=False)
        return SparseColumn(feature.indptr, ids, np.ones(len(ids), dtype=np.float32))
    ids_part, values_part = feature
    return SparseColumn(ids_part.indptr, ids_part.values.astype(np.int64, copy=False),
                        values_part.values.astype(np.float32, copy=False))
