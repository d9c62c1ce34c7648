"""Array framing: how a request or reply travels as one byte string.

A frame is a small JSON header followed by raw little-endian array buffers::

    b"PSF1" | u32 header length (little-endian) | header (UTF-8 JSON) | pad to 8
    | array 0 bytes | pad to 8 | array 1 bytes | ...

The header is ``{"meta": {...}, "arrays": [[name, dtype, shape, offset, nbytes], ...]}``
with offsets relative to the start of the frame (the writer may pad it with
spaces so that the first array starts right after it). ``meta`` carries the call's
small fields (names, flags, scalars); arrays carry everything numeric.

Guarantees:
    * No pickle, no code: a frame holds JSON and raw numbers only; decoding
      never constructs anything but dicts, lists, strings, numbers and numpy
      arrays of the allowed dtypes.
    * Decoding validates every length, offset, dtype and shape against the
      frame before touching the data, and raises :class:`FrameError` (a
      ``ValueError``) describing the first problem; it never reads past the
      buffer and never allocates more than the frame's own size.
    * Decoded arrays are read-only zero-copy views of the frame's bytes; writable ones only where the caller
      owns a writable buffer and asks for them (``decode(..., writable=True)``: a client's reply).
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psflow import jsonio
from psflow.errors import PsflowError

__all__ = ["ALLOWED_DTYPES", "FrameError", "Frame", "encode", "encode_parts", "decode"]

MAGIC = b"PSF1"
_PREFIX = struct.Struct("<4sI")
_ALIGN = 8
MAX_DIMS = 8
# Guards the JSON parser against a hostile header; real headers are well under 64 KiB.
MAX_HEADER_BYTES = 1 << 20
_ZEROS = bytes(_ALIGN)  # an array's padding
# One encoder and decoder for every frame: json.dumps with separators builds a new encoder per call, and
# json.loads of bytes first detects their encoding (a header is UTF-8); each ~1 us of a small frame's ~3.
_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)
_DECODER = json.JSONDecoder()

#: dtypes that may cross the wire, by their little-endian numpy name.
ALLOWED_DTYPES: frozenset[str] = frozenset(
    {"<f4", "<f8", "<i8", "<i4", "<u8", "<u4", "|u1", "|i1", "|b1"}
)
_DTYPES = {name: np.dtype(name) for name in ALLOWED_DTYPES}


class FrameError(PsflowError, ValueError):
    """A byte string is not a well-formed frame."""


@dataclass
class Frame:
    """A decoded (or to-be-encoded) message: small JSON fields plus named arrays."""

    meta: dict[str, Any] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def _wire_array(name: str, array: np.ndarray) -> np.ndarray:
    arr = np.asarray(array)
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)  # (ascontiguousarray alone would turn 0-d into 1-d)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    if arr.dtype.str not in ALLOWED_DTYPES:
        raise FrameError(f"array {name!r}: dtype {arr.dtype} cannot travel on the wire")
    return arr


def encode(meta: Mapping[str, Any] | None = None, arrays: Mapping[str, np.ndarray] | None = None) -> bytes:
    """Encodes ``meta`` and ``arrays`` into one frame.

    Args:
        meta: JSON-serializable small fields; a NaN or infinite float is sent as null.
        arrays: named numpy arrays; non-contiguous ones are copied once.

    Returns:
        The frame bytes.

    Raises:
        FrameError: an array has a dtype outside :data:`ALLOWED_DTYPES`.
    """
    return b"".join(encode_parts(meta, arrays)[0])


def encode_parts(meta: Mapping[str, Any] | None = None,
                 arrays: Mapping[str, np.ndarray] | None = None) -> tuple[list[bytes | memoryview], int]:
    """The frame :func:`encode` gives, in pieces, and its length: what a carrier that gathers buffers (the TCP
    carrier's ``sendmsg``) sends without joining them into one copy first.

    Each array that is C-contiguous, little-endian and of an allowed dtype is a piece as it is (a view of its
    memory, not a copy): its bytes are read when the pieces are sent, so the caller must not change the array
    until then. Joined, the pieces are :func:`encode`'s bytes.

    Raises:
        FrameError: as :func:`encode`.
    """
    wire = [(name, _wire_array(name, a)) for name, a in (arrays or {}).items()]
    # The offsets depend on where the data starts, which depends on the header's length. The header
    # is written once: its length is bounded first (every offset given as many digits as the largest
    # possible one), the data laid out after that bound, and the header padded with spaces up to it
    # (JSON allows trailing whitespace), so the data needs no padding of its own.
    meta_json = _meta_json(meta or {})
    heads = [f"[{_json_string(name)},\"{arr.dtype.str}\",[{','.join(map(str, arr.shape))}]," for name, arr in wire]
    payload = sum(arr.nbytes + _pad(arr.nbytes) for _, arr in wire)
    fixed = _PREFIX.size + len(meta_json) + sum(len(h) + 2 + len(str(arr.nbytes)) for h, (_, arr) in zip(heads, wire, strict=True)) + 32
    digits = len(str(fixed + len(wire) * 20 + payload))
    data_start = fixed + len(wire) * (digits + 1)
    data_start += _pad(data_start)
    entries, pos = [], data_start
    for head, (_, arr) in zip(heads, wire, strict=True):
        entries.append(f"{head}{pos},{arr.nbytes}]")
        pos += arr.nbytes + _pad(arr.nbytes)
    header = f'{{"meta":{meta_json},"arrays":[{",".join(entries)}]}}'.encode()
    header_len = data_start - _PREFIX.size
    if len(header) > header_len:  # pragma: no cover - the bound above holds
        raise FrameError("internal framing error")
    parts: list[bytes | memoryview] = [_PREFIX.pack(MAGIC, header_len) + header + b" " * (header_len - len(header))]
    for _, arr in wire:
        if arr.nbytes:
            parts.append(arr.data.cast("B"))
        if _pad(arr.nbytes):
            parts.append(_ZEROS[: _pad(arr.nbytes)])
    return parts, data_start + payload


def _meta_json(meta: Mapping[str, Any]) -> str:
    """The header's meta as standard JSON: a NaN or infinite float (a diverged loss) travels as null
    (:mod:`psflow.jsonio`); the common all-finite meta costs one :func:`json.dumps`, as before."""
    try:
        return _ENCODER.encode(meta)
    except ValueError:
        return jsonio.dumps(meta, separators=(",", ":"))


_PLAIN = re.compile(r"[ !#-\[\]-~]*")  # printable ASCII but '"' and '\\': JSON strings as they are


def _json_string(name: str) -> str:
    """``json.dumps(name)``; array names are plain ASCII (``g/deep/emb_C1/part_0``): quoted as they are."""
    return f'"{name}"' if _PLAIN.fullmatch(name) else json.dumps(name)


def decode(buf: bytes | memoryview, *, writable: bool = False) -> Frame:
    """Decodes a frame produced by :func:`encode`.

    Args:
        buf: the frame bytes.
        writable: (a caller that owns ``buf`` and nothing else reads it, e.g. a reply it received) give
            writable views where ``buf`` is writable, which the caller may then use as its own arrays
            without copying them (their bytes must then come one after another, as :func:`encode` lays them
            out: no two share any); ``bytes`` stay read-only.

    Returns:
        The frame; its arrays are views into ``buf``, read-only unless ``writable``.

    Raises:
        FrameError: the bytes are not a valid frame (names what is wrong).
    """
    view = memoryview(buf)
    if len(view) < _PREFIX.size:
        raise FrameError(f"frame too short ({len(view)} bytes)")
    magic, header_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise FrameError(f"bad magic {bytes(magic)!r} (expected {MAGIC!r})")
    if header_len > MAX_HEADER_BYTES or _PREFIX.size + header_len > len(view):
        raise FrameError(f"header length {header_len} exceeds frame of {len(view)} bytes")
    try:
        header = _DECODER.decode(str(view[_PREFIX.size : _PREFIX.size + header_len], "utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise FrameError(f"header is not valid JSON: {e}") from e
    if not isinstance(header, dict) or not isinstance(header.get("meta"), dict):
        raise FrameError("header must be an object with a 'meta' object")
    specs = header.get("arrays")
    if not isinstance(specs, list):
        raise FrameError("header 'arrays' must be a list")
    data_start = _PREFIX.size + header_len
    arrays: dict[str, np.ndarray] = {}
    readonly = not writable or view.readonly
    end = data_start  # (writable) where the previous array's bytes end
    for spec in specs:
        name, arr = _decode_array(view, spec, data_start, readonly)
        if name in arrays:
            raise FrameError(f"array {name!r} appears twice")
        if not readonly:  # writable views are their caller's own arrays: no two may share bytes
            offset, nbytes = spec[3], spec[4]
            if offset < end:
                raise FrameError(f"array {name!r}: bytes {offset}..{offset + nbytes} overlap the previous array's "
                                 f"(which end at {end}): writable views must not share bytes")
            end = offset + nbytes
        arrays[name] = arr
    return Frame(meta=header["meta"], arrays=arrays)


def _decode_array(view: memoryview, spec: Any, data_start: int, readonly: bool) -> tuple[str, np.ndarray]:
    if not (isinstance(spec, list) and len(spec) == 5):
        raise FrameError(f"array entry {spec!r:.80} must be [name, dtype, shape, offset, nbytes]")
    name, dtype, shape, offset, nbytes = spec
    if not isinstance(name, str):
        raise FrameError(f"array name {name!r:.40} is not a string")
    if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:  # a list is unhashable: TypeError, not refused
        raise FrameError(f"array {name!r}: dtype {dtype!r:.20} not allowed")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_DIMS
        or not all(type(d) is int and d >= 0 for d in shape)
    ):
        raise FrameError(f"array {name!r}: bad shape {shape!r:.80}")
    if type(offset) is not int or type(nbytes) is not int or offset < data_start or nbytes < 0:
        raise FrameError(f"array {name!r}: bad offset/nbytes {offset!r:.20}/{nbytes!r:.20}")
    if offset + nbytes > len(view):
        raise FrameError(f"array {name!r}: bytes {offset}..{offset + nbytes} beyond frame of {len(view)} bytes")
    dt = _DTYPES[dtype]
    count = 1
    for d in shape:
        count *= d
    if count * dt.itemsize != nbytes:
        raise FrameError(f"array {name!r}: shape {tuple(shape)} of {dt} needs {count * dt.itemsize} bytes, frame says {nbytes}")
    if offset % dt.itemsize:
        raise FrameError(f"array {name!r}: offset {offset} not aligned to {dt.itemsize}")
    arr = np.frombuffer(view, dtype=dt, count=count, offset=offset).reshape(shape)
    if readonly:
        arr.flags.writeable = False
    return name, arr
