"""TFRecord files: framing, checksums, reading in chunks, writing.

A TFRecord file is a sequence of records, each::

    uint64  length           little-endian
    uint32  masked_crc32c(length bytes)
    byte    data[length]
    uint32  masked_crc32c(data)

where ``masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2**32)``
with ``c = crc32c(x)``.  A GZIP file (``TFRecordOptions(compression_type=
"GZIP")``) is that whole stream inside gzip; offsets below are offsets in the
uncompressed stream.

Guarantees:
    * Length checksums are always verified: framing depends on them.  A bad
      one, or a file that ends inside a record, is a :class:`BadRecordError`
      naming the record index and byte offset; nothing after it in that file
      can be read.
    * Data checksums are verified unless the caller opts out; a bad one spoils
      only its own record.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from types import TracebackType

import crc32c as _crc32c
import numpy as np
import numpy.typing as npt

from psflow.data.api import BadRecordError, DataError
from psflow.data.native import NATIVE
from psflow.data.source import BLOCK_SIZE, iter_blocks, resolve_compression

__all__ = [
    "masked_crc32c",
    "looks_like_tfrecord",
    "RecordChunk",
    "iter_record_chunks",
    "check_data_crcs",
    "read_records",
    "TFRecordWriter",
]

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_MASK_DELTA = 0xA282EAD8
_HEADER = 12  # length + length CRC
_OVERHEAD = 16  # header + data CRC


def masked_crc32c(data: bytes | memoryview) -> int:
    """Returns the masked CRC32C that TFRecord stores for ``data``."""
    crc = int(_crc32c.crc32c(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _mask(crc: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    return (((crc >> np.uint64(15)) | (crc << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(0xFFFFFFFF)


def _make_table() -> npt.NDArray[np.uint64]:
    table = np.arange(256, dtype=np.uint64)
    for _ in range(8):
        table = np.where(table & np.uint64(1), (table >> np.uint64(1)) ^ np.uint64(0x82F63B78), table >> np.uint64(1))
    return table


_CRC_TABLE = _make_table()


def _masked_crc_of_u64s(raw: npt.NDArray[np.uint8]) -> npt.NDArray[np.uint64]:
    """Masked CRC32C of each row of an ``[n, 8]`` byte matrix (vectorized)."""
    crc = np.full(raw.shape[0], 0xFFFFFFFF, dtype=np.uint64)
    for j in range(raw.shape[1]):
        crc = _CRC_TABLE[(crc ^ raw[:, j]) & np.uint64(0xFF)] ^ (crc >> np.uint64(8))
    return _mask(crc ^ np.uint64(0xFFFFFFFF))


def looks_like_tfrecord(head: bytes) -> bool:
    """True if ``head`` starts with a TFRecord header whose length checksum is right."""
    if len(head) < _HEADER:
        return False
    return masked_crc32c(head[:8]) == int(_U32.unpack_from(head, 8)[0])


@dataclass
class RecordChunk:
    """Complete records from one stretch of a TFRecord file.

    Attributes:
        buf: the bytes holding the records (plus possibly more after them).
        data_starts: int64 ``[n]``: where each record's data starts in ``buf``.
        lengths: int64 ``[n]``: data lengths.
        offsets: int64 ``[n]``: each record's header offset in the file.
        record_index: int64 ``[n]``: each record's 0-based index in the file.
        end_offset: file offset just after the last record.
        end_record: index of the record after the last one.
        eof: no record follows in the file.
    """

    buf: bytes
    data_starts: npt.NDArray[np.int64]
    lengths: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    record_index: npt.NDArray[np.int64]
    end_offset: int
    end_record: int
    eof: bool


def _frame(buf: bytes) -> tuple[npt.NDArray[np.int64], int]:
    """Walks record headers; returns header positions of complete records and the end of the last."""
    if NATIVE is not None:
        heads = np.empty(len(buf) // _OVERHEAD + 1, dtype=np.int64)
        n, end = NATIVE.frame(buf, heads)
        return heads[:n], int(end)
    return _frame_numpy(buf)


def _frame_numpy(buf: bytes) -> tuple[npt.NDArray[np.int64], int]:
    """:func:`_frame` in Python (no extension)."""
    unpack = _U64.unpack_from
    heads: list[int] = []
    append = heads.append
    pos = 0
    size = len(buf)
    while size - pos >= _HEADER:
        end = pos + _OVERHEAD + unpack(buf, pos)[0]
        if end > size:
            break
        append(pos)
        pos = end
    return np.asarray(heads, dtype=np.int64), pos


def iter_record_chunks(
    path: str,
    compression: str = "auto",
    start_offset: int = 0,
    start_record: int = 0,
    block_size: int = BLOCK_SIZE,
) -> Iterator[RecordChunk]:
    """Yields the records of a TFRecord file from ``start_offset`` on, in chunks.

    ``start_offset`` must be a record boundary and ``start_record`` the index
    of the record there.  Length checksums are verified; data checksums are
    not (see :func:`check_data_crcs`).  Framing damage is raised after every
    complete record before it has been yielded.

    Raises:
        BadRecordError: a length checksum mismatch, or the file ends inside a
            record; the error names the record index and header offset.
        DataError: the file cannot be opened or read.
    """
    compression = resolve_compression(path, compression, looks_like_tfrecord)
    tail = b""
    base = start_offset  # file offset of tail[0]
    record = start_record
    blocks = iter_blocks(path, compression, start_offset, block_size)
    block = next(blocks, None)
    while True:
        following = next(blocks, None) if block is not None else None
        eof = following is None
        buf = tail + block if block is not None else tail
        heads, end = _frame(buf)
        n, end, damage = _check_headers(path, buf, heads, end, eof, base, record)
        if n or (eof and damage is None):
            starts = heads[:n]
            lengths = _gather_u64(buf, starts)
            yield RecordChunk(
                buf=buf,
                data_starts=starts + _HEADER,
                lengths=lengths,
                offsets=starts + base,
                record_index=np.arange(record, record + n, dtype=np.int64),
                end_offset=base + end,
                end_record=record + n,
                eof=eof and damage is None,
            )
        if damage is not None:
            blocks.close()
            raise damage
        if eof:
            return
        record += n
        base += end
        tail = buf[end:]
        block = following


def _gather_u64(buf: bytes, starts: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    raw = np.frombuffer(buf, dtype=np.uint8)
    lengths: npt.NDArray[np.int64] = raw[starts[:, None] + np.arange(8)].copy().view("<u8")[:, 0].astype(np.int64)
    return lengths


def _check_headers(
    path: str, buf: bytes, heads: npt.NDArray[np.int64], end: int, eof: bool, base: int, record: int
) -> tuple[int, int, BadRecordError | None]:
    """Finds the first framing damage in ``buf``: bad length checksum or truncation.

    Returns:
        (number of good records, end of the last good one in ``buf``, the damage or None).
    """
    if heads.size:
        raw = np.frombuffer(buf, dtype=np.uint8)
        header_bytes = raw[heads[:, None] + np.arange(_HEADER, dtype=np.int64)]
        want = header_bytes[:, 8:12].copy().view("<u4")[:, 0].astype(np.uint64)
        bad = np.flatnonzero(_masked_crc_of_u64s(header_bytes[:, :8]) != want)
        if bad.size:
            k = int(bad[0])
            damage = BadRecordError(path, "length checksum mismatch (corrupt framing)", record=record + k, offset=base + int(heads[k]))
            return k, int(heads[k]), damage
    left = len(buf) - end
    if left >= _HEADER and not looks_like_tfrecord(buf[end : end + _HEADER]):
        # Checked before reading on, so a corrupt huge length never makes us buffer the file.
        damage = BadRecordError(path, "length checksum mismatch (corrupt framing)", record=record + len(heads), offset=base + end)
        return len(heads), end, damage
    if eof and left:
        need = _U64.unpack_from(buf, end)[0] + _OVERHEAD if left >= 8 else _HEADER
        damage = BadRecordError(
            path,
            f"truncated record: needs {need} bytes, file ends after {left}",
            record=record + len(heads),
            offset=base + end,
        )
        return len(heads), end, damage
    return len(heads), end, None


def check_data_crcs(chunk: RecordChunk, rows: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Returns the subset of ``rows`` whose data checksum does not match (usually empty)."""
    if rows.size == 0:
        return rows
    starts = chunk.data_starts[rows]
    lengths = chunk.lengths[rows]
    ends = starts + lengths
    raw = np.frombuffer(chunk.buf, dtype=np.uint8)
    want = raw[ends[:, None] + np.arange(4)].copy().view("<u4")[:, 0]
    if NATIVE is not None:
        got = np.empty(len(rows), dtype=np.uint32)
        NATIVE.masked_crc32c_ranges(chunk.buf, starts, lengths, got)
    else:
        got = _masked_crcs_numpy(chunk.buf, starts, ends)
    bad: npt.NDArray[np.int64] = rows[got != want]
    return bad


