"""Criteo TSV: ``label, I1..I13, C1..C26`` separated by tabs, one example per line.

Each line becomes one example with 13 dense and 26 sparse features:

* ``I1`` .. ``I13`` (integers ``[+-]?digits``, may be negative): dense
  features, float32 ``[n]`` each, ``float32(sign(v) * log1p(|v|))`` computed in
  float64 (it tames the heavy tails of the counts); a missing (empty) field is 0.0.
* ``C1`` .. ``C26`` (any bytes; Criteo's are 8 hex digits, not decoded):
  sparse features, each with exactly one id per example and value 1.0, in its
  own id space ``[0, num_features)`` (or, with ``num_features = 0``, raw
  64-bit ids: see below).

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

``num_features = 0`` means *raw ids*, for dynamic embedding tables whose rows
are keyed by the id itself: no modulo, the id is all 64 bits of ``h`` read as
an int64 (two's complement, ``h.view(np.int64)``), so ids span the whole int64
range, negative ones included (about half of them).  A missing field's id is
``splitmix64(~salt)`` read the same way.  Nothing else changes.  A negative
``num_features`` raises ValueError.

The label must be ``0`` or ``1``.  A line with a number of fields other than
40, a bad label or a bad integer is a malformed record.

Two implementations give the same results, bit for bit (see
:mod:`~psflow.data.native`): the C kernel ``criteo_lines`` of
``psflow.data._native`` walks each line once (fields, label, integers, hashes
and ids in one pass, a fraction of the CPU), and the numpy twin below
vectorizes over all lines and fields.  The C path leaves only the dense
values (a table lookup) and the wording of the errors (the twin, run on the
bad lines alone) to numpy.
"""

from __future__ import annotations

import functools
import operator

import numpy as np
import numpy.typing as npt

from psflow.data.batch import Batch, SparseColumn
from psflow.data.features import signed_log1p
from psflow.data.hashing import hash_strings, name_salt, splitmix64
from psflow.data.libsvm import TextParse
from psflow.data.native import NATIVE
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
# criteo_lines' per-line status: 0 good, 1 blank, >= 2 malformed (see psflow/data/_native.c).
_GOOD, _BLANK = 0, 1
# The C path looks the dense values of the integers -_DENSE_REACH < v < _DENSE_REACH up in a table.
_DENSE_REACH = 1 << 16


def missing_ids(num_features: int) -> npt.NDArray[np.int64]:
    """The id of a missing value in each of ``C1`` .. ``C26`` (``num_features = 0``: the raw 64-bit id)."""
    return _fold(_MISSING.copy(), _check_num_features(num_features))  # a copy: never a view of _MISSING


def _check_num_features(num_features: int) -> int:
    """``num_features`` as an int; refuses a negative one (0 is raw ids, see the module docstring)."""
    num_features = operator.index(num_features)
    if num_features < 0:
        raise ValueError(f"Criteo num_features must be >= 1, or 0 for raw 64-bit ids; got {num_features}")
    return num_features


def _fold(hashes: npt.NDArray[np.uint64], num_features: int) -> npt.NDArray[np.int64]:
    """The ids of 64-bit hashes: ``hashes % num_features``, or with ``num_features = 0`` the hashes' bits as int64."""
    if num_features == 0:
        return hashes.view(np.int64)
    return (hashes % np.uint64(num_features)).astype(np.int64)


def parse_criteo(data: bytes, num_features: int, newlines: npt.NDArray[np.int64] | None = None) -> TextParse:
    """Parses Criteo lines; ``data`` must end with a newline (or be empty).

    Blank lines are skipped.  Runs the C kernel when ``psflow.data._native``
    is built (and ``PSFLOW_NATIVE`` is not ``0``), else the numpy twin: both
    give the same batch, rows and errors, bit for bit.

    Args:
        data: complete lines.
        num_features: size of each categorical column's id space; 0 for raw
            ids (the full 64-bit hashes as int64, no modulo; see the module
            docstring).
        newlines: positions of the newlines in ``data``, if already known.

    Raises:
        ValueError: ``num_features`` is negative.
    """
    num_features = _check_num_features(num_features)
    if NATIVE is not None:
        return _parse_native(data, num_features, newlines)
    return _parse_numpy(data, num_features, newlines)


