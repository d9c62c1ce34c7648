"""Dataset: a worker's batches over epochs, with shuffle, prefetch and resumable positions.

The pipeline, in the order data flows:

1. **Files** -- the worker's share (:mod:`~psflow.data.sharding`), in the
   epoch's order (:func:`~psflow.data.sharding.epoch_file_order`; shuffled
   per epoch when ``shuffle_buffer > 0``).
2. **Reader** -- each file is read in blocks and parsed vectorized
   (:mod:`~psflow.data.readers`); bad records go to the bad-record policy.
3. **Shuffle** -- optional buffer (:mod:`~psflow.data.shuffle`).
4. **Batcher** -- cuts ``batch_size`` rows; a batch never spans two epochs;
   the last one of an epoch may be short or dropped (``drop_remainder``).
5. **Prefetch** -- steps 1-4 run in one background thread, at most
   ``prefetch`` batches ahead (:mod:`~psflow.data.prefetch`), or with
   ``reader_process`` in a child process (:mod:`~psflow.data.reader_process`),
   which also sends the reader's counters along with each batch.

Each batch travels with the :class:`ReaderPosition` just after it, so
:meth:`Dataset.position` is exact however far the thread has run ahead.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from psflow.data.api import (
    BadRecordError,
    DataError,
    DatasetConfig,
    DatasetStats,
    FileStats,
    ReaderPosition,
    ShuffleState,
    TooManyBadRecordsError,
)
from psflow.data.batch import Batch, BatchSource, SparseColumn
from psflow.data.prefetch import Prefetcher
from psflow.data.reader_process import ReaderProcess
from psflow.data.readers import empty_batch, iter_file
from psflow.data.sharding import WorkerShard, epoch_file_order, expand_paths, shard_plan
from psflow.data.shuffle import OutPiece, ReadPiece, Rows, sequential_pieces, shuffle_rows

__all__ = ["Dataset", "open_dataset", "epoch_start", "read_all"]

logger = logging.getLogger("psflow.data")

_Item = tuple[Batch, ReaderPosition]
#: A per-batch step run by the reader (see :func:`open_dataset`).
Prepare = Callable[[Batch], Batch]

#: Batches a reader process may run ahead. Parsing comes in bursts (a whole read block, ~20 batches
#: of 512 at a time), so a shallow ring would stall the consumer at every block; 64 slots of
#: PROCESS_SLOT_BYTES reserve 64 MiB of address space, of which only the pages used are committed.
PROCESS_DEPTH = 64
#: One slot: a 512-example batch of 39 ids needs ~250 KB; a batch that does not fit goes through a pipe.
PROCESS_SLOT_BYTES = 1 << 20
_CountedItem = tuple[Batch, ReaderPosition, DatasetStats]  # from a reader process: its counters too


def _take_apart(item: _CountedItem) -> tuple[list[np.ndarray], Any]:
    """Every array of the batch (labels, each sparse column's three, dense, extras) and a picklable rest
    naming them, in order."""
    batch, position, stats = item
    sparse, dense, extras = list(batch.sparse), list(batch.dense), list(batch.extras)
    arrays: list[np.ndarray] = [batch.labels]
    for name in sparse:
        column = batch.sparse[name]
        arrays += [column.indptr, column.ids, column.values]
    arrays += [batch.dense[k] for k in dense] + [batch.extras[k] for k in extras]
    return arrays, (sparse, dense, extras, position, stats, batch.source)


def _rebuild(arrays: list[np.ndarray], rest: Any) -> _CountedItem:
    sparse_names, dense_names, extra_names, position, stats, source = rest
    labels, *more = arrays
    sparse = {name: SparseColumn(*more[3 * i : 3 * i + 3]) for i, name in enumerate(sparse_names)}
    more = more[3 * len(sparse_names) :]
    dense = dict(zip(dense_names, more[: len(dense_names)], strict=True))
    extras = dict(zip(extra_names, more[len(dense_names) :], strict=True))
    return Batch(labels, sparse, dense, extras, source), position, stats


def _keep_source(prepared: Batch, batch: Batch) -> Batch:
    """``prepared`` with ``batch``'s source (a ``prepare`` that built a new Batch dropped it)."""
    if prepared.source is None and batch.source is not None:
        prepared.source = batch.source
    return prepared


class _Counters:
    """Reader-side counters and the bad-record policy.  Thread-safe."""

    def __init__(self, config: DatasetConfig) -> None:
        self._config = config
        self._lock = threading.Lock()
        self._records: dict[str, int] = {}
        self._bad: dict[str, int] = {}
        self._epoch_bad = 0
        self._last_bad: str | None = None
        self.batches = 0

    def new_epoch(self) -> None:
        with self._lock:
            self._epoch_bad = 0

    def read(self, path: str, count: int) -> None:
        with self._lock:
            self._records[path] = self._records.get(path, 0) + count

    def on_bad(self, error: BadRecordError) -> None:
        if not self._config.skip_bad_records:
            raise error
        with self._lock:
            self._bad[error.path] = self._bad.get(error.path, 0) + 1
            self._epoch_bad += 1
            self._last_bad = str(error)
            count = self._epoch_bad
        if count > self._config.max_bad_records:
            raise TooManyBadRecordsError(count, self._config.max_bad_records, error)
        logger.warning("skipping bad record (%d this epoch): %s", count, error)

    def snapshot(self) -> DatasetStats:
        with self._lock:
            paths = sorted(set(self._records) | set(self._bad))
            per_file = {p: FileStats(self._records.get(p, 0), self._bad.get(p, 0)) for p in paths}
            return DatasetStats(
                records_read=sum(self._records.values()),
                bad_records=sum(self._bad.values()),
                batches=self.batches,
                per_file=per_file,
                last_bad=self._last_bad,
            )


class _Pipeline:
    """Steps 1-4 for one worker, as a generator of (batch, position after it)."""

    def __init__(self, config: DatasetConfig, shard: WorkerShard, counters: _Counters, *,
                 origin: ReaderPosition | None = None) -> None:
        """``origin``: where the reading starts; every position keeps its ``start_epoch`` and ``resharded``."""
        self.config, self.shard, self.counters = config, shard, counters
        kept = origin or ReaderPosition()
        self.template = ReaderPosition(
            worker_index=config.worker_index, num_workers=config.num_workers, shuffle_buffer=config.shuffle_buffer,
            min_after_dequeue=config.effective_min_after_dequeue, seed=config.seed, start_epoch=kept.start_epoch,
            resharded=kept.resharded)

    def order(self, epoch: int) -> list[int]:
        return epoch_file_order(self.shard, epoch, shuffle=self.config.shuffle_buffer > 0, seed=self.config.seed)

    def check(self, start: ReaderPosition) -> None:
        """Raises DataError if ``start`` was not taken under this config."""
        for name in ("worker_index", "num_workers", "shuffle_buffer", "min_after_dequeue", "seed"):
            if getattr(start, name) != getattr(self.template, name):
                raise DataError(
                    f"cannot resume: the position was taken with {name}={getattr(start, name)}, "
                    f"the dataset has {name}={getattr(self.template, name)}"
                )
        if start.shuffle is not None and self.config.shuffle_buffer == 0:
            raise DataError("cannot resume: the position has shuffle state but the dataset does not shuffle")
        order = self.order(start.epoch)
        if start.file_index < len(order):
            path = self.shard.paths[order[start.file_index]]
            if path != start.path:
                raise DataError(
                    f"cannot resume: the position is in file {start.file_index} = {start.path!r} of epoch "
                    f"{start.epoch}, but this worker's file {start.file_index} is {path!r} (did the files change?)"
                )
        elif start.file_index > len(order):
            raise DataError(f"cannot resume: file_index {start.file_index} is past this worker's {len(order)} files")

    def __call__(self, start: ReaderPosition) -> Iterator[_Item]:
        epoch = start.epoch
        fresh = (start.file_index, start.offset, start.records_consumed, start.shuffle) == (0, 0, 0, None)
        resume: ReaderPosition | None = None if fresh else start
        while self.config.num_epochs is None or epoch < self.config.num_epochs:
            self.counters.new_epoch()
            produced = False
            for item in self._epoch(epoch, resume):
                produced = True
                yield item
            if not produced and resume is None and self.config.num_epochs is None:
                raise DataError(
                    f"worker {self.config.worker_index}'s share of {list(self.shard.paths)} gives no batch in an "
                    "epoch (no records, or fewer than batch_size with drop_remainder); with num_epochs=None it "
                    "would never yield a batch"
                )
            epoch, resume = epoch + 1, None

    def start_position(self, epoch: int = 0) -> ReaderPosition:
        """The position before the first record of ``epoch`` (default 0)."""
        return self._position(epoch, self.order(epoch), 0, 0, 0, None)

    def _position(self, epoch: int, order: list[int], fi: int, record: int, offset: int, state: ShuffleState | None) -> ReaderPosition:
        path = self.shard.paths[order[fi]] if fi < len(order) else ""
        return replace(self.template, epoch=epoch, file_index=fi, path=path, offset=offset, record_index=record, shuffle=state)

    def _read(self, epoch: int, order: list[int], resume: ReaderPosition | None) -> Iterator[ReadPiece]:
        fi0 = resume.file_index if resume else 0
        seq = resume.shuffle.first_seq if resume and resume.shuffle else 0
        for fi in range(fi0, len(order)):
            k = order[fi]
            path = self.shard.paths[k]
            at_start = resume is not None and fi == fi0
            pieces = iter_file(
                self.config,
                path,
                start_record=resume.record_index if at_start and resume else 0,
                start_offset=resume.offset if at_start and resume else 0,
                stride=self.shard.record_stride,
                first=self.shard.first_records[k],
                on_bad=self.counters.on_bad,
            )
            for piece in pieces:
                n = piece.batch.num_examples
                self.counters.read(path, n)
                rows = Rows(
                    piece.batch,
                    np.full(n, fi, dtype=np.int64),
                    piece.record_index,
                    piece.offsets,
                    np.arange(seq, seq + n, dtype=np.int64),
                )
                seq += n
                yield ReadPiece(rows, fi, piece.end_record, piece.end_offset, piece.eof)

    def _epoch(self, epoch: int, resume: ReaderPosition | None) -> Iterator[_Item]:
        order = self.order(epoch)
        reads = self._read(epoch, order, resume)
        pieces: Iterator[OutPiece]
        if self.config.shuffle_buffer > 0:
            pieces = shuffle_rows(
                (p.rows for p in reads if len(p.rows)),
                capacity=self.config.shuffle_buffer,
                keep=self.config.effective_min_after_dequeue,
                seed=(self.config.seed, self.config.worker_index, epoch),
                position=lambda fi, r, o, st: self._position(epoch, order, fi, r, o, st),
                resume=resume.shuffle if resume else None,
            )
        else:
            pieces = sequential_pieces(reads, lambda fi, r, o: self._position(epoch, order, fi, r, o, None))
        sources = _Sources([self.shard.paths[k] for k in order], epoch, line_based=self.config.format != "tfrecord")
        return _batch(pieces, self.config.batch_size, self.config.drop_remainder, resume.records_consumed if resume else 0,
                      sources)


class _Sources:
    """Makes each batch's :class:`BatchSource` from where its rows were read (numpy only, no per-row Python)."""

    def __init__(self, paths: Sequence[str], epoch: int, *, line_based: bool) -> None:
        self.paths, self.epoch, self.line_based = paths, epoch, line_based
        self.base = 1 if line_based else 0  # text: 1-based line numbers, as errors name them

    def __call__(self, files: npt.NDArray[np.int64], records: npt.NDArray[np.int64]) -> BatchSource:
        """The source of rows read from epoch files ``files`` (index in the epoch's order) at ``records``."""
        base = self.base
        spans: tuple[tuple[str, int, int, int], ...]
        if (files == files[0]).all():  # one file: the usual case
            spans = ((self.paths[int(files[0])], int(records.min()) + base, int(records.max()) + base, len(records)),)
            return BatchSource(spans, 1, self.epoch, self.line_based)
        order = np.lexsort((records, files))
        files, records = files[order], records[order]
        starts = np.flatnonzero(np.diff(files, prepend=files[0] - 1))
        ends = np.append(starts[1:], len(files))
        shown = slice(0, BatchSource.MAX_SPANS)
        spans = tuple((self.paths[int(f)], int(a) + base, int(b) + base, int(n)) for f, a, b, n in zip(
            files[starts[shown]], records[starts[shown]], records[ends[shown] - 1], (ends - starts)[shown], strict=True))
        return BatchSource(spans, len(starts), self.epoch, self.line_based)


def _batch(pieces: Iterator[OutPiece], batch_size: int, drop_remainder: bool, consumed: int,
           sources: _Sources) -> Iterator[_Item]:
    """Cuts pieces into batches, each with its source; the last, short batch is kept unless ``drop_remainder``."""
    queue: deque[list[Any]] = deque()  # [piece, first unused row]
    ready = 0
    finished = False
    while True:
        if not finished and ready < batch_size:
            piece = next(pieces, None)
            if piece is None:
                finished = True
            else:
                queue.append([piece, 0])
                ready += piece.batch.num_examples
                continue
        if ready == 0 or (ready < batch_size and (not finished or drop_remainder)):
            if finished:
                return
            continue
        want = min(batch_size, ready)
        parts, files, records = [], [], []
        last: list[Any] = queue[0]
        while want:
            last = queue[0]
            piece, start = last
            take = min(want, piece.batch.num_examples - start)
            if take:
                parts.append(piece.batch.slice(start, start + take))
                files.append(piece.file_index[start : start + take])
                records.append(piece.record[start : start + take])
            last[1] = start + take
            want -= take
            if last[1] == piece.batch.num_examples:
                queue.popleft()
        batch = Batch.concat(parts)
        if len(parts) == 1:
            batch.source = sources(files[0], records[0])
        else:
            batch.source = sources(np.concatenate(files), np.concatenate(records))
        ready -= batch.num_examples
        consumed += batch.num_examples
        position = last[0].position_after(last[1])
        yield batch, replace(position, records_consumed=consumed)


class Dataset:
    """A worker's stream of :class:`Batch`, over epochs.

    An iterator and a context manager.  Iteration (``next``) blocks until the
    next batch is ready and ends with ``StopIteration`` after the last epoch.
    Use from one thread; :meth:`position`, :attr:`stats` and :meth:`close` may
    be called from any thread.  Create with :func:`open_dataset`.
    """

    def __init__(self, config: DatasetConfig, *, start: bool, resume_from: ReaderPosition | None = None,
                 prepare: Prepare | None = None) -> None:
        self.config = config
        self.shard = shard_plan(expand_paths(config.paths), config.num_workers)[config.worker_index]
        self._counters = _Counters(config)
        self._pipeline = _Pipeline(config, self.shard, self._counters, origin=resume_from)
        self._prepare = prepare
        first = resume_from if resume_from is not None else self._pipeline.start_position()
        if resume_from is not None:
            self._pipeline.check(resume_from)
        self._position = first
        self._closed = False
        self._failure: BaseException | None = None
        self._child_stats: DatasetStats | None = None  # the reader process's counters, as of the last batch
        self._source: Prefetcher[_Item] | ReaderProcess[_CountedItem] | Iterator[_Item]
        if config.prefetch > 0 and config.reader_process:
            self._source = ReaderProcess(lambda: self._counted(first), max(config.prefetch, PROCESS_DEPTH),
                                         (_take_apart, _rebuild), name=f"psflow-reader-w{config.worker_index}",
                                         start=start, slot_bytes=PROCESS_SLOT_BYTES)
        elif config.prefetch > 0:
            self._source = Prefetcher(lambda: self._prepared(first), config.prefetch, name=f"psflow-data-w{config.worker_index}")
            if start:
                self._source.start()
        else:
            self._source = self._prepared(first)

    def _prepared(self, first: ReaderPosition) -> Iterator[_Item]:
        """The pipeline's items, each batch passed through ``prepare`` (if given)."""
        prepare = self._prepare
        if prepare is None:
            return self._pipeline(first)
        return ((_keep_source(prepare(batch), batch), position) for batch, position in self._pipeline(first))

    def _counted(self, first: ReaderPosition) -> Iterator[_CountedItem]:
        """The pipeline's items with the counters after each (runs in the reader process)."""
        for batch, position in self._prepared(first):
            yield batch, position, self._counters.snapshot()

    def start(self) -> None:
        """Starts the prefetch thread or reader process if not yet started (iteration starts it too).  Idempotent."""
        if isinstance(self._source, (Prefetcher, ReaderProcess)):
            self._source.start()

    @property
    def reader_pid(self) -> int | None:
        """The reader process's pid (``reader_process`` only, once started); None otherwise."""
        return self._source.pid if isinstance(self._source, ReaderProcess) else None

    def __iter__(self) -> Dataset:
        return self

    def __next__(self) -> Batch:
        """Returns the next batch.

        Raises:
            StopIteration: after the last batch of the last epoch.
            BadRecordError: a bad record (unless skipping).
            TooManyBadRecordsError: too many skipped in one epoch.
            DataError: the dataset is closed, or files cannot be read.
        """
        if self._closed:
            raise DataError("the dataset is closed")
        if isinstance(self._source, ReaderProcess):
            batch, position, self._child_stats = self._source.get()  # re-raises a failure on every later call too
        elif isinstance(self._source, Prefetcher):
            batch, position = self._source.get()  # re-raises a failure on every later call too
        else:
            if self._failure is not None:
                raise self._failure
            try:
                batch, position = next(self._source)
            except StopIteration:
                raise
            except BaseException as e:
                self._failure = e  # as with prefetch: a failed dataset keeps failing, it does not just end
                raise
        self._position = position
        self._counters.batches += 1
        return batch

    def position(self) -> ReaderPosition:
        """The position just after the last batch handed out (the start position before any)."""
        return self._position

    @property
    def stats(self) -> DatasetStats:
        """Counters since open (the reader may be ahead of the batches handed out; with a
        reader process, as of the last batch handed out)."""
        if self._child_stats is not None:
            return replace(self._child_stats, batches=self._counters.batches)
        return self._counters.snapshot()

    def close(self) -> None:
        """Stops the prefetch thread and closes files.  Idempotent; returns promptly."""
        if self._closed:
            return
        self._closed = True
        if isinstance(self._source, (Prefetcher, ReaderProcess)):
            self._source.close()
        else:
            close = getattr(self._source, "close", None)
            if close is not None:
                close()

    def __enter__(self) -> Dataset:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def open_dataset(config: DatasetConfig, *, start: bool, resume_from: ReaderPosition | None = None,
                 prepare: Prepare | None = None) -> Dataset:
    """Opens a worker's dataset.

    Args:
        config: what to read.
        start: start the prefetch thread now (otherwise on first iteration).
        resume_from: a position from :meth:`Dataset.position` of a run with
            the same config; the dataset then yields exactly the records that
            run had not yet handed out, in the same order.
        prepare: applied to every batch where it is made (the prefetch thread,
            the reader process, or the consumer's thread), before it is handed
            out: work moved off the training loop.  It must return a batch
            with the same rows (it may add :attr:`Batch.extras`); with a
            reader process it runs in the child, so it must not rely on side
            effects in the parent.

    Raises:
        DataError: no file matches, or ``resume_from`` does not fit the config.
    """
    return Dataset(config, start=start, resume_from=resume_from, prepare=prepare)


def epoch_start(config: DatasetConfig, epoch: int, *, resharded: int) -> ReaderPosition:
    """The position before ``epoch`` of ``config``'s worker share, with ``start_epoch`` ``epoch`` and ``resharded``
    (:class:`~psflow.data.api.ReaderPosition`), which every position after it keeps: resumed from
    (``open_dataset(config, ..., resume_from=...)``), it reads epochs ``epoch`` to the last, none past them.

    Raises:
        DataError: no file matches.
    """
    if epoch < 0:
        raise DataError(f"epoch must be >= 0, got {epoch}")
    shard = shard_plan(expand_paths(config.paths), config.num_workers)[config.worker_index]
    return _Pipeline(config, shard, _Counters(config), origin=ReaderPosition(start_epoch=epoch, resharded=resharded)).start_position(epoch)


def read_all(paths: Sequence[str] | str, format: str, **options: Any) -> Batch:
    """Reads whole files into one batch, in sorted file order (for evaluation).

    Args:
        paths: files or glob patterns.
        format: ``"libsvm"``, ``"tfrecord"`` or ``"criteo"``.
        **options: other :class:`DatasetConfig` fields (``schema``,
            ``num_features``, ``skip_bad_records``, ``compression``, ...).

    Raises:
        DataError, BadRecordError, TooManyBadRecordsError: as for iteration.
    """
    if isinstance(paths, str):
        paths = (paths,)
    options = {"batch_size": 1 << 16, "prefetch": 0, **options}
    config = DatasetConfig(tuple(paths), format, **options)
    with open_dataset(config, start=False) as dataset:
        batches = list(dataset)
    return Batch.concat(batches) if batches else empty_batch(config)
