"""Public types of psflow.data: errors, the dataset config, reader positions, stats.

:class:`Dataset`, :func:`open_dataset` and :func:`read_all` (in
``dataset.py``) and :func:`shard_plan` (in ``sharding.py``) can also be
imported from this module; they are loaded on first use so that the reader
modules can import the errors from here without a cycle.
"""

from __future__ import annotations

import base64
import importlib
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import TYPE_CHECKING, Any

from psflow.data.labels import FINITE_LABELS, LabelSpec
from psflow.data.schema import Schema
from psflow.errors import PsflowError

if TYPE_CHECKING:
    from psflow.data.dataset import Dataset, open_dataset, read_all
    from psflow.data.sharding import shard_plan

__all__ = [
    "DataError",
    "BadRecordError",
    "TooManyBadRecordsError",
    "DatasetConfig",
    "ReaderPosition",
    "ShuffleState",
    "FileStats",
    "DatasetStats",
    "FORMATS",
    "Dataset",
    "open_dataset",
    "read_all",
    "shard_plan",
]

FORMATS = ("libsvm", "tfrecord", "criteo")
_COMPRESSIONS = ("auto", "none", "gzip")


class DataError(PsflowError):
    """Base class of every error raised by psflow.data."""


class BadRecordError(DataError):
    """A record that cannot be read: bad framing or checksum, malformed line, missing feature.

    Attributes:
        path: the file, as given (after glob expansion).
        record: for text formats the 1-based line number; for TFRecord the
            0-based record index in the file; ``None`` if unknown.
        offset: byte offset of the record (or of the damage) in the
            uncompressed stream; ``None`` if unknown.
        detail: what is wrong, without the location.
        line_based: True when ``record`` is a 1-based line number.
    """

    def __init__(
        self,
        path: str,
        detail: str,
        *,
        record: int | None = None,
        offset: int | None = None,
        line_based: bool = False,
    ) -> None:
        self.path = path
        self.detail = detail
        self.record = record
        self.offset = offset
        self.line_based = line_based
        if line_based:
            where = f"{path}:{record}" if record is not None else path
        elif record is not None:
            where = f"{path}: record {record}" + (f" at byte {offset}" if offset is not None else "")
        else:
            where = f"{path}: byte {offset}" if offset is not None else path
        super().__init__(f"{where}: {detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_bad_record, (self.path, self.detail, self.record, self.offset, self.line_based))


def _rebuild_bad_record(path: str, detail: str, record: int | None, offset: int | None, line_based: bool) -> BadRecordError:
    return BadRecordError(path, detail, record=record, offset=offset, line_based=line_based)


class TooManyBadRecordsError(DataError):
    """More bad records were skipped in one epoch than ``max_bad_records`` allows.

    Attributes:
        count: bad records met in the epoch, this one included.
        last: the bad record that crossed the threshold.
    """

    def __init__(self, count: int, limit: int, last: BadRecordError) -> None:
        self.count = count
        self.limit = limit
        self.last = last
        super().__init__(f"{count} bad records in one epoch exceeds max_bad_records={limit}; last: {last}")


@dataclass(frozen=True)
class DatasetConfig:
    """What a worker reads and how it is batched.  Validated on construction.

    Attributes:
        paths: files or glob patterns; expanded, de-duplicated and sorted.
        format: ``"libsvm"``, ``"tfrecord"`` or ``"criteo"``.
        batch_size: examples per batch.  Batches never span two epochs: the
            last batch of an epoch may be smaller (see ``drop_remainder``).
        num_epochs: passes over this worker's shard; ``None`` repeats forever.
        shuffle_buffer: capacity of the record shuffle buffer; 0 reads records
            in file order.  When > 0 the order of this worker's files is also
            shuffled each epoch (seeded by ``seed``, worker and epoch).
        min_after_dequeue: records left in the buffer after each draw (see
            ``shuffle.py``).  ``None`` means ``shuffle_buffer // 2``.  Larger
            mixes better but costs more per record: the buffer is re-drawn
            every ``shuffle_buffer - min_after_dequeue`` records.
        seed: seed of file-order and record shuffling.
        drop_remainder: drop the last, partial batch of each epoch.
        worker_index: this worker, in ``[0, num_workers)``.
        num_workers: workers sharing the files (see ``sharding.py``).
        schema: TFRecord only; ``None`` is :func:`default_sparse_schema`.  It
            must fit a batch (:meth:`Schema.batch_layout`).
        num_features: Criteo: each categorical column's hashed id space;
            also the id space :func:`~psflow.data.schema.batch_spec` gives
            sparse features without their own size.  Must be >= 1, except
            that with format ``"criteo"`` 0 means raw ids: each categorical
            id is its full 64-bit hash as int64, not folded (no modulo; any
            int64, negative ones too), for tables keyed by the id itself
            (see :mod:`~psflow.data.criteo`).
        skip_bad_records: skip (and count) bad records instead of raising.
        max_bad_records: with skipping, the most bad records allowed in one
            epoch; one more raises :class:`TooManyBadRecordsError`.
        prefetch: batches prepared ahead by a background thread; 0 parses in
            the consumer's thread.  Memory is bounded by ``prefetch + 2``
            batches plus the shuffle buffer and one read block.
        reader_process: with ``prefetch > 0``, read and parse in a forked child
            process instead of a thread, handing batches over through shared
            memory (:mod:`~psflow.data.reader_process`), so parsing runs on
            another core instead of competing for the GIL. Same batches, order
            and positions. Pays off when a core is idle (one worker per host).
            Not while gRPC runs in the process (fork is unsafe there): the
            fork, at the first batch unless started earlier, is then refused
            with :class:`DataError`; fork before the first channel or server.
        compression: ``"auto"`` (gzip if the name ends in ``.gz`` or the file
            starts with the gzip magic and is not a valid TFRecord), ``"none"``
            or ``"gzip"``; applies to every format.
        check_crc: verify TFRecord data checksums (length checksums are always
            verified, since framing depends on them).
        block_size: bytes read from a file at a time (uncompressed).  Output
            never depends on it; 1 MiB keeps numpy's per-call overhead small
            and the working set in cache.
        labels: the labels accepted (:class:`~psflow.data.labels.LabelSpec`,
            e.g. a model's :attr:`~psflow.models.Model.labels`); a record with
            another label is a bad record.  Default: any finite label.  None:
            labels are not checked (prediction, where they are not used).
    """

    paths: tuple[str, ...]
    format: str
    batch_size: int = 512
    num_epochs: int | None = 1
    shuffle_buffer: int = 0
    min_after_dequeue: int | None = None
    seed: int = 0
    drop_remainder: bool = False
    worker_index: int = 0
    num_workers: int = 1
    schema: Schema | None = None
    num_features: int = 1 << 20
    skip_bad_records: bool = False
    max_bad_records: int = 100
    prefetch: int = 2
    reader_process: bool = False
    compression: str = "auto"
    check_crc: bool = True
    block_size: int = 1 << 20
    labels: LabelSpec | None = FINITE_LABELS

    def __post_init__(self) -> None:
        if isinstance(self.paths, str):
            raise TypeError(f"DatasetConfig.paths must be a sequence of paths, got the string {self.paths!r}")
        object.__setattr__(self, "paths", tuple(str(p) for p in self.paths))
        problems = []
        if not self.paths:
            problems.append("paths is empty")
        if self.format not in FORMATS:
            problems.append(f"format {self.format!r} is not one of {', '.join(FORMATS)}")
        if self.batch_size < 1:
            problems.append(f"batch_size ({self.batch_size}) must be >= 1")
        if self.num_epochs is not None and self.num_epochs < 0:
            problems.append(f"num_epochs ({self.num_epochs}) must be >= 0 or None")
        if self.shuffle_buffer < 0:
            problems.append(f"shuffle_buffer ({self.shuffle_buffer}) must be >= 0")
        if self.min_after_dequeue is not None and not 0 <= self.min_after_dequeue < max(self.shuffle_buffer, 1):
            problems.append(f"min_after_dequeue ({self.min_after_dequeue}) must be in [0, shuffle_buffer={self.shuffle_buffer})")
        if self.seed < 0:
            problems.append(f"seed ({self.seed}) must be >= 0")
        if self.num_workers < 1 or not 0 <= self.worker_index < self.num_workers:
            problems.append(f"worker_index ({self.worker_index}) must be in [0, num_workers={self.num_workers})")
        if self.num_features < 0 or (self.num_features == 0 and self.format != "criteo"):
            problems.append(f"num_features ({self.num_features}) must be >= 1 (or 0, raw 64-bit ids, with format 'criteo')")
        if self.max_bad_records < 0:
            problems.append(f"max_bad_records ({self.max_bad_records}) must be >= 0")
        if self.block_size < 1:
            problems.append(f"block_size ({self.block_size}) must be >= 1")
        if self.prefetch < 0:
            problems.append(f"prefetch ({self.prefetch}) must be >= 0")
        if self.compression not in _COMPRESSIONS:
            problems.append(f"compression {self.compression!r} is not one of {', '.join(_COMPRESSIONS)}")
        if self.labels is not None and not isinstance(self.labels, LabelSpec):
            problems.append(f"labels must be a LabelSpec or None, got {self.labels!r}")
        if self.schema is not None and self.format != "tfrecord":
            problems.append(f"schema applies to tfrecord only, format is {self.format!r}")
        elif self.schema is not None:
            try:
                self.schema.batch_layout()
            except ValueError as e:
                problems.append(f"schema: {e}")
        if problems:
            raise ValueError("invalid DatasetConfig: " + "; ".join(problems))

    @property
    def effective_min_after_dequeue(self) -> int:
        """``min_after_dequeue`` with its default applied (0 when not shuffling)."""
        if self.shuffle_buffer == 0:
            return 0
        return self.shuffle_buffer // 2 if self.min_after_dequeue is None else self.min_after_dequeue


@dataclass(frozen=True)
class ShuffleState:
    """Replay state of the shuffle buffer inside a :class:`ReaderPosition`.

    The buffer contents when burst ``burst`` was drawn are the records with
    epoch sequence numbers ``first_seq + i`` for every set bit ``i`` of
    ``members`` (little-endian bit order, ``num_seqs`` bits).  Sequence numbers
    count the records this worker accepted in the epoch, in read order.

    Attributes:
        burst: 0-based index of the draw within the epoch.
        first_seq: sequence number of the record at the position's
            ``(file_index, offset)``: the oldest record in the buffer.
        num_seqs: records read from there up to the draw.
        members: bitmap of which of those records were in the buffer.
        taken: records of this draw's output already handed out.
    """

    burst: int
    first_seq: int
    num_seqs: int
    members: bytes
    taken: int


@dataclass(frozen=True)
class ReaderPosition:
    """Where a worker's reader stands, just after the last batch handed out.

    Resuming from a position (``open_dataset(..., resume_from=pos)``) yields
    exactly the records not yet handed out, in the order an uninterrupted run
    would have, with the same config.

    Without shuffling, ``(file_index, offset, record_index)`` is the next
    record to hand out.  With shuffling it is where the reader restarts (the
    oldest record still in the shuffle buffer) and ``shuffle`` says which of
    the records from there on are still pending.

    Attributes:
        epoch: 0-based epoch.
        file_index: index into this worker's file order of ``epoch``
            (:func:`psflow.data.sharding.epoch_file_order`).
        path: that file (checked on resume).  ``""`` past the last file.
        offset: byte offset in the file's uncompressed stream.
        record_index: 0-based record (TFRecord) or line (text) index at ``offset``.
        records_consumed: records handed out so far in ``epoch``.
        worker_index: the worker this position belongs to (checked on resume).
        num_workers: the sharding it was taken under (checked on resume).
        shuffle_buffer: shuffle capacity it was taken under (checked on resume).
        min_after_dequeue: effective value it was taken under (checked on resume).
        seed: shuffle seed it was taken under (checked on resume).
        shuffle: shuffle replay state, ``None`` when not shuffling or before the
            first draw of the epoch.
        start_epoch: the epoch this worker's reading began at: 0, or, in a run that resumed
            positions taken under another sharding, the epoch every worker started at
            (:func:`psflow.data.dataset.epoch_start`); kept by every later position.
        resharded: how many times the run's data was resharded before this position (0: never); kept by
            every later position, so a position left by a run before the last resharding (a run with fewer
            workers keeps the old positions no worker replaces) is told from the newer ones.
    """

    epoch: int = 0
    file_index: int = 0
    path: str = ""
    offset: int = 0
    record_index: int = 0
    records_consumed: int = 0
    worker_index: int = 0
    num_workers: int = 1
    shuffle_buffer: int = 0
    min_after_dequeue: int = 0
    seed: int = 0
    shuffle: ShuffleState | None = None
    start_epoch: int = 0
    resharded: int = 0

    def to_json(self) -> str:
        """Returns a JSON string that :meth:`from_json` turns back into an equal position.

        Every push carries one (a worker's step calls this on its training thread), so the fields are
        read directly: ``dataclasses.asdict`` deep-copies each of them (~24 us against ~10 us).
        """
        data: dict[str, Any] = {name: getattr(self, name) for name in _POSITION_FIELDS}
        shuffle = self.shuffle
        data["shuffle"] = None if shuffle is None else dict(
            asdict(shuffle), members=base64.b64encode(shuffle.members).decode("ascii"))
        return json.dumps(data, sort_keys=True)

    @staticmethod
    def from_json(text: str) -> ReaderPosition:
        """Parses :meth:`to_json` output.

        Raises:
            DataError: the text is not a reader position.
        """
        try:
            data = json.loads(text)
            shuffle = data.pop("shuffle", None)
            if shuffle is not None:
                shuffle["members"] = base64.b64decode(shuffle["members"], validate=True)
                shuffle = ShuffleState(**shuffle)
            return ReaderPosition(**data, shuffle=shuffle)
        except (ValueError, TypeError, KeyError, AttributeError) as e:
            raise DataError(f"not a reader position: {e}: {text[:200]!r}") from e


#: ReaderPosition's scalar fields (every field but ``shuffle``), in declaration order: what to_json writes as they are.
_POSITION_FIELDS = tuple(f.name for f in fields(ReaderPosition) if f.name != "shuffle")


@dataclass(frozen=True)
class FileStats:
    """Per-file counters: records accepted and bad records skipped."""

    records: int = 0
    bad_records: int = 0


@dataclass(frozen=True)
class DatasetStats:
    """Counters of a :class:`Dataset` since it was opened.

    Counted by the reader, which may run ahead of the batches handed out by
    up to the prefetch depth and the shuffle buffer.

    Attributes:
        records_read: records accepted, all files and epochs.
        bad_records: bad records skipped, all files and epochs.
        batches: batches handed out.
        per_file: path -> FileStats.
        last_bad: message of the most recent skipped bad record, if any.
    """

    records_read: int = 0
    bad_records: int = 0
    batches: int = 0
    per_file: Mapping[str, FileStats] = field(default_factory=dict)
    last_bad: str | None = None


_LAZY = {
    "Dataset": "psflow.data.dataset",
    "open_dataset": "psflow.data.dataset",
    "read_all": "psflow.data.dataset",
    "shard_plan": "psflow.data.sharding",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