def _masked_crcs_numpy(buf: bytes, starts: npt.NDArray[np.int64], ends: npt.NDArray[np.int64]) -> npt.NDArray[np.uint32]:
    """Masked CRC32C of each ``buf[starts[i]:ends[i]]`` through the crc32c package (no extension)."""
    view = memoryview(buf)
    # map() keeps the per-record loop in C: slice objects -> memoryview slices -> crc32c.
    slices = map(slice, starts.tolist(), ends.tolist())
    got = np.array(list(map(_crc32c.crc32c, map(view.__getitem__, slices))), dtype=np.uint64)
    return _mask(got).astype(np.uint32)


def read_records(path: str, *, compression: str = "auto", check_crc: bool = True) -> Iterator[bytes]:
    """Yields each record's data, in file order.

    Blocking; reads the file in blocks, never whole.

    Raises:
        BadRecordError: framing damage or (with ``check_crc``) a data
            checksum mismatch, naming the record index and byte offset.
        DataError: the file cannot be opened or read.
    """
    for chunk in iter_record_chunks(path, compression):
        rows = np.arange(len(chunk.lengths), dtype=np.int64)
        bad = check_data_crcs(chunk, rows) if check_crc else rows[:0]
        first_bad = int(bad[0]) if bad.size else len(rows)
        for i in range(first_bad):
            s = int(chunk.data_starts[i])
            yield chunk.buf[s : s + int(chunk.lengths[i])]
        if bad.size:
            raise BadRecordError(
                path,
                "data checksum mismatch",
                record=int(chunk.record_index[first_bad]),
                offset=int(chunk.offsets[first_bad]),
            )


