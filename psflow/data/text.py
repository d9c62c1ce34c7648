"""Vectorized number parsing on byte buffers, shared by the text formats.

Fields are given as (start, end) byte ranges into a buffer; integers are read
eight digits at a time from unaligned 64-bit loads (SWAR), so a field costs a
few numpy operations, whatever its length up to 16 digits.  The numeric
syntax accepted everywhere (fast and slow paths alike) is::

    integer:  [+-]? digits
    float:    [+-]? (digits [. digits?] | . digits) ([eE] [+-]? digits)?

and the value must be finite.  A value stored as float32 (a feature value,
not a label) must also be within float32's range: a value that rounds to
infinity in float32 (``|v| >= FLOAT32_OVERFLOW``, e.g. ``1e39``) is refused
by its parser, naming the line, rather than surfacing later as a NaN loss.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["Buffer", "parse_uints", "parse_ints", "parse_floats", "parse_float_token", "FLOAT_RE", "FLOAT32_OVERFLOW",
           "overflows_float32"]

FLOAT_RE = re.compile(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")

#: The smallest magnitude that rounds to infinity in float32 (round to nearest even): float32's largest
#: finite value (2**128 - 2**104) plus half its ulp. Exact in float64.
FLOAT32_OVERFLOW = 2.0**128 - 2.0**103

_U = np.uint64
_ZEROS_FILL = np.array([int.from_bytes(b"0" * (8 - n) + b"\0" * n, "little") for n in range(9)], dtype=np.uint64)
_HI = _U(0xF0F0F0F0F0F0F0F0)
_SIX = _U(0x0606060606060606)
_THREES = _U(0x3333333333333333)


@dataclass
class Buffer:
    """A byte buffer viewed as bytes and as unaligned little-endian uint64 words.

    ``words[i]`` is the 8 bytes starting at byte ``i``; the buffer is padded
    with 8 zero bytes so every byte of the original has a word.
    """

    data: bytes
    raw: npt.NDArray[np.uint8]
    words: npt.NDArray[np.uint64]

    @staticmethod
    def of(data: bytes) -> Buffer:
        """Wraps ``data`` (copied once, to add the padding)."""
        raw = np.frombuffer(data + bytes(8), dtype=np.uint8)
        words = np.ndarray((len(data) + 1,), dtype="<u8", buffer=raw.data, strides=(1,))
        return Buffer(data, raw, words)


def _eight_digits(words: npt.NDArray[np.uint64], lengths: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.bool_]]:
    """Parses the first ``lengths`` (1..8) bytes of each word as decimal digits."""
    w = (words << ((8 - lengths) * 8).astype(np.uint64)) | _ZEROS_FILL[lengths]
    ok = ((w & _HI) | (((w + _SIX) & _HI) >> _U(4))) == _THREES
    w = ((w & _U(0x0F0F0F0F0F0F0F0F)) * _U(2561)) >> _U(8)
    w = ((w & _U(0x00FF00FF00FF00FF)) * _U(6553601)) >> _U(16)
    w = ((w & _U(0x0000FFFF0000FFFF)) * _U(42949672960001)) >> _U(32)
    return w, ok


def parse_uints(
    buf: Buffer, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Parses each field ``buf[start:end]`` as an unsigned decimal of 1 to 16 digits.

    Returns:
        (values, ok); ``ok`` is False for fields that are empty, longer than
        16 bytes, or hold a non-digit (their value is garbage).
    """
    lengths = ends - starts
    short = np.minimum(lengths, 8)
    value, ok = _eight_digits(buf.words[starts], np.maximum(short, 1))
    ok &= (lengths >= 1) & (lengths <= 16)
    long = np.flatnonzero(lengths > 8)
    if long.size:
        hi_len = np.clip(lengths[long] - 8, 1, 8)
        hi, ok_hi = _eight_digits(buf.words[starts[long]], hi_len)
        lo, ok_lo = _eight_digits(buf.words[starts[long] + hi_len], np.full(long.size, 8, dtype=np.int64))
        value[long] = hi * _U(100_000_000) + lo
        ok[long] &= ok_hi & ok_lo
    return value.astype(np.int64), ok


def parse_ints(
    buf: Buffer, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """Like :func:`parse_uints` with an optional leading ``+`` or ``-``."""
    first = buf.raw[np.minimum(starts, len(buf.raw) - 1)]
    signed = (first == ord("-")) | (first == ord("+"))
    value, ok = parse_uints(buf, starts + signed, ends)
    value = np.where(first == ord("-"), -value, value)
    return value, ok


def overflows_float32(values: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Whether each (float64) value becomes infinite when stored as float32 (NaN: False)."""
    out: npt.NDArray[np.bool_] = np.abs(np.asarray(values, dtype=np.float64)) >= FLOAT32_OVERFLOW
    return out


def parse_float_token(token: bytes) -> float | None:
    """Parses one token with the module's float syntax; None if invalid or not finite."""
    if FLOAT_RE.fullmatch(token) is None:
        return None
    value = float(token)
    return value if np.isfinite(value) else None


def parse_floats(buf: Buffer, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]) -> npt.NDArray[np.float64] | None:
    """Parses each field as a finite float; None if any field is not one.

    Integer fields are parsed exactly by :func:`parse_ints`; the rest go
    through numpy's C float parser in one call.
    """
    first = buf.raw[np.minimum(starts, len(buf.raw) - 1)]
    negative = first == ord("-")
    unsigned, ok = parse_uints(buf, starts + (negative | (first == ord("+"))), ends)
    out = unsigned.astype(np.float64)
    np.negative(out, where=negative, out=out)  # "-0" is -0.0, as float() reads it
    rest = np.flatnonzero(~ok)
    if rest.size == 0:
        return out
    s, e = starts[rest], ends[rest]
    marks = np.zeros(len(buf.raw) + 1, dtype=np.int8)
    marks[s] += 1
    marks[e] -= 1
    inside = np.cumsum(marks[:-1], dtype=np.int8).astype(bool)
    text = np.where(inside, buf.raw, np.uint8(32)).astype(np.uint8).tobytes()
    # Reject what numpy's parser would take but our syntax does not (inf, nan, hex, ...).
    allowed = np.zeros(256, dtype=bool)
    allowed[list(b"0123456789+-.eE ")] = True
    if not allowed[np.frombuffer(text, dtype=np.uint8)].all():
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            parsed = np.fromstring(text, dtype=np.float64, sep=" ")
        except (ValueError, DeprecationWarning):
            return None
    if parsed.size != rest.size or not np.isfinite(parsed).all():
        return None
    out[rest] = parsed
    return out
