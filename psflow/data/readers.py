"""Per-format file readers: one file, from a given record, in parsed pieces.

A reader yields :class:`Piece` objects: a :class:`Batch` of this worker's good
records from one stretch of the file, with each row's record index and byte
offset, and where the stretch ends.  Bad records are handed to the
``on_bad`` callback, which raises (stop) or returns (skip); after framing
damage (TFRecord) or a corrupt gzip stream nothing more of the file can be
read, so the reader then ends the file.  A record whose label the config's
:class:`~psflow.data.labels.LabelSpec` refuses is a bad record too (checked
once per piece, vectorized).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from psflow.data.api import BadRecordError, DataError, DatasetConfig
from psflow.data.batch import Batch, gather_ranges
from psflow.data.criteo import parse_criteo
from psflow.data.example import ParsedExamples, decode_chunk, to_batch
from psflow.data.libsvm import TextParse, parse_libsvm
from psflow.data.schema import Schema, default_sparse_schema
from psflow.data.source import iter_blocks, resolve_compression
from psflow.data.tfrecord import check_data_crcs, iter_record_chunks
from psflow.errors import PsflowError

__all__ = ["Piece", "OnBad", "iter_file", "empty_batch", "holds_records"]

OnBad = Callable[[BadRecordError], None]


@dataclass
class Piece:
    """Good records of one stretch of a file, in file order.

    Attributes:
        batch: the records.
        record_index: int64 per row: 0-based record (or line) index in the file.
        offsets: int64 per row: byte offset of the record in the uncompressed stream.
        end_record: index of the first record after the stretch.
        end_offset: byte offset of the first record after the stretch.
        eof: nothing of the file follows the stretch.
    """

    batch: Batch
    record_index: npt.NDArray[np.int64]
    offsets: npt.NDArray[np.int64]
    end_record: int
    end_offset: int
    eof: bool


def iter_file(
    config: DatasetConfig,
    path: str,
    *,
    start_record: int,
    start_offset: int,
    stride: int,
    first: int,
    on_bad: OnBad,
) -> Iterator[Piece]:
    """Yields the pieces of ``path`` from ``(start_record, start_offset)`` on.

    Only records ``r`` with ``(r - first) % stride == 0`` are parsed.  The
    last piece has ``eof`` set (it may have no rows).

    Raises:
        BadRecordError, TooManyBadRecordsError: whatever ``on_bad`` raises.
        DataError: the file cannot be opened or read; or (TFRecord) none of
            the first chunk's records has a non-optional VarLen or Sparse feature
            of the schema.
    """
    if config.format == "tfrecord":
        schema = config.schema or default_sparse_schema()
        return _iter_tfrecord(config, schema, path, start_record, start_offset, stride, first, on_bad, config.block_size)

    def parse(data: bytes, newlines: npt.NDArray[np.int64] | None) -> TextParse:
        if config.format == "libsvm":
            return parse_libsvm(data, newlines)
        return parse_criteo(data, config.num_features, newlines)

    return _iter_text(config, parse, path, start_record, start_offset, stride, first, on_bad, config.block_size)


class _RecordSeen(PsflowError):
    """Stops :func:`holds_records` at the first bad record (a record all the same)."""


def holds_records(config: DatasetConfig, path: str) -> bool:
    """Whether ``path`` holds at least one record, good or malformed (blank lines are not records).

    Reads the file only up to its first record (one block, for a file that has one); whatever is wrong
    with that record is left for the reading itself to report, under the config's bad-record policy.
    Blocking; no side effects.

    Raises:
        DataError: the file cannot be opened or read, or (TFRecord) its first chunk lacks a feature
            the schema requires (as :func:`iter_file`).
    """

    def on_bad(error: BadRecordError) -> None:
        raise _RecordSeen

    try:
        for piece in iter_file(config, path, start_record=0, start_offset=0, stride=1, first=0, on_bad=on_bad):
            if piece.batch.num_examples:
                return True
    except _RecordSeen:
        return True
    return False


def empty_batch(config: DatasetConfig) -> Batch:
    """A batch with no examples and every feature the config's batches have (same dtypes and shapes)."""
    none = np.zeros(0, dtype=np.int64)
    if config.format == "tfrecord":
        schema = config.schema or default_sparse_schema()
        return to_batch(decode_chunk(b"", none, none, schema), schema)
    if config.format == "libsvm":
        return parse_libsvm(b"").batch
    return parse_criteo(b"", config.num_features).batch


