"""The record shuffle buffer, deterministic and resumable.

Semantics (``capacity = shuffle_buffer``, ``keep = min_after_dequeue``), like
TensorFlow's ``shuffle_batch`` queue with a producer that is never slower
than the consumer:

1. Records enter the buffer in read order until it holds ``capacity``
   records or the epoch's input runs out.
2. A *draw* picks records uniformly at random, without replacement, until
   ``keep`` remain (all of them when the input has run out); the picked
   records are handed on in the order picked.
3. Repeat until the buffer is empty; then the epoch ends.

With ``keep = capacity - 1`` this is ``tf.data``'s ``shuffle(capacity)``
(one in, one out); smaller ``keep`` draws in larger bursts, which is cheaper
per record.  Draw ``b`` of epoch ``e`` uses a generator seeded by
``(seed, worker, e, b)``, and the buffer is kept in read order, so the output
is a function of the input records and those numbers only: a run resumed
from a :class:`~psflow.data.api.ShuffleState` rebuilds the buffer of the
current draw from the file and continues exactly where it stopped.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from psflow.data.api import DataError, ReaderPosition, ShuffleState
from psflow.data.batch import Batch

__all__ = ["Rows", "ReadPiece", "OutPiece", "shuffle_rows", "sequential_pieces"]

_BURST_TAG = 0x53485546  # keeps draw seeds apart from file-order seeds


@dataclass
class Rows:
    """Records with where they came from.

    Attributes:
        batch: the records.
        file_index: int64 per row: index in the epoch's file order.
        record: int64 per row: record (line) index in its file.
        offset: int64 per row: byte offset in its file.
        seq: int64 per row: sequence number among the epoch's records.
    """

    batch: Batch
    file_index: npt.NDArray[np.int64]
    record: npt.NDArray[np.int64]
    offset: npt.NDArray[np.int64]
    seq: npt.NDArray[np.int64]

    def __len__(self) -> int:
        return self.batch.num_examples

    def take(self, rows: npt.NDArray[np.int64]) -> Rows:
        """The given rows, in the given order."""
        return Rows(self.batch.take(rows), self.file_index[rows], self.record[rows], self.offset[rows], self.seq[rows])

    def slice(self, start: int, stop: int) -> Rows:
        """Rows ``[start, stop)``."""
        return Rows(
            self.batch.slice(start, stop),
            self.file_index[start:stop],
            self.record[start:stop],
            self.offset[start:stop],
            self.seq[start:stop],
        )

    @staticmethod
    def concat(parts: list[Rows]) -> Rows:
        """Row-wise concatenation of a non-empty list."""
        if len(parts) == 1:
            return parts[0]
        return Rows(
            Batch.concat([p.batch for p in parts]),
            np.concatenate([p.file_index for p in parts]),
            np.concatenate([p.record for p in parts]),
            np.concatenate([p.offset for p in parts]),
            np.concatenate([p.seq for p in parts]),
        )


@dataclass
class OutPiece:
    """Records ready for batching, and where the reader stands after any prefix of them.

    ``position_after(m)`` is the resume point after the first ``m`` rows were
    handed out (``records_consumed`` is left for the batcher to fill in).
    ``file_index`` and ``record`` say where each row was read (as in :class:`Rows`),
    for the batches' :class:`~psflow.data.batch.BatchSource`.
    """

    batch: Batch
    position_after: Callable[[int], ReaderPosition]
    file_index: npt.NDArray[np.int64]
    record: npt.NDArray[np.int64]


@dataclass
class ReadPiece:
    """A reader piece in the epoch stream: rows of file ``file_index`` and where the stretch ends."""

    rows: Rows
    file_index: int
    end_record: int
    end_offset: int
    eof: bool


def sequential_pieces(stream: Iterator[ReadPiece], position: Callable[[int, int, int], ReaderPosition]) -> Iterator[OutPiece]:
    """Pieces in read order (no shuffling).

    Args:
        stream: the epoch's reader pieces.
        position: ``(file_index, record, offset)`` -> position.
    """
    for piece in stream:
        yield OutPiece(piece.rows.batch, _after_rows(piece, position), piece.rows.file_index, piece.rows.record)


def _after_rows(piece: ReadPiece, position: Callable[[int, int, int], ReaderPosition]) -> Callable[[int], ReaderPosition]:
    rows = piece.rows

    def after(m: int) -> ReaderPosition:
        if m < len(rows):
            return position(piece.file_index, int(rows.record[m]), int(rows.offset[m]))
        if piece.eof:
            return position(piece.file_index + 1, 0, 0)
        return position(piece.file_index, piece.end_record, piece.end_offset)

    return after


def shuffle_rows(
    stream: Iterator[Rows],
    *,
    capacity: int,
    keep: int,
    seed: tuple[int, ...],
    position: Callable[[int, int, int, ShuffleState], ReaderPosition],
    resume: ShuffleState | None = None,
) -> Iterator[OutPiece]:
    """Shuffles an epoch's records (see the module docstring).

    Args:
        stream: the epoch's records in read order, with sequence numbers; when
            resuming, starting at the record with sequence ``resume.first_seq``.
        capacity: buffer capacity (>= 1).
        keep: records left after each draw (0 <= keep < capacity).
        seed: ``(seed, worker, epoch)``; the draw index is appended.
        position: ``(file_index, record, offset, state)`` -> position.
        resume: state to continue from, or None for a fresh epoch.

    Raises:
        DataError: the files no longer hold the records ``resume`` names.
    """
    pending: deque[Rows] = deque()
    burst, skip = 0, 0
    if resume is not None:
        buffer, leftover = _rebuild(stream, resume)
        if leftover is not None:
            pending.append(leftover)
        burst, skip = resume.burst, resume.taken
        drawn = True
    else:
        buffer, drawn = None, False
    exhausted = False
    while True:
        if not drawn:
            buffer, exhausted = _fill(buffer, pending, stream, capacity, exhausted)
        drawn = False
        if buffer is None or len(buffer) == 0:
            return
        size = len(buffer)
        count = size - keep if size == capacity else size
        perm = np.random.default_rng([_BURST_TAG, *seed, burst]).permutation(size)
        state = _state(buffer.seq, burst)
        out = buffer.take(perm[skip:count])
        yield OutPiece(out.batch, _after_draw(buffer, state, skip, position), out.file_index, out.record)
        buffer = buffer.take(np.sort(perm[count:]))
        burst, skip = burst + 1, 0


def _fill(buffer: Rows | None, pending: deque[Rows], stream: Iterator[Rows], capacity: int, exhausted: bool) -> tuple[Rows | None, bool]:
    parts = [buffer] if buffer is not None and len(buffer) else []
    size = len(buffer) if buffer is not None else 0
    while size < capacity:
        if not pending:
            nxt = None if exhausted else next(stream, None)
            if nxt is None:
                exhausted = True
                break
            pending.append(nxt)
        head = pending.popleft()
        room = capacity - size
        if len(head) > room:
            pending.appendleft(head.slice(room, len(head)))
            head = head.slice(0, room)
        parts.append(head)
        size += len(head)
    return (Rows.concat(parts) if parts else None), exhausted


def _state(seqs: npt.NDArray[np.int64], burst: int) -> ShuffleState:
    first = int(seqs[0])
    span = int(seqs[-1]) - first + 1
    bits = np.zeros(span, dtype=np.uint8)
    bits[seqs - first] = 1
    return ShuffleState(burst, first, span, np.packbits(bits, bitorder="little").tobytes(), 0)


def _after_draw(
    buffer: Rows, state: ShuffleState, skip: int, position: Callable[[int, int, int, ShuffleState], ReaderPosition]
) -> Callable[[int], ReaderPosition]:
    fi, record, offset = int(buffer.file_index[0]), int(buffer.record[0]), int(buffer.offset[0])

    def after(m: int) -> ReaderPosition:
        taken = ShuffleState(state.burst, state.first_seq, state.num_seqs, state.members, skip + m)
        return position(fi, record, offset, taken)

    return after


def _rebuild(stream: Iterator[Rows], state: ShuffleState) -> tuple[Rows, Rows | None]:
    """Reads the records of ``state``'s draw back into a buffer; returns it and the rows read past it."""
    bits = np.unpackbits(np.frombuffer(state.members, dtype=np.uint8), bitorder="little")[: state.num_seqs]
    members = bits.astype(bool)
    limit = state.first_seq + state.num_seqs
    parts: list[Rows] = []
    leftover: Rows | None = None
    for rows in stream:
        inside = rows.seq < limit
        sel = np.flatnonzero(inside)
        sel = sel[members[rows.seq[sel] - state.first_seq]]
        parts.append(rows.take(sel))
        if not inside.all():
            leftover = rows.take(np.flatnonzero(~inside))
            break
    buffer = Rows.concat(parts) if parts else None
    if buffer is None or len(buffer) != int(members.sum()) or len(buffer) == 0:
        raise DataError(
            f"cannot resume the shuffle buffer: the position names {int(members.sum())} buffered records, "
            f"the files hold {0 if buffer is None else len(buffer)} of them (did the files change?)"
        )
    return buffer, leftover
