"""Criteo TSV: ``label, I1..I13, C1..C26`` separated by tabs, one example per line.

Each line becomes one example with 13 dense and 26 sparse features:

* ``I1`` .. ``I13`` (integers ``[+-]?digits``, may be negative): dense
  features, float32 ``[n]`` each, ``float32(sign(v) * log1p(|v|))`` computed in
  float64 (it tames the heavy tails of the counts); a missing (empty) field is 0.0.
* ``C1`` .. ``C26`` (any bytes; Criteo's are 8 hex digits, not decoded):
  sparse features, each with exactly one id per example and value 1.0, in its
  own id space ``[0, num_features)``.

Ids are stable across runs, machines and numpy versions: they are defined by
the arithmetic of :mod:`~psflow.data.hashing` (``splitmix64``, ``name_salt``,
``hash_strings``), on unsigned 64-bit integers, wrapping.  For column ``Ck``
with ``salt = name_salt("Ck")``:

* a value ``s``: ``h = hash_strings(s, salt)``, i.e. ``h = salt``; for each
  8-byte little-endian word ``w`` of ``s`` (the last one zero-padded):
  ``h = splitmix64(h ^ w)``; then ``h = splitmix64(h ^ len(s))``;
* an empty field is missing: ``h = splitmix64(~salt)``, one "missing" id per
  column (it carries signal in CTR data; dropping it costs AUC).

The id is ``h % num_features``.  A value's id equals that of the same bytes in
a TFRecord string feature named ``Ck`` with ``hash_buckets = num_features``.

The label must be ``0`` or ``1``.  A line with a number of fields other than
40, a bad label or a bad integer is a malformed record.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from psflow.data.batch import Batch, SparseColumn
from psflow.data.hashing import hash_strings, name_salt, splitmix64
from psflow.data.libsvm import TextParse
from psflow.data.text import Buffer, parse_ints

__all__ = ["NUM_INT_COLUMNS", "NUM_CAT_COLUMNS", "INT_FEATURES", "CAT_FEATURES", "parse_criteo", "missing_ids"]

NUM_INT_COLUMNS = 13
NUM_CAT_COLUMNS = 26
#: Dense feature names, in line order.
INT_FEATURES = tuple(f"I{k}" for k in range(1, NUM_INT_COLUMNS + 1))
#: Sparse feature names, in line order.
CAT_FEATURES = tuple(f"C{k}" for k in range(1, NUM_CAT_COLUMNS + 1))
_FIELDS = 1 + NUM_INT_COLUMNS + NUM_CAT_COLUMNS
_INT_COLS = slice(1, 1 + NUM_INT_COLUMNS)
_CAT_COLS = slice(1 + NUM_INT_COLUMNS, _FIELDS)
_CAT_SALTS = np.array([name_salt(name) for name in CAT_FEATURES], dtype=np.uint64)
_MISSING = splitmix64(~_CAT_SALTS)


def missing_ids(num_features: int) -> npt.NDArray[np.int64]:
    """The id of a missing value in each of ``C1`` .. ``C26``."""
    return (_MISSING % np.uint64(num_features)).astype(np.int64)


def parse_criteo(data: bytes, num_features: int, newlines: npt.NDArray[np.int64] | None = None) -> TextParse:
    """Parses Criteo lines; ``data`` must end with a newline (or be empty).

    Blank lines are skipped.  Vectorized over all lines and fields.

    Args:
        data: complete lines.
        num_features: size of each categorical column's id space.
        newlines: positions of the newlines in ``data``, if already known.
    """
    buf = Buffer.of(data)
    a = buf.raw[: len(data)]
    if newlines is None:
        newlines = np.flatnonzero(a == 10)
    good, starts, ends, errors = _split_fields(a, newlines)
    reasons: dict[int, str] = {}
    label_char = a[np.minimum(starts[:, 0], len(a) - 1)]
    bad = _check_labels(data, starts, ends, label_char, reasons)
    ints, int_ok = _parse_int_columns(data, buf, starts, ends, reasons)
    bad |= ~int_ok
    keep = ~bad
    ids = _hash_cat_columns(buf, starts[keep], ends[keep], num_features)
    batch = _to_batch((label_char[keep] == ord("1")).astype(np.float32), ints[keep], ids)
    errors.extend((int(good[row]), reason) for row, reason in reasons.items())
    errors.sort()
    return TextParse(batch, good[keep].astype(np.int64), errors)


def _split_fields(
    a: npt.NDArray[np.uint8], newlines: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], list[tuple[int, str]]]:
    """Lines with 40 fields: (their line indices, field starts [m, 40], field ends [m, 40], errors of the others)."""
    tabs = np.flatnonzero(a == 9)
    line_start = np.concatenate([np.zeros(1, dtype=np.int64), newlines[:-1] + 1])[: len(newlines)]
    tabs_before = np.searchsorted(tabs, newlines)
    tab_count = np.diff(tabs_before, prepend=0)
    blank = newlines == line_start
    errors = [
        (int(i), f"has {int(tab_count[i]) + 1} tab-separated fields, want {_FIELDS}")
        for i in np.flatnonzero((tab_count != _FIELDS - 1) & ~blank)
    ]
    good = np.flatnonzero(tab_count == _FIELDS - 1)
    t = tabs[(tabs_before[good] - (_FIELDS - 1))[:, None] + np.arange(_FIELDS - 1)]
    starts = np.concatenate([line_start[good][:, None], t + 1], axis=1)
    ends = np.concatenate([t, newlines[good][:, None]], axis=1)
    return good, starts, ends, errors


def _check_labels(
    data: bytes, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], label_char: npt.NDArray[np.uint8], reasons: dict[int, str]
) -> npt.NDArray[np.bool_]:
    bad_label: npt.NDArray[np.bool_] = (ends[:, 0] - starts[:, 0] != 1) | ((label_char != ord("0")) & (label_char != ord("1")))
    for row in np.flatnonzero(bad_label).tolist():
        reasons[row] = f"bad label {_field(data, starts[row, 0], ends[row, 0])!r} (want 0 or 1)"
    return bad_label


def _parse_int_columns(
    data: bytes, buf: Buffer, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], reasons: dict[int, str]
) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
    """The dense values ``[m, 13]`` (missing: 0.0) and whether each line's integers are all valid."""
    s, e = starts[:, _INT_COLS], ends[:, _INT_COLS]
    present = e > s
    values, ok = parse_ints(buf, s[present], e[present])
    ok_matrix = np.ones(present.shape, dtype=bool)
    ok_matrix[present] = ok
    for row, col in zip(*np.nonzero(~ok_matrix), strict=True):
        reasons.setdefault(int(row), f"column I{col + 1}: bad integer {_field(data, s[row, col], e[row, col])!r}")
    v = values.astype(np.float64)
    dense = np.zeros(present.shape, dtype=np.float32)
    dense[present] = (np.sign(v) * np.log1p(np.abs(v))).astype(np.float32)
    valid: npt.NDArray[np.bool_] = np.all(ok_matrix, axis=1)
    return dense, valid