def _end_piece(config: DatasetConfig, record: int, offset: int) -> Piece:
    empty = np.zeros(0, dtype=np.int64)
    return Piece(empty_batch(config), empty, empty, record, offset, True)


def _blocks_then_damage(path: str, compression: str, base: int, block_size: int) -> Iterator[bytes | BadRecordError]:
    """The file's blocks; a corrupt gzip stream ends them with the error instead of raising it."""
    try:
        yield from iter_blocks(path, compression, base, block_size)
    except BadRecordError as e:
        yield e


def _iter_text(
    config: DatasetConfig,
    parse: Callable[[bytes, npt.NDArray[np.int64] | None], TextParse],
    path: str,
    line: int,
    base: int,
    stride: int,
    first: int,
    on_bad: OnBad,
    block_size: int,
) -> Iterator[Piece]:
    compression = resolve_compression(path, config.compression)
    blocks = _blocks_then_damage(path, compression, base, block_size)
    tail = b""
    block = next(blocks, None)
    while True:
        damage = block if isinstance(block, BadRecordError) else None
        following = next(blocks, None) if block is not None and damage is None else None
        if isinstance(following, BadRecordError):
            damage = following
        eof = following is None or damage is not None
        buf = tail + block if isinstance(block, bytes) else tail
        cut = buf.rfind(b"\n") + 1
        data = buf[:cut]
        if eof and damage is None and cut < len(buf):
            data, cut = buf + b"\n", len(buf)  # a last line without its newline
        piece = _text_piece(parse, path, data, line, base, stride, first, on_bad, min(cut, len(buf)), eof, config)
        yield piece
        if damage is not None:
            on_bad(damage)  # the rest of the file is unreadable
        if eof:
            return
        line = piece.end_record
        base += cut
        tail = buf[cut:]
        block = following


def _text_piece(
    parse: Callable[[bytes, npt.NDArray[np.int64] | None], TextParse],
    path: str,
    data: bytes,
    line: int,
    base: int,
    stride: int,
    first: int,
    on_bad: OnBad,
    consumed: int,
    eof: bool,
    config: DatasetConfig,
) -> Piece:
    raw = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(raw == 10)
    ends = newlines + 1
    starts = np.concatenate([np.zeros(1, dtype=np.int64), ends[:-1]])
    lines = np.arange(line, line + len(ends), dtype=np.int64)
    if stride > 1:
        own = np.flatnonzero((lines - first) % stride == 0)
        starts, lines = starts[own], lines[own]
        parsed = parse(raw[gather_ranges(starts, ends[own] - starts)].tobytes(), None)
    else:
        parsed = parse(data, newlines)
    for i, message in parsed.errors:
        on_bad(BadRecordError(path, message, record=int(lines[i]) + 1, offset=base + int(starts[i]), line_based=True))
    piece = Piece(
        batch=parsed.batch,
        record_index=lines[parsed.rows],
        offsets=base + starts[parsed.rows],
        end_record=line + len(ends),
        end_offset=base + consumed,
        eof=eof,
    )
    return _check_labels(config, path, piece, parsed.raw_labels, on_bad)


