"""Many partitions' arrays as a few: how a push, a pull and a pull's reply carry the rows and values of tens of
partitions without an array each.

A Wide & Deep step touches 52 table partitions: sent one array per partition, its push-and-pull frame held 164
arrays, and each array costs a few microseconds of Python to frame and as many to read back, on both sides, every
step. Stacked, the same frame holds a dozen: a partition's rows and values become ranges of a few stacked arrays,
named in the meta by ``(block, start, count)``.

* :class:`Stacker` stacks (the sender): each distinct rows array once (partitions looked up by the same ids
  -- a wide and a deep table over one feature -- share their range), and values by dtype and row shape, one
  block each, in the order given. Stacking copies the parts once into the blocks.
* :func:`cut` reads a range back (the receiver): a view of the block, no copy; every field is checked first, and
  a bad one raises :class:`~psflow.rpc.api.InvalidRequest` naming it.

What the receiver gets is what separate arrays would have given: the same values, shapes and dtypes, views of the
received frame (read-only, but a tcp client's reply: writable, its own, so a reply's ranges may not overlap).
The messages of :mod:`psflow.ps.protocol.data` and :mod:`psflow.ps.protocol.push` decide what they stack
(:func:`stack_grads`, :func:`stack_rows`; a pull reply's values: :func:`stack_values`, read back by
:func:`values_of`); a sender may always send one array per partition instead, and the receiver reads both forms.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from psflow.ps.protocol.fields import list_field
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

__all__ = [
    "STACKED_VALUES", "STACK_MAX_BYTES", "Stacker", "blocks_of", "cut", "stack_grads", "stack_rows", "stack_values",
    "stackable_rows", "values_of",
]

#: The array names of a pull reply's stacked values: this prefix and the block's number.
STACKED_VALUES = "vs/"


def stackable_rows(rows: np.ndarray) -> bool:
    """Whether ``rows`` may go into a stacked rows array: int64 ids, one dimension (what a plan sends)."""
    return type(rows) is np.ndarray and rows.dtype == np.int64 and rows.ndim == 1


class Stacker:
    """The stacked arrays of one message, filled part by part (see the module docstring). Not thread-safe."""

    def __init__(self) -> None:
        self._rows: list[np.ndarray] = []
        self._rows_at: dict[int, int] = {}  # id() of a rows array given -> its start in the stacked rows
        self._num_rows = 0
        self._blocks: dict[tuple[np.dtype[Any], tuple[int, ...]], int] = {}  # (dtype, row shape) -> block
        self._values: list[list[np.ndarray]] = []
        self._lengths: list[int] = []

    def rows(self, rows: np.ndarray) -> int:
        """Where ``rows`` (int64, one dimension: :func:`stackable_rows`) start in the stacked rows. The same array
        object given again is stacked once; it must not change until :meth:`stacked_rows` was called."""
        start = self._rows_at.get(id(rows))
        if start is None:
            start = self._rows_at[id(rows)] = self._num_rows
            self._rows.append(rows)
            self._num_rows += rows.shape[0]
        return start

    def values(self, values: np.ndarray) -> tuple[int, int]:
        """``(block, start)``: where ``values`` (at least one dimension) go among the stacked values."""
        key = (values.dtype, values.shape[1:])
        block = self._blocks.get(key)
        if block is None:
            block = self._blocks[key] = len(self._values)
            self._values.append([])
            self._lengths.append(0)
        start = self._lengths[block]
        self._values[block].append(values)
        self._lengths[block] = start + values.shape[0]
        return block, start

    def stacked_rows(self) -> np.ndarray | None:
        """Every distinct rows array given, one after another (None: none was given)."""
        if not self._rows:
            return None
        return self._rows[0] if len(self._rows) == 1 else np.concatenate(self._rows)

    def stacked_values(self) -> list[np.ndarray]:
        """Each block's values, one after another, in block order."""
        return [parts[0] if len(parts) == 1 else np.concatenate(parts) for parts in self._values]


def cut(block: np.ndarray | None, start: Any, count: Any, key: str, what: str) -> np.ndarray:
    """``block[start:start + count]`` (a view), after checking that the range lies inside it.

    Args:
        block: the stacked array (None: the frame lacks it).
        start, count: the range, as the frame's meta gave them.
        key, what: the partition and the array, for the error (``partition 'emb/part_0': stacked rows``).

    Raises:
        InvalidRequest: the block is missing or has no dimension, or the range is not two non-negative
            integers inside it (names the partition, the array and the values).
    """
    # (one test on the hot path: a push cuts about a hundred ranges)
    if (block is not None and type(start) is int and type(count) is int and block.ndim and 0 <= start
            and 0 <= count and start + count <= block.shape[0]):
        return block[start:start + count]
    if block is None:
        raise InvalidRequest(f"partition {key!r:.80}: {what}: the stacked array is missing")
    if block.ndim == 0:
        raise InvalidRequest(f"partition {key!r:.80}: {what}: the stacked array has no rows (a 0-d array)")
    raise InvalidRequest(f"partition {key!r:.80}: {what}: range {start!r:.20} + {count!r:.20} is not inside the "
                         f"stacked array's {block.shape[0]} rows")


