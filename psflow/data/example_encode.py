"""``tf.train.Example`` encoding: deterministic bytes, as TensorFlow's writers produce.

:func:`encode_example` writes any Example; :func:`encode_sparse_examples`
(the sparse-LR layout) and :func:`encode_batch_examples` (every feature of a
:class:`~psflow.data.batch.Batch`) write many at once, with vectorized varint
and float packing and one short Python step per example.  The tests check the
bytes against protobuf's ``SerializeToString(deterministic=True)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from psflow.data.batch import Batch, SparseColumn, gather_ranges
from psflow.data.schema import FeatureSpec, FixedLenFeature, Schema, SparseFeature, VarLenFeature

__all__ = ["encode_example", "encode_sparse_examples", "encode_examples", "encode_batch_examples"]

_KIND_OF_DTYPE = {"bytes": 1, "float32": 2, "int64": 3}


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
    """Serializes sparse-LR Examples (``label``, ``ids``, ``values``), like :func:`encode_example`
    (:func:`encode_examples` with those three keys)."""
    indptr = np.asarray(indptr, dtype=np.int64)
    rows = np.arange(len(indptr), dtype=np.int64)
    return encode_examples(len(indptr) - 1, {"label": ("float32", np.asarray(labels), rows),
                                             "ids": ("int64", np.asarray(ids), indptr),
                                             "values": ("float32", np.asarray(values), indptr)})


# --------------------------------------------------------------------------
# Many examples, many features, vectorized


@dataclass
class _Segments:
    """One byte segment per example: example ``i``'s bytes are ``data[ends[i]:ends[i + 1]]``."""

    data: npt.NDArray[np.uint8]
    ends: npt.NDArray[np.int64]

    @staticmethod
    def constant(piece: bytes, n: int) -> _Segments:
        return _Segments(np.tile(np.frombuffer(piece, dtype=np.uint8), n), np.arange(n + 1, dtype=np.int64) * len(piece))


def _join(parts: list[_Segments]) -> _Segments:
    """Per example, the concatenation of its segments of every part, in order."""
    lengths = np.stack([np.diff(p.ends) for p in parts], axis=1)  # [n, parts]
    bases = np.cumsum([0] + [len(p.data) for p in parts[:-1]])
    starts = np.stack([p.ends[:-1] + base for p, base in zip(parts, bases, strict=True)], axis=1)
    data = np.concatenate([p.data for p in parts])
    ends = np.zeros(lengths.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths.sum(axis=1), out=ends[1:])
    return _Segments(data[gather_ranges(starts.reshape(-1), lengths.reshape(-1))], ends)


def _wrap(segments: _Segments, number: int, *, skip_empty: bool = False) -> _Segments:
    """Each segment as a length-delimited field ``number`` (tag, varint length, bytes); with
    ``skip_empty`` an empty segment stays empty (an absent field)."""
    lengths = np.diff(segments.ends)
    keep = lengths > 0 if skip_empty else np.ones(len(lengths), dtype=bool)
    varints, counts = _varint_bytes(lengths[keep])
    sizes = np.zeros(len(lengths), dtype=np.int64)
    sizes[keep] = 1 + counts
    ends = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(sizes, out=ends[1:])
    head = np.empty(int(ends[-1]), dtype=np.uint8)
    at = ends[:-1][keep]
    head[at] = number << 3 | 2
    head[gather_ranges(at + 1, counts)] = varints
    return _join([_Segments(head, ends), segments])


def _list_body(dtype: str, values: npt.NDArray[Any], indptr: npt.NDArray[np.int64]) -> _Segments:
    """Each example's packed Int64List/FloatList body (empty for no values)."""
    if dtype == "float32":
        packed = _Segments(np.asarray(values, dtype="<f4").view(np.uint8).reshape(-1), indptr * 4)
    elif dtype == "int64":
        data, counts = _varint_bytes(np.asarray(values, dtype=np.int64))
        byte_ends = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=byte_ends[1:])
        packed = _Segments(data, byte_ends[indptr])
    else:
        raise ValueError(f"encode_examples writes int64 and float32 lists, not {dtype}")
    return _wrap(packed, 1, skip_empty=True)