def _hash_cat_columns(buf: Buffer, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], num_features: int) -> npt.NDArray[np.int64]:
    """Ids ``[m, 26]`` of the categorical fields (see the module docstring)."""
    s, e = starts[:, _CAT_COLS], ends[:, _CAT_COLS]
    hashes = hash_strings(buf.raw, s.ravel(), (e - s).ravel(), np.broadcast_to(_CAT_SALTS, s.shape).ravel()).reshape(s.shape)
    hashes = np.where(e > s, hashes, _MISSING)  # an empty field is missing
    return (hashes % np.uint64(num_features)).astype(np.int64)


def _to_batch(labels: npt.NDArray[np.float32], dense: npt.NDArray[np.float32], ids: npt.NDArray[np.int64]) -> Batch:
    n = labels.shape[0]
    indptr = np.arange(n + 1, dtype=np.int64)
    ones = np.ones(n, dtype=np.float32)
    by_column = np.ascontiguousarray(ids.T)
    columns = np.ascontiguousarray(dense.T)
    sparse = {name: SparseColumn(indptr, by_column[j], ones) for j, name in enumerate(CAT_FEATURES)}
    return Batch(labels, sparse, {name: columns[j] for j, name in enumerate(INT_FEATURES)})


def _field(data: bytes, start: np.int64, end: np.int64) -> str:
    return data[int(start) : int(end)][:40].decode("utf-8", "replace")