#: A pull reply's values of more bytes than this travel as they are, unstacked: stacking saves a per-array cost
#: that only small arrays feel, and copying a whole large variable (an export's read) would double it on the ps.
STACK_MAX_BYTES = 1 << 20


def stack_values(values: Mapping[str, np.ndarray], meta: dict[str, Any]) -> dict[str, np.ndarray]:
    """A pull reply's arrays: several values of at most :data:`STACK_MAX_BYTES` stacked by dtype and row shape
    (``meta["stacked"]``: per partition ``[key, block, start, count]``); the others (all of them when fewer than
    two are small, a value has no dimension, or a key could be taken for a block's name) one array per
    partition, named by its key."""
    small: list[tuple[str, np.ndarray]] = []
    out: dict[str, np.ndarray] = {}  # the large values, as they are
    for key, value in values.items():
        if type(value) is not np.ndarray or not value.ndim or key.startswith(STACKED_VALUES):
            return dict(values)
        if value.nbytes <= STACK_MAX_BYTES:
            small.append((key, value))
        else:
            out[key] = value
    if len(small) < 2:
        return dict(values)
    stack = Stacker()
    entries = []
    for key, value in small:
        block, start = stack.values(value)
        entries.append([key, block, start, value.shape[0]])
    meta["stacked"] = entries
    out.update((f"{STACKED_VALUES}{block}", v) for block, v in enumerate(stack.stacked_values()))
    return out


def values_of(frame: Frame) -> Mapping[str, np.ndarray]:
    """The values of a pull reply's frame by partition key (views of the frame; stacked ones cut out).

    A block's ranges come in order and never overlap (what :func:`stack_values` sends): a client that decodes
    its reply as writable views (:func:`psflow.rpc.framing.decode`) hands each partition's values to its caller
    as that caller's own array, and two of them must not share bytes.

    Raises:
        InvalidRequest: a stacked entry that is malformed, lies outside its block or overlaps the block's
            previous range (names the partition).
    """
    entries = frame.meta.get("stacked")
    if entries is None:
        return frame.arrays
    arrays = frame.arrays
    values = {key: a for key, a in arrays.items() if not key.startswith(STACKED_VALUES)}
    blocks = blocks_of(arrays, STACKED_VALUES)
    ends: dict[int, int] = {}  # block -> where its last range ended
    for item in list_field(frame.meta, "stacked"):
        if type(item) is not list or len(item) != 4 or type(item[0]) is not str or type(item[1]) is not int:
            raise InvalidRequest(f"stacked value entry {item!r:.60} must be [name, block, start, count]")
        key, block, start, count = item
        values[key] = cut(blocks.get(block), start, count, key, "stacked values")
        end = ends.get(block, 0)
        if start < end:
            raise InvalidRequest(f"partition {key!r:.80}: stacked values: range {start} + {count} of block {block} "
                                 f"overlaps the block's previous range (which ends at {end})")
        ends[block] = start + count
    return values


def stack_grads(grads: Sequence[tuple[str, Any, np.ndarray | None]]) -> bool:
    """Whether a push stacks its sparse gradients: several, each of int64 rows and values of one row per id."""
    sparse = 0
    for _, values, rows in grads:
        if rows is None:
            continue
        if not (stackable_rows(rows) and type(values) is np.ndarray and values.ndim and values.shape[0] == rows.shape[0]):
            return False
        sparse += 1
    return sparse > 1


def stack_rows(parts: Sequence[tuple[str, np.ndarray | None]]) -> bool:
    """Whether a pull stacks its rows: several partitions read by rows, each int64 ids."""
    rows = [r for _, r in parts if r is not None]
    return len(rows) > 1 and all(stackable_rows(r) for r in rows)


def blocks_of(arrays: Mapping[str, np.ndarray], prefix: str) -> dict[int, np.ndarray]:
    """The stacked blocks among a frame's arrays (named ``prefix`` and the block's number), by number."""
    out: dict[int, np.ndarray] = {}
    for name, array in arrays.items():
        number = name[len(prefix):]
        if name.startswith(prefix) and number.isascii() and number.isdigit():
            out[int(number)] = array
    return out