def encode_examples(num_examples: int, features: Mapping[str, tuple[str, npt.NDArray[Any], npt.NDArray[np.int64]]]) -> list[bytes]:
    """Serializes ``num_examples`` Examples at once, with the bytes :func:`encode_example` gives.

    Vectorized: a fixed number of numpy passes per feature, then one slice per
    example.

    Args:
        num_examples: number of Examples.
        features: key -> ``(dtype, values, indptr)``: Example ``i`` has
            ``values[indptr[i]:indptr[i + 1]]`` under ``key``, as an int64 or a
            float list (``dtype`` ``"int64"`` or ``"float32"``), present even when empty.

    Raises:
        ValueError: a dtype other than int64 or float32.
    """
    entries = []
    for key in sorted(features, key=lambda k: k.encode("utf-8")):
        dtype, values, indptr = features[key]
        body = _list_body(dtype, values, np.asarray(indptr, dtype=np.int64))
        feature = _wrap(body, _KIND_OF_DTYPE[dtype])
        key_field = _Segments.constant(_len_field(1, key.encode("utf-8")), num_examples)
        entries.append(_wrap(_join([key_field, _wrap(feature, 2)]), 1))
    if not entries:
        entries.append(_Segments(np.zeros(0, dtype=np.uint8), np.zeros(num_examples + 1, dtype=np.int64)))
    example = _wrap(_join(entries), 1)
    blob = example.data.tobytes()
    bounds = example.ends.tolist()
    return [blob[bounds[i] : bounds[i + 1]] for i in range(num_examples)]


def encode_batch_examples(batch: Batch, schema: Schema) -> list[bytes]:
    """Serializes each example of ``batch`` as the Example that ``schema`` reads back as that example.

    Reading the records with ``schema`` (:func:`~psflow.data.example.to_batch`)
    gives ``batch`` again, bit for bit.  The label goes to ``schema.label_key``,
    each dense feature to its key, an int64 VarLenFeature's ids to its key, a
    SparseFeature's ids and values to its two keys.

    Raises:
        ValueError: the batch does not have the schema's features, or holds
            what the schema cannot give back (values other than 1.0 for a
            feature read with values 1.0; a hashed string feature; a dense
            feature with a normalizer).
    """
    n = batch.num_examples
    rows = np.arange(n + 1, dtype=np.int64)
    sparse_names, dense_names = schema.batch_layout()
    if list(batch.sparse) != sparse_names or list(batch.dense) != dense_names:
        raise ValueError(f"the batch has features {list(batch.sparse)} + {list(batch.dense)}, "
                         f"the schema {sparse_names} + {dense_names}")
    out: dict[str, tuple[str, npt.NDArray[Any], npt.NDArray[np.int64]]] = {}
    if schema.label_key is not None:
        out[schema.label_key] = (_fixed_spec(schema, schema.label_key).dtype, batch.labels, rows)
    for name in dense_names:
        spec = _fixed_spec(schema, name)
        out[name] = (spec.dtype, batch.dense[name].reshape(-1), rows * spec.size)
    for name in sparse_names:
        out.update(_sparse_lists(name, schema.features[name], batch.sparse[name]))
    return encode_examples(n, out)


def _sparse_lists(name: str, spec: FeatureSpec, column: SparseColumn) -> dict[str, tuple[str, npt.NDArray[Any], npt.NDArray[np.int64]]]:
    """The Example lists of one sparse feature: its ids (and values) under the keys the schema reads."""
    if isinstance(spec, VarLenFeature) and spec.dtype != "int64":
        raise ValueError(f"feature {name!r}: hashed strings cannot be written back")
    ids_key, values_key = (spec.ids_key, spec.values_key) if isinstance(spec, SparseFeature) else (name, None)
    if values_key is None and not np.all(column.values == 1.0):
        raise ValueError(f"feature {name!r}: the schema reads its values as 1.0, the batch has others")
    lists: dict[str, tuple[str, npt.NDArray[Any], npt.NDArray[np.int64]]] = {ids_key: ("int64", column.ids, column.indptr)}
    if values_key is not None:
        lists[values_key] = ("float32", column.values, column.indptr)
    return lists


def _fixed_spec(schema: Schema, name: str) -> FixedLenFeature:
    spec = schema.features[name]
    if not isinstance(spec, FixedLenFeature):
        raise ValueError(f"feature {name!r}: want a FixedLenFeature, the schema has {spec!r}")
    if spec.normalizer is not None:
        raise ValueError(f"feature {name!r}: the schema normalizes it ({spec.normalizer}), so its batch values "
                         "cannot be written back as the stored ones")
    return spec
