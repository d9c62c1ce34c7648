"""Stable 64-bit hashing of ids and strings, shared by the readers and the models.

Every function is defined by the arithmetic below, on unsigned 64-bit
integers, wrapping, so ids are the same across runs, machines, processes and
numpy versions (Python's ``hash()`` is salted per process and never used).

``splitmix64(x)``:
    ``x += 0x9E3779B97F4A7C15; x = (x ^ x >> 30) * 0xBF58476D1CE4E5B9;
    x = (x ^ x >> 27) * 0x94D049BB133111EB; return x ^ x >> 31``

``name_salt(name)``: ``splitmix64`` of the FNV-1a 64-bit hash of the name's
UTF-8 bytes: the salt of a feature (column) called ``name``.

``hash_strings(s, salt)`` of a byte string ``s``: ``h = salt``; for each
8-byte little-endian word ``w`` of ``s`` (the last one zero-padded):
``h = splitmix64(h ^ w)``; then ``h = splitmix64(h ^ len(s))``.

``salted_ids(ids, salt, num_rows)``: ``splitmix64(salt ^ id) % num_rows``;
``num_rows = 0`` gives the full 64 bits of ``splitmix64(salt ^ id)`` as an
int64 (two's complement, no modulo): raw ids for tables keyed by the id.

A string feature ``name`` with ``B`` hash buckets maps ``s`` to
``hash_strings(s, name_salt(name)) % B`` (:func:`bucket_strings`), so equal
strings in different features get unrelated ids, as TensorFlow's
``categorical_column_with_hash_bucket`` gives each column its own space.  The
ids are *not* TensorFlow's (it uses FarmHash Fingerprint64): a model trained
with TensorFlow's ids cannot be served with these.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["splitmix64", "name_salt", "salted_ids", "hash_strings", "bucket_strings", "STRING_PAD", "BYTE_MASK"]

_U = np.uint64
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
#: ``BYTE_MASK[k]``: the low ``k`` bytes of a 64-bit word (k = 0..8).
BYTE_MASK = np.array([(1 << (8 * n)) - 1 if n < 8 else (1 << 64) - 1 for n in range(9)], dtype=np.uint64)

#: Bytes that must follow the last string in the buffer given to :func:`hash_strings`.
STRING_PAD = 8


def splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """The splitmix64 finalizer, elementwise, wrapping (see the module docstring)."""
    with np.errstate(over="ignore"):
        x = x + _U(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U(30))) * _U(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U(27))) * _U(0x94D049BB133111EB)
    result: npt.NDArray[np.uint64] = x ^ (x >> _U(31))
    return result


@functools.lru_cache(maxsize=4096)
def name_salt(name: str) -> np.uint64:
    """The salt of the feature ``name`` (see the module docstring); cached, as models salt every batch."""
    h = _FNV_OFFSET
    for byte in name.encode("utf-8"):
        h = ((h ^ byte) * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return _U(splitmix64(np.array([h], dtype=np.uint64))[0])


def salted_ids(ids: npt.NDArray[np.int64], salt: np.uint64, num_rows: int) -> npt.NDArray[np.int64]:
    """``splitmix64(salt ^ id) % num_rows`` for each id: a feature's ids in a space shared with others.

    ``id`` is taken as its 64 bits (``id.view(np.uint64)``, so negative ids are fine).  ``num_rows = 0``
    means raw ids, for tables keyed by the id itself: no modulo, the result is all 64 bits of
    ``splitmix64(salt ^ id)`` read as int64 (two's complement, ``.view(np.int64)``; negative
    values too).

    Raises:
        ValueError: ``num_rows`` is negative.
    """
    num_rows = int(num_rows)
    if num_rows < 0:
        raise ValueError(f"salted_ids: num_rows must be >= 1, or 0 for raw 64-bit ids; got {num_rows}")
    mixed = splitmix64(np.asarray(ids, dtype=np.int64).view(np.uint64) ^ salt)
    if num_rows == 0:
        return mixed.view(np.int64)
    return (mixed % _U(num_rows)).astype(np.int64)


def hash_strings(
    data: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    lengths: npt.NDArray[np.int64],
    salt: np.uint64 | npt.NDArray[np.uint64],
) -> npt.NDArray[np.uint64]:
    """Hashes the byte strings ``data[starts[i]:starts[i] + lengths[i]]`` (see the module docstring).

    Vectorized: one numpy pass per 8-byte word of the longest string.

    Args:
        data: contiguous bytes; at least :data:`STRING_PAD` bytes must follow
            the end of every string (they are read, then masked off).
        starts, lengths: int64, one entry per string.
        salt: one salt for all strings, or one per string.

    Raises:
        ValueError: a string (plus the padding) is outside ``data``.
    """
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    h = np.broadcast_to(np.asarray(salt, dtype=np.uint64), starts.shape).copy()
    if starts.size == 0:
        return h
    if starts.min() < 0 or lengths.min() < 0 or int((starts + lengths).max()) + STRING_PAD > len(data):
        raise ValueError(f"hash_strings: a string is outside the {len(data)}-byte buffer (with {STRING_PAD} bytes of padding)")
    words = np.ndarray((len(data) - STRING_PAD + 1,), dtype="<u8", buffer=np.ascontiguousarray(data).data, strides=(1,))
    for k in range(int((lengths.max() + 7) // 8)):
        rest = lengths - 8 * k
        use = rest > 0
        at = starts + 8 * k if k == 0 else np.where(use, starts + 8 * k, 0)  # word 0 always lies in the buffer
        mixed = splitmix64(h ^ (words[at] & BYTE_MASK[np.clip(rest, 0, 8)]))
        h = mixed if use.all() else np.where(use, mixed, h)
    return splitmix64(h ^ lengths.astype(np.uint64))


def bucket_strings(values: Sequence[bytes], name: str, buckets: int) -> npt.NDArray[np.int64]:
    """The ids of the strings ``values`` of the string feature ``name`` with ``buckets`` hash buckets."""
    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    starts = np.zeros(len(values), dtype=np.int64)
    if len(values) > 1:
        np.cumsum(lengths[:-1], out=starts[1:])
    data = np.frombuffer(b"".join(values) + bytes(STRING_PAD), dtype=np.uint8)
    return (hash_strings(data, starts, lengths, name_salt(name)) % _U(buckets)).astype(np.int64)
