"""Byte sources: a file's uncompressed bytes, in blocks, from a given offset.

Offsets are always offsets in the *uncompressed* stream.  A plain file seeks
to the offset; a gzip file is decompressed from its start and the bytes before
the offset are discarded (gzip cannot seek), so resuming deep inside a large
gzip file costs a decompression of the part before it.  A gzip file may hold
several members; they are read as one stream, as ``gunzip`` does.

A path may be a URL of an object store (``s3://``, ``gs://``; see
:mod:`psflow.storage`): the object is streamed in ranged reads, and an offset
is a seek there too.
"""

from __future__ import annotations

import contextlib
import gzip
import zlib
from collections.abc import Callable, Generator, Iterator
from typing import IO

from psflow import storage
from psflow.data.api import BadRecordError, DataError

__all__ = ["BLOCK_SIZE", "GZIP_MAGIC", "resolve_compression", "iter_blocks"]

BLOCK_SIZE = 1 << 20  # bytes per read: large enough to amortize per-block numpy overhead
GZIP_MAGIC = b"\x1f\x8b\x08"


def resolve_compression(path: str, compression: str, looks_plain: Callable[[bytes], bool] | None = None) -> str:
    """Returns ``"none"`` or ``"gzip"`` for a file.

    ``"auto"``: a name ending in ``.gz`` or ``.gzip`` is gzip; otherwise the
    file is gzip when it starts with the gzip magic bytes and ``looks_plain``
    (given the first 16 bytes) says it is not a valid plain file of the format.

    Raises:
        DataError: the file cannot be opened.
        ValueError: unknown ``compression``.
    """
    if compression in ("none", "gzip"):
        return compression
    if compression != "auto":
        raise ValueError(f"compression must be auto, none or gzip, got {compression!r}")
    if path.endswith((".gz", ".gzip")):
        return "gzip"
    try:
        head = storage.read_head(path, 16)
    except OSError as e:
        raise DataError(f"{path}: cannot open: {e.strerror or e}") from e
    if head.startswith(GZIP_MAGIC) and (looks_plain is None or not looks_plain(head)):
        return "gzip"
    return "none"


@contextlib.contextmanager
def _open(path: str, compression: str) -> Iterator[IO[bytes] | gzip.GzipFile]:
    """``path`` opened for reading its uncompressed bytes; closed (the file under a gzip stream too) at the end."""
    try:
        raw = storage.open_for_read(path)
    except OSError as e:
        raise DataError(f"{path}: cannot open: {e.strerror or e}") from e
    with raw:
        if compression == "gzip":
            with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                yield f
        else:
            yield raw


def iter_blocks(path: str, compression: str, start_offset: int = 0, block_size: int = BLOCK_SIZE) -> Generator[bytes, None, None]:
    """Yields the uncompressed bytes of ``path`` from ``start_offset`` on, in blocks.

    Blocks are at most ``block_size`` bytes (the last may be shorter); their
    concatenation is exactly the stream from ``start_offset`` to the end.
    The file is closed when the iterator is exhausted or closed.

    Raises:
        DataError: the file cannot be opened or read.
        BadRecordError: a gzip stream is corrupt or truncated (``offset`` is
            the uncompressed offset reached).
    """
    offset = 0
    with _open(path, compression) as f:
        try:
            if start_offset:
                if compression == "gzip":
                    while offset < start_offset:
                        skipped = f.read(min(block_size, start_offset - offset))
                        if not skipped:
                            break
                        offset += len(skipped)
                else:
                    f.seek(start_offset)
                    offset = start_offset
            while True:
                block = f.read(block_size)
                if not block:
                    return
                offset += len(block)
                yield block
        except (gzip.BadGzipFile, zlib.error, EOFError) as e:
            raise BadRecordError(path, f"corrupt or truncated gzip stream: {e}", offset=offset) from e
        except OSError as e:
            raise DataError(f"{path}: read failed at byte {offset}: {e.strerror or e}") from e
