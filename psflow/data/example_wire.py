"""The fast Example decoder's per-byte loops, each in C (``_native``) and in numpy.

Every function here works on a whole chunk of serialized ``tf.train.Example``
records at once, in the canonical layout that every protobuf serializer
writes (see :mod:`~psflow.data.example`); each returns ``None`` when a record
is not in that layout, and the caller then decodes the chunk with the
protobuf runtime.  Each loop runs in C when the extension is loaded
(:mod:`~psflow.data.native`; ``NATIVE`` here is what the tests and benchmarks
switch) and in numpy otherwise, with the same results (the tests compare the
two on random and malformed input):

* :func:`walk` -- the feature-map entries of every record (key range, list
  kind, list body range);
* :func:`match_keys` -- which wanted key each entry has, in one pass;
* :func:`place_entries` -- the wanted entries on a key x record grid, with
  the byte range of each one's values (packed payload, or BytesList body);
* :func:`decode_varints` -- packed varint lists (int64 values);
* :func:`gather_floats` -- packed float lists;
* :func:`split_bytes_lists` -- the items of BytesList bodies, as byte ranges
  (strings are hashed from there, never turned into Python objects).

``raw`` is always the chunk's bytes as uint8 followed by :data:`PAD` zero bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from psflow.data.batch import gather_ranges
from psflow.data.hashing import BYTE_MASK, STRING_PAD, hash_strings
from psflow.data.native import NATIVE

__all__ = [
    "PAD",
    "Entries",
    "walk",
    "walk_numpy",
    "match_keys",
    "match_keys_numpy",
    "Grid",
    "place_entries",
    "place_entries_numpy",
    "decode_varints",
    "decode_varints_numpy",
    "gather_floats",
    "split_bytes_lists",
    "split_bytes_lists_numpy",
    "read_bytes",
    "varint_at",
]

#: Zero bytes after a chunk's data: lets the loops read a few bytes past a record without checks.
PAD = 16

Ints = npt.NDArray[np.int64]


def read_bytes(raw: npt.NDArray[np.uint8], pos: Ints) -> Ints:
    """Bytes at ``pos`` (positions past the buffer read as 0; callers check ranges)."""
    return raw[np.minimum(pos, len(raw) - 1)].astype(np.int64)


def varint_at(raw: npt.NDArray[np.uint8], pos: Ints) -> tuple[Ints, Ints]:
    """Decodes the varint at each position; returns (values, byte counts), count 0 when longer than 5 bytes."""
    b = read_bytes(raw, pos)
    value = b & 0x7F
    nbytes = np.ones_like(value)
    cont = b >= 0x80
    for j in range(1, 5):
        idx = np.flatnonzero(cont)
        if idx.size == 0:
            return value, nbytes
        bj = read_bytes(raw, pos[idx] + j)
        value[idx] |= (bj & 0x7F) << (7 * j)
        nbytes[idx] += 1
        cont[idx] = bj >= 0x80
    nbytes[cont] = 0
    return value, nbytes


@dataclass
class Entries:
    """Feature-map entries of a chunk: record index, key range, list kind (1 bytes, 2 float, 3 int64, 0 unset), body range.

    ``table`` is the int64 ``[6, cap]`` array the six columns are the first
    entries of (from the C walk; ``None`` from the numpy one).
    """

    rec: Ints
    key_start: Ints
    key_len: Ints
    kind: Ints
    body_start: Ints
    body_end: Ints
    table: Ints | None = None


def walk(raw: npt.NDArray[np.uint8], starts: Ints, lengths: Ints) -> Entries | None:
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
        rec, key_start, key_len, kind, body_start, body_end = (out[j, :count] for j in range(6))
        return Entries(rec, key_start, key_len, kind, body_start, body_end, table=out)
    return walk_numpy(raw, starts, lengths)


def walk_numpy(raw: npt.NDArray[np.uint8], starts: Ints, lengths: Ints) -> Entries | None:
    """:func:`walk` in numpy (no extension)."""
    ends = starts + lengths
    nonempty = np.flatnonzero(lengths > 0)
    p = starts[nonempty]
    size, nb = varint_at(raw, p + 1)
    cur = p + 1 + nb + size
    if np.any((read_bytes(raw, p) != 0x0A) | (nb == 0) | (cur != ends[nonempty])):
        return None
    cur = p + 1 + nb
    end = ends[nonempty]
    has_entries = cur < end
    recs, cur, end = nonempty[has_entries], cur[has_entries], end[has_entries]
    parts: list[tuple[Ints, ...]] = []
    while recs.size:
        # entry: 0x0A len { 0x0A len key  0x12 len { tag len list } }
        le, nb1 = varint_at(raw, cur + 1)
        e0 = cur + 1 + nb1
        e1 = e0 + le
        lk, nb2 = varint_at(raw, e0 + 1)
        k0 = e0 + 1 + nb2
        k1 = k0 + lk
        lf, nb3 = varint_at(raw, k1 + 1)
        f0 = k1 + 1 + nb3
        tag = read_bytes(raw, f0)
        ll, nb4 = varint_at(raw, f0 + 1)
        l0 = f0 + 1 + nb4
        has_kind = lf > 0
        bad = (read_bytes(raw, cur) != 0x0A) | (nb1 == 0) | (e1 > end)
        bad |= (read_bytes(raw, e0) != 0x0A) | (nb2 == 0) | (read_bytes(raw, k1) != 0x12) | (nb3 == 0) | (f0 + lf != e1)
        bad |= has_kind & (((tag & 7) != 2) | (tag < 0x08) | (tag > 0x1F) | (nb4 == 0) | (l0 + ll != e1))
        if bad.any():
            return None
        kind = np.where(has_kind, tag >> 3, 0)
        parts.append((recs, k0, lk, kind, np.where(has_kind, l0, e1), e1))
        more = e1 < end
        recs, cur, end = recs[more], e1[more], end[more]
    if not parts:
        empty = np.zeros(0, dtype=np.int64)
        return Entries(empty, empty, empty, empty, empty, empty)
    return Entries(*(np.concatenate([part[i] for part in parts]) for i in range(6)))


def _key_table(keys: Sequence[bytes]) -> tuple[bytes, Ints]:
    offsets = np.zeros(len(keys) + 1, dtype=np.int64)
    np.cumsum([len(k) for k in keys], out=offsets[1:])
    return b"".join(keys), offsets


def match_keys(raw: npt.NDArray[np.uint8], key_start: Ints, key_len: Ints, keys: Sequence[bytes]) -> Ints:
    """For each key range ``raw[key_start[i]:key_start[i] + key_len[i]]``, the index in ``keys`` of the equal key, or -1.

    When ``keys`` holds a key twice, the first index is given.  One pass over the
    entries, however many keys are wanted (C: a hash-table probe per entry).
    """
    if NATIVE is not None:
        out = np.empty(len(key_start), dtype=np.int64)
        blob, offsets = _key_table(keys)
        NATIVE.match_keys(raw, key_start, key_len, out, blob, offsets)
        return out
    return match_keys_numpy(raw, key_start, key_len, keys)


def match_keys_numpy(raw: npt.NDArray[np.uint8], key_start: Ints, key_len: Ints, keys: Sequence[bytes]) -> Ints:
    """:func:`match_keys` in numpy: hash every key range once, look the hashes up, then compare the bytes."""
    out = np.full(len(key_start), -1, dtype=np.int64)
    if not keys or not len(key_start):
        return out
    blob, offsets = _key_table(keys)
    table = np.frombuffer(blob + bytes(STRING_PAD), dtype=np.uint8)
    want = hash_strings(table, offsets[:-1], np.diff(offsets), np.uint64(0))
    order = np.argsort(want, kind="stable")  # equal keys: the first index comes first
    sorted_want = want[order]
    got = hash_strings(raw, key_start, key_len, np.uint64(0))
    at = np.minimum(np.searchsorted(sorted_want, got), len(keys) - 1)
    cand = np.flatnonzero(sorted_want[at] == got)
    j = order[at[cand]]
    same = _same_bytes(raw, key_start[cand], key_len[cand], table, offsets[j], np.diff(offsets)[j])
    out[cand[same]] = j[same]
    distinct = len(set(keys))
    if distinct != len(np.unique(want)):  # two different wanted keys share a 64-bit hash: compare each
        out[:] = -1
        for index in reversed(range(len(keys))):
            k = np.frombuffer(keys[index] + bytes(STRING_PAD), dtype=np.uint8)
            hit = _same_bytes(raw, key_start, key_len, k, np.zeros(len(key_start), dtype=np.int64),
                              np.full(len(key_start), len(keys[index]), dtype=np.int64))
            out[hit] = index
    return out


def _same_bytes(
    a: npt.NDArray[np.uint8], a_start: Ints, a_len: Ints, b: npt.NDArray[np.uint8], b_start: Ints, b_len: Ints
) -> npt.NDArray[np.bool_]:
    """Whether ``a[a_start:+a_len] == b[b_start:+b_len]`` for each pair (both buffers padded by STRING_PAD)."""
    same: npt.NDArray[np.bool_] = a_len == b_len
    words_a = np.ndarray((len(a) - 7,), dtype="<u8", buffer=a.data, strides=(1,))
    words_b = np.ndarray((len(b) - 7,), dtype="<u8", buffer=b.data, strides=(1,))
    for k in range(int((a_len.max() + 7) // 8) if a_len.size else 0):
        mask = BYTE_MASK[np.clip(a_len - 8 * k, 0, 8)]
        pos_a = np.minimum(a_start + 8 * k, len(words_a) - 1)
        pos_b = np.minimum(b_start + 8 * k, len(words_b) - 1)
        same &= (words_a[pos_a] & mask) == (words_b[pos_b] & mask)
    return same


@dataclass
class Grid:
    """Wanted entries on a grid of ``k`` keys x ``n`` records (slot ``j * n + r``), see :func:`place_entries`.

    Attributes:
        kind: int8 ``[k * n]``: the entry's list kind, 0 where the record has no entry for the key.
        p0, p1: int64 ``[k * n]``: where the entry has the wanted kind, the byte range of
            its values (packed payload of a numeric list, body of a BytesList); else 0, 0.
        decoded: bool per entry: placed with its values (the others are still to be checked).
    """

    kind: npt.NDArray[np.int8]
    p0: Ints
    p1: Ints
    decoded: npt.NDArray[np.bool_]


def place_entries(raw: npt.NDArray[np.uint8], entries: Entries, match: Ints, want: Ints, n: int) -> Grid | None:
    """Lays the wanted entries (``match >= 0``, from :func:`match_keys`) on a key x record grid.

    ``want[j]`` is the list kind wanted for key ``j``.  None when the chunk needs
    the general decoder: a key repeated in a record, a numeric list that is not
    one packed field, a float payload that is not whole floats.
    """
    if NATIVE is not None:
        count = len(entries.rec)
        table = entries.table if entries.table is not None else np.stack(
            [entries.rec, entries.key_start, entries.key_len, entries.kind, entries.body_start, entries.body_end])
        grid = Grid(np.empty(len(want) * n, dtype=np.int8), np.empty(len(want) * n, dtype=np.int64),
                    np.empty(len(want) * n, dtype=np.int64), np.empty(count, dtype=np.bool_))
        status = NATIVE.place_entries(raw, table, count, match, want, n, grid.kind, grid.p0, grid.p1, grid.decoded.view(np.uint8))
        return None if status < 0 else grid
    return place_entries_numpy(raw, entries, match, want, n)


def place_entries_numpy(raw: npt.NDArray[np.uint8], entries: Entries, match: Ints, want: Ints, n: int) -> Grid | None:
    """:func:`place_entries` in numpy (no extension)."""
    found = np.flatnonzero(match >= 0)
    slot = match[found] * n + entries.rec[found]
    if found.size and int(np.bincount(slot).max()) > 1:
        return None  # a repeated map key: the general decoder applies last-wins
    size = len(want) * n
    kind = np.zeros(size, dtype=np.int8)
    kind[slot] = entries.kind[found]
    good = entries.kind[found] == want[match[found]]
    placed, at = found[good], slot[good]
    s0, s1 = entries.body_start[placed], entries.body_end[placed]
    numeric = (entries.kind[placed] != 1) & (s1 > s0)
    length, nb = varint_at(raw, s0 + 1)
    if np.any(numeric & ((read_bytes(raw, s0) != 0x0A) | (nb == 0) | (s0 + 1 + nb + length != s1))):
        return None  # not one packed field (unpacked elements, several runs, unknown fields...)
    if np.any(numeric & (entries.kind[placed] == 2) & (length % 4 != 0)):
        return None
    p0, p1 = np.zeros(size, dtype=np.int64), np.zeros(size, dtype=np.int64)
    p0[at], p1[at] = np.where(numeric, s0 + 1 + nb, s0), s1
    decoded = np.zeros(len(entries.rec), dtype=bool)
    decoded[placed] = True
    return Grid(kind, p0, p1, decoded)


def decode_varints(raw: npt.NDArray[np.uint8], p0: Ints, p1: Ints) -> tuple[Ints, Ints] | None:
    """Decodes packed varints in each byte range; returns (int64 values, count per range) or None if malformed."""
    if NATIVE is not None:
        values = np.empty(int((p1 - p0).sum()), dtype=np.int64)
        counts = np.empty(len(p0), dtype=np.int64)
        total = NATIVE.decode_varints(raw, p0, p1, values, counts)
        return None if total < 0 else (values[:total], counts)
    return decode_varints_numpy(raw, p0, p1)


def decode_varints_numpy(raw: npt.NDArray[np.uint8], p0: Ints, p1: Ints) -> tuple[Ints, Ints] | None:
    """:func:`decode_varints` in numpy (no extension)."""
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


def gather_floats(raw: npt.NDArray[np.uint8], p0: Ints, nbytes: Ints) -> npt.NDArray[np.float32]:
    """The little-endian float32 values in each byte range ``[p0, p0 + nbytes)`` (``nbytes % 4 == 0``), concatenated."""
    if NATIVE is not None:
        out = np.empty(int(nbytes.sum()) // 4, dtype=np.float32)  # the extension is little-endian only, like "<f4"
        NATIVE.copy_ranges(raw, p0, nbytes, out)
        return out
    floats = np.ndarray((len(raw) - 3,), dtype="<f4", buffer=raw.data, strides=(1,))
    return floats[gather_ranges(p0, nbytes // 4, step=4)].astype(np.float32)


def split_bytes_lists(raw: npt.NDArray[np.uint8], b0: Ints, b1: Ints) -> tuple[Ints, Ints, Ints] | None:
    """The items of the BytesList bodies ``raw[b0[i]:b1[i]]``: (item starts, item lengths, items per body).

    Each item must be ``0x0A``, a varint length of at most 5 bytes, the bytes;
    None if a body is not in that form.
    """
    if NATIVE is not None:
        cap = int((b1 - b0).sum()) // 2  # every item takes at least 2 bytes
        starts, lengths = np.empty(cap, dtype=np.int64), np.empty(cap, dtype=np.int64)
        counts = np.empty(len(b0), dtype=np.int64)
        total = NATIVE.split_bytes_lists(raw, b0, b1, starts, lengths, counts)
        return None if total < 0 else (starts[:total], lengths[:total], counts)
    return split_bytes_lists_numpy(raw, b0, b1)


def split_bytes_lists_numpy(raw: npt.NDArray[np.uint8], b0: Ints, b1: Ints) -> tuple[Ints, Ints, Ints] | None:
    """:func:`split_bytes_lists` in numpy: one round per item position, over the bodies that still have items."""
    counts = np.zeros(len(b0), dtype=np.int64)
    body = np.flatnonzero(b1 > b0)
    cur, end = b0[body], b1[body]
    found: list[tuple[Ints, Ints, Ints]] = []
    while body.size:
        size, nb = varint_at(raw, cur + 1)
        item = cur + 1 + nb
        if np.any((read_bytes(raw, cur) != 0x0A) | (nb == 0) | (size > end - item)):
            return None
        found.append((body, item, size))
        counts[body] += 1
        cur = item + size
        more = cur < end
        body, cur, end = body[more], cur[more], end[more]
    if not found:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, counts
    owner, starts, lengths = (np.concatenate([f[i] for f in found]) for i in range(3))
    order = np.argsort(owner, kind="stable")  # body by body, items in order
    return starts[order], lengths[order], counts