def _check_labels(config: DatasetConfig, path: str, piece: Piece, raw: npt.NDArray[np.float64] | None,
                  on_bad: OnBad) -> Piece:
    """``piece`` without the records whose label ``config.labels`` refuses, each handed to ``on_bad`` first.

    ``raw``: LIBSVM's labels as written (the batch holds them read as 0.0/1.0). Vectorized: a piece whose
    labels are all accepted costs a few numpy calls and is returned as it is.
    """
    spec = config.labels
    if spec is None or not piece.batch.num_examples:
        return piece
    libsvm = raw is not None
    labels = raw if raw is not None else piece.batch.labels
    bad = spec.rejects(labels, libsvm=libsvm)
    if not bad.any():
        return piece
    line_based = config.format != "tfrecord"
    for row in np.flatnonzero(bad).tolist():
        record = int(piece.record_index[row])
        on_bad(BadRecordError(path, f"label {float(labels[row]):g} is not one the model accepts: want "
                              f"{spec.describe(libsvm=libsvm)}", record=record + 1 if line_based else record,
                              offset=int(piece.offsets[row]), line_based=line_based))
    keep = np.flatnonzero(~bad)
    return replace(piece, batch=piece.batch.take(keep), record_index=piece.record_index[keep], offsets=piece.offsets[keep])


def _iter_tfrecord(
    config: DatasetConfig,
    schema: Schema,
    path: str,
    record: int,
    offset: int,
    stride: int,
    first: int,
    on_bad: OnBad,
    block_size: int,
) -> Iterator[Piece]:
    chunks = iter_record_chunks(path, config.compression, offset, record, block_size)
    checked = False
    while True:
        try:
            chunk = next(chunks)
        except StopIteration:
            return
        except BadRecordError as e:  # framing damage or corrupt gzip: the rest of the file is unreadable
            on_bad(e)
            yield _end_piece(config, e.record if e.record is not None else record, e.offset if e.offset is not None else offset)
            return
        rows = np.arange(len(chunk.lengths), dtype=np.int64)
        if stride > 1:
            rows = rows[(chunk.record_index - first) % stride == 0]
        if config.check_crc:
            corrupt = check_data_crcs(chunk, rows)
            for row in corrupt.tolist():
                on_bad(_tf_error(path, chunk.record_index, chunk.offsets, row, "data checksum mismatch"))
            if corrupt.size:
                rows = np.setdiff1d(rows, corrupt)
        parsed = decode_chunk(chunk.buf, chunk.data_starts[rows], chunk.lengths[rows], schema)
        # A key the data lacks can make every record look bad (ids without values): name it first, unless
        # the chunk shows no wanted key at all and bad records (garbage, or another kind of data).
        if not checked and len(rows) and (parsed.present or not parsed.errors):
            _check_presence(path, schema, parsed, len(rows))
            checked = True
        keep = np.ones(len(rows), dtype=bool)
        for i, message in parsed.errors:
            on_bad(_tf_error(path, chunk.record_index, chunk.offsets, int(rows[i]), message))
            keep[i] = False
        good = rows[keep]
        piece = Piece(
            batch=to_batch(parsed, schema, None if keep.all() else np.flatnonzero(keep)),
            record_index=chunk.record_index[good],
            offsets=chunk.offsets[good],
            end_record=chunk.end_record,
            end_offset=chunk.end_offset,
            eof=chunk.eof,
        )
        yield _check_labels(config, path, piece, None, on_bad)
        record, offset = chunk.end_record, chunk.end_offset


def _check_presence(path: str, schema: Schema, parsed: ParsedExamples, count: int) -> None:
    """Raises DataError for a non-optional VarLen/Sparse feature that none of the ``count`` records of a file's
    first chunk has (the first chunk read from it, after a resume the chunk at the resume point)."""
    for name, keys in schema.presence_keys().items():
        missing = [key for key in keys if key not in parsed.present]
        if missing:
            shown = f"Example key {missing[0]!r}" if missing != [name] else "it"
            raise DataError(
                f"{path}: the schema names feature {name!r}, but none of the {count} records of the file's first "
                f"chunk has {shown}; fix the schema, or mark the feature optional (optional: true) if it is rare"
            )


def _tf_error(path: str, record_index: npt.NDArray[np.int64], offsets: npt.NDArray[np.int64], row: int, message: str) -> BadRecordError:
    return BadRecordError(path, message, record=int(record_index[row]), offset=int(offsets[row]))
