"""LIBSVM text: ``<label> <id>:<value> <id>:<value> ...``, one example per line.

Rules (the fast vectorized parser and the line-by-line fallback agree on them):

* Tokens are separated by runs of spaces or tabs; ``\\r`` before the newline
  and trailing spaces are allowed; blank lines are skipped (they still count
  as lines for error messages and sharding).
* The label is any finite number; it becomes 1.0 if ``> 0`` and 0.0
  otherwise, so ``+1/-1`` and ``1/0`` files read the same. A binary model
  (:mod:`~psflow.data.labels`) accepts only -1, 0 and +1: the readers refuse
  other labels as bad records.
* ``id`` is a non-negative decimal integer below 2**63, kept as is (LIBSVM's
  1-based ids are *not* shifted); ``value`` is a finite number within
  float32's range (values are stored as float32: ``3:1e39`` would become
  infinity, so it is malformed).  Explicit zeros are kept as entries with
  value 0.  Ids need not be sorted or unique.
* ``qid:<n>`` tokens (ranking files) and comments are rejected as malformed:
  this reader is for classification data.

A malformed line is reported with its 1-based line number.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from psflow.data.batch import Batch
from psflow.data.text import FLOAT32_OVERFLOW, Buffer, overflows_float32, parse_float_token, parse_floats, parse_uints

__all__ = ["TextParse", "parse_libsvm"]

_WHITESPACE = bytes.maketrans(b"\t\r\x0b\x0c", b"    ")
_COLON = ord(":")


@dataclass
class TextParse:
    """Result of parsing complete lines.

    Attributes:
        batch: the good, non-blank lines, in order.
        rows: int64 ``[batch.num_examples]``: index (among the given lines) of each row's line.
        errors: ``(line index among the given lines, message)`` for each malformed line.
        raw_labels: LIBSVM: each row's label as written (float64), before it is read as 0.0/1.0;
            None where the batch's labels are as written.
    """

    batch: Batch
    rows: npt.NDArray[np.int64]
    errors: list[tuple[int, str]]
    raw_labels: npt.NDArray[np.float64] | None = None


def parse_libsvm(data: bytes, newlines: npt.NDArray[np.int64] | None = None) -> TextParse:
    """Parses LIBSVM lines; ``data`` must end with a newline (or be empty).

    Vectorized: no Python work per token unless some line is malformed or
    unusual, in which case the whole buffer is parsed line by line.

    Args:
        data: complete lines.
        newlines: positions of the newlines in ``data``, if already known.
    """
    fast = _parse_fast(data, newlines) if data else None
    return fast if fast is not None else _parse_slow(data)


def _parse_fast(data: bytes, newlines: npt.NDArray[np.int64] | None = None) -> TextParse | None:
    if b"\t" in data or b"\r" in data or b"\x0b" in data or b"\x0c" in data:
        data = data.translate(_WHITESPACE)
    buf = Buffer.of(data)
    a = buf.raw[: len(data)]
    if newlines is None:
        newlines = np.flatnonzero(a == 10)
    if np.count_nonzero(a < 32) != newlines.size:
        return None
    word = a > 32
    word &= a != _COLON
    edges = np.flatnonzero(word[1:] != word[:-1]) + 1
    if word[0]:
        edges = np.concatenate([np.zeros(1, dtype=np.int64), edges])
    fs, fe = edges[0::2], edges[1::2]
    fields_before = np.searchsorted(fs, newlines)
    first = np.concatenate([np.zeros(1, dtype=np.int64), fields_before[:-1]])
    count = fields_before - first
    is_id = a[fe] == _COLON
    ids_at = np.flatnonzero(is_id)
    if np.count_nonzero(a == _COLON) != ids_at.size:
        return None  # a colon that does not end an id
    values_at = ids_at + 1
    if ids_at.size and (values_at[-1] >= fs.size or np.any(fs[values_at] != fe[ids_at] + 1) or is_id[values_at].any()):
        return None
    nonblank = np.flatnonzero(count > 0)
    label_at = first[nonblank]
    per_line = np.diff(np.searchsorted(fe[ids_at], newlines), prepend=0)[nonblank]
    if is_id[label_at].any() or is_id[fields_before[nonblank] - 1].any() or np.any(count[nonblank] != 2 * per_line + 1):
        return None
    labels = parse_floats(buf, fs[label_at], fe[label_at])
    ids, ids_ok = parse_uints(buf, fs[ids_at], fe[ids_at])
    if labels is None or not ids_ok.all():
        return None
    vs, ve = fs[values_at], fe[values_at]
    if np.all(ve - vs == 1) and np.all(a[vs] == ord("1")):
        values = np.ones(vs.size, dtype=np.float32)
    else:
        parsed = parse_floats(buf, vs, ve)
        if parsed is None or overflows_float32(parsed).any():
            return None  # the line-by-line parser names the line
        values = parsed.astype(np.float32)
    indptr = np.zeros(nonblank.size + 1, dtype=np.int64)
    np.cumsum(per_line, out=indptr[1:])
    batch = Batch.from_csr((labels > 0).astype(np.float32), indptr, ids, values)
    return TextParse(batch, nonblank.astype(np.int64), [], labels)


def _parse_line(line: bytes) -> tuple[float, list[int], list[float]] | None:
    """Parses one line; None if blank.  Raises ValueError with the reason."""
    tokens = line.split()
    if not tokens:
        return None
    label = parse_float_token(tokens[0])
    if label is None:
        raise ValueError(f"bad label {tokens[0].decode('utf-8', 'replace')!r} (want a finite number)")
    ids: list[int] = []
    values: list[float] = []
    for token in tokens[1:]:
        id_text, colon, value_text = token.partition(b":")
        shown = token.decode("utf-8", "replace")
        if id_text == b"qid":
            raise ValueError(f"qid tokens are not supported: {shown!r}")
        if not colon or not id_text.isdigit() or b":" in value_text:
            raise ValueError(f"malformed token {shown!r} (want <id>:<value>)")
        feature_id = int(id_text)
        if feature_id >= 1 << 63:
            raise ValueError(f"feature id {id_text.decode()} is too large (max 2**63 - 1)")
        value = parse_float_token(value_text)
        if value is None:
            raise ValueError(f"bad value in token {shown!r} (want a finite number)")
        if abs(value) >= FLOAT32_OVERFLOW:
            raise ValueError(f"value in token {shown!r} overflows float32 (feature values are stored as float32; "
                             f"largest finite: {float(np.finfo(np.float32).max):.8g})")
        ids.append(feature_id)
        values.append(value)
    return label, ids, values


def _parse_slow(data: bytes) -> TextParse:
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    labels: list[float] = []
    ids: list[int] = []
    values: list[float] = []
    counts: list[int] = []
    rows: list[int] = []
    errors: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        try:
            parsed = _parse_line(line)
        except ValueError as e:
            errors.append((i, str(e)))
            continue
        if parsed is None:
            continue
        labels.append(parsed[0])
        ids.extend(parsed[1])
        values.extend(parsed[2])
        counts.append(len(parsed[1]))
        rows.append(i)
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    raw = np.asarray(labels, dtype=np.float64)
    batch = Batch.from_csr((raw > 0).astype(np.float32), indptr, ids, values)
    return TextParse(batch, np.asarray(rows, dtype=np.int64), errors, raw)