def _parse_native(data: bytes, num_features: int, newlines: npt.NDArray[np.int64] | None) -> TextParse:
    """:func:`parse_criteo` by the C kernel: one pass over each line; the numpy twin names the bad lines."""
    assert NATIVE is not None
    if newlines is not None:
        newlines = np.ascontiguousarray(newlines, dtype=np.int64)
    n = NATIVE.count_newlines(data) if newlines is None else len(newlines)
    labels = np.empty(n, dtype=np.float32)
    ints = np.empty((NUM_INT_COLUMNS, n), dtype=np.int64)
    ids = np.empty((NUM_CAT_COLUMNS, n), dtype=np.int64)
    status = np.empty(n, dtype=np.int8)
    good = NATIVE.criteo_lines(data, newlines, _CAT_SALTS, num_features, labels, ints, ids, status)
    batch = _to_batch(labels[:good], _dense_by_table(ints[:, :good]), ids[:, :good])
    bad = np.flatnonzero(status > _BLANK)
    errors = _name_bad_lines(data, num_features, newlines, bad) if bad.size else []
    return TextParse(batch, np.flatnonzero(status == _GOOD), errors)


def _name_bad_lines(
    data: bytes, num_features: int, newlines: npt.NDArray[np.int64] | None, bad: npt.NDArray[np.int64]
) -> list[tuple[int, str]]:
    """The errors of the lines ``bad`` (indices among the lines of ``data``), as the numpy twin words them."""
    if newlines is None:
        newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    ends = newlines[bad]
    starts = np.where(bad > 0, newlines[np.maximum(bad - 1, 0)] + 1, 0)
    lines = [data[s:e] + b"\n" for s, e in zip(starts.tolist(), ends.tolist(), strict=True)]
    parsed = _parse_numpy(b"".join(lines), num_features, np.cumsum([len(line) for line in lines], dtype=np.int64) - 1)
    if parsed.rows.size or len(parsed.errors) != bad.size:
        raise RuntimeError("psflow.data._native.criteo_lines and the numpy parser disagree on which lines are malformed")
    return [(int(bad[i]), message) for i, message in parsed.errors]


@functools.cache
def _dense_table() -> npt.NDArray[np.float32]:
    """``signed_log1p(v)`` at ``v + _DENSE_REACH`` for ``|v| < _DENSE_REACH``; NaN at both ends (look those up by the formula)."""
    table = np.full(2 * _DENSE_REACH + 1, np.nan, dtype=np.float32)
    table[1:-1] = signed_log1p(np.arange(1 - _DENSE_REACH, _DENSE_REACH, dtype=np.int64))
    return table


def _dense_by_table(ints: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
    """``signed_log1p(ints)``, bit for bit, by one table lookup per value instead of a log1p: the table holds
    signed_log1p's own results.  Values out of the table's reach go through signed_log1p.  (A missing value, 0 here,
    gets 0.0, as in the twin.)"""
    index = np.clip(ints, -_DENSE_REACH, _DENSE_REACH)
    index += _DENSE_REACH
    dense = _dense_table()[index]
    far = np.isnan(dense)
    if far.any():
        dense[far] = signed_log1p(ints[far])
    return dense


def _parse_numpy(data: bytes, num_features: int, newlines: npt.NDArray[np.int64] | None) -> TextParse:
    """:func:`parse_criteo` in numpy, vectorized over all lines and fields."""
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
    labels = (label_char[keep] == ord("1")).astype(np.float32)
    batch = _to_batch(labels, np.ascontiguousarray(ints[keep].T), np.ascontiguousarray(ids.T))
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
    dense = np.zeros(present.shape, dtype=np.float32)
    dense[present] = signed_log1p(values)
    valid: npt.NDArray[np.bool_] = np.all(ok_matrix, axis=1)
    return dense, valid


def _hash_cat_columns(buf: Buffer, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64], num_features: int) -> npt.NDArray[np.int64]:
    """Ids ``[m, 26]`` of the categorical fields (see the module docstring; ``num_features = 0``: raw ids)."""
    s, e = starts[:, _CAT_COLS], ends[:, _CAT_COLS]
    hashes = hash_strings(buf.raw, s.ravel(), (e - s).ravel(), np.broadcast_to(_CAT_SALTS, s.shape).ravel()).reshape(s.shape)
    hashes = np.where(e > s, hashes, _MISSING)  # an empty field is missing
    return _fold(hashes, num_features)


def _to_batch(labels: npt.NDArray[np.float32], dense: npt.NDArray[np.float32], ids: npt.NDArray[np.int64]) -> Batch:
    """The batch of ``n`` lines from their labels, ``dense`` ``[13, n]`` and ``ids`` ``[26, n]`` (each row contiguous)."""
    n = labels.shape[0]
    indptr = np.arange(n + 1, dtype=np.int64)
    ones = np.ones(n, dtype=np.float32)
    sparse = {name: SparseColumn(indptr, ids[j], ones) for j, name in enumerate(CAT_FEATURES)}
    return Batch(labels, sparse, {name: dense[j] for j, name in enumerate(INT_FEATURES)})


def _field(data: bytes, start: np.int64, end: np.int64) -> str:
    return data[int(start) : int(end)][:40].decode("utf-8", "replace")