class TFRecordWriter:
    """Writes records to a TFRecord file, plain or GZIP.

    Not thread-safe.  The file is complete only after :meth:`close` (or the
    end of a ``with`` block); a GZIP file is written with mtime 0, so equal
    records give equal bytes.

    Args:
        path: file to create (truncated if it exists).
        compression: ``"none"`` or ``"gzip"``.

    Raises:
        DataError: the file cannot be created.
        ValueError: unknown compression.
    """

    def __init__(self, path: str, compression: str = "none") -> None:
        if compression not in ("none", "gzip"):
            raise ValueError(f"TFRecordWriter compression must be none or gzip, got {compression!r}")
        self.path = path
        try:
            raw = open(path, "wb")
        except OSError as e:
            raise DataError(f"{path}: cannot create: {e.strerror or e}") from e
        self._raw = raw
        self._out = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) if compression == "gzip" else raw
        self._closed = False
        self.records_written = 0

    def write(self, data: bytes) -> None:
        """Appends one record.

        Raises:
            DataError: the writer is closed.
        """
        if self._closed:
            raise DataError(f"{self.path}: write on a closed TFRecordWriter")
        header = _U64.pack(len(data))
        self._out.write(header + _U32.pack(masked_crc32c(header)) + data + _U32.pack(masked_crc32c(data)))
        self.records_written += 1

    def flush(self) -> None:
        """Hands every record written so far to the operating system (a reader then sees them; a GZIP
        file's records become readable only once the stream is closed)."""
        if not self._closed:
            self._out.flush()
            if self._out is not self._raw:
                self._raw.flush()

    def close(self) -> None:
        """Flushes and closes the file.  Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._out is not self._raw:
            self._out.close()
        self._raw.close()

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()
