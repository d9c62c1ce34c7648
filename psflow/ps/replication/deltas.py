"""What a state change wrote to a partition, captured on the primary and written on a backup, bit for bit.

A :class:`~psflow.ps.protocol.PartDelta` names its arrays:

* ``value``, ``slot/<name>`` (each optimizer slot), ``average`` (the moving average): the rows ``rows`` of
  each (``rows`` None: the whole array). Only the rows a push wrote are copied -- all of them where the
  optimizer's sparse update moves every row (non-lazy Adam); an optimizer's 0-d state (Adam's beta powers)
  always whole.
* ``pack/<name>|<name>|...``: (a capture of rows) the arrays so named, stacked along a new first axis (one
  array of shape ``(k, len(rows), ...)`` in place of ``k``): a partition's value, slots and average when they
  share a dtype and a row shape, as every built-in optimizer's do. One array in place of two or three per
  partition (a W&D push: ~120 arrays in place of ~200) saves the per-array work of framing, decoding and
  writing, which was most of a backup's cost per push for layouts of many small partitions.
* ``marks``: a lazy partition's materialized marks (:mod:`psflow.ps.lazy_rows`), with a whole capture: the
  backup's partition (lazy too, from the same registration) takes them, so the rows the primary had not built
  yet are built on the backup from their initial values on first touch, as on the primary. A write of rows
  of the value marks those rows built; a whole write of the value without marks, every row.
* ``rows/<name>``: what a change did to a dynamic table, row by row
  (:meth:`~psflow.ps.dynamic.DynamicTable.take_changes`: the rows of the ids admitted, touched or
  updated since the table's previous capture, with their slots and metadata, and the ids evicted);
  ``table/<name>``: its whole snapshot (a full entry, and a table's first capture).
  For a 100,000-row table (dim 8, Adagrad) a push touching 1,000 ids sends about 100 KB of rows where
  the whole table took 8.8 MB (tests/unit/ps/replication/test_table_rows.py measures it).

A backup that holds several entries not yet written writes each partition's deltas of them coalesced
(:func:`coalesce`): a delta holds the rows' whole state after its change, so of rows written by several deltas
only the newest version is written, and a whole array written again later is written once.

Guarantees: :func:`capture` reads each partition under its lock (a whole update, never half of one) and
returns copies; :func:`write` writes them under the partition's lock. Writing :func:`coalesce`'s deltas leaves
a partition bit-equal to writing the deltas given, in order. Capturing rows ``R`` of the primary's
partition and writing them on a backup whose partition has the same shape makes those rows bit-equal. A
dynamic table's captures, written in the order they were taken, leave the backup's table with the
primary's rows, slots and metadata as of the newest.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from psflow.native.loader import load_extension
from psflow.ps.dynamic.snapshots import check_counts
from psflow.ps.protocol import PartDelta
from psflow.ps.store import ParameterStore, PartitionState, StoreError
from psflow.rpc.api import InvalidRequest

__all__ = ["capture", "capture_averages", "capture_table", "coalesce", "merges_little", "write"]

_VALUE, _AVERAGE, _SLOT, _TABLE, _ROWS, _MARKS = "value", "average", "slot/", "table/", "rows/", "marks"
_PACK, _PACKED = "pack/", "|"  # "pack/value|slot/accumulator": those arrays' rows, stacked
#: Deltas of rows are merged (:func:`coalesce`) only while they carry this many rows each on average at most:
#: the merge sorts the rows, which costs more than it saves for a push of many rows that seldom repeat (sparse
#: LR's ~20,000 of 2^20 per push), and saves the per-write work of partitions written a few hundred rows at a
#: time (W&D's 52 tables; profile_replica_push.py).
_MERGE_ROWS = 2048
#: The C loop that writes a ``pack/`` array's rows into the arrays it stacks in one call (``scatter_rows`` of
#: ``psflow.ps._kernels``), or None: numpy then (the same bytes). Its twin for the capture (a gather into the
#: stack) was measured no cheaper than numpy's ``take`` with ``out=`` here, and is not used.
_SCATTER_ROWS = getattr(load_extension("psflow.ps._kernels"), "scatter_rows", None)


def capture(part: PartitionState, rows: np.ndarray | None, *, averages: bool = True) -> PartDelta:
    """Copies of what partition ``part`` holds at ``rows`` (None: everything): value, slots, and the moving
    average unless ``averages`` is False; of a dynamic table, its whole snapshot when ``rows`` is None, else
    its changes since the previous capture (:func:`capture_table`)."""
    if part.table is not None:
        if rows is None:
            return PartDelta(part.key, None, {_TABLE + k: v for k, v in part.table.snapshot(counts=True).items()})
        return capture_table(part)
    if rows is not None and part.optimizer is not None and part.optimizer.sparse_touches_all_rows:
        rows = None
    arrays: dict[str, np.ndarray] = {}
    with part.lock:
        sources = {_VALUE: part.value, **{_SLOT + name: slot for name, slot in part.slots.items()}}
        if averages and part.average is not None:
            sources[_AVERAGE] = part.average
        if rows is not None:
            _pack(sources, rows, arrays)
        for name, array in sources.items():
            # np.take, not array[rows]: the same rows, 1.2x (dim 1) to 7x (dim 8) less CPU
            arrays[name] = array.copy() if rows is None or array.ndim == 0 else np.take(array, rows, axis=0)
        if rows is None and part.lazy is not None:
            arrays[_MARKS] = part.lazy.marks.copy()
    return PartDelta(part.key, rows, arrays)


def _pack(sources: dict[str, np.ndarray], rows: np.ndarray, arrays: dict[str, np.ndarray]) -> None:
    """Moves the arrays of ``sources`` that share the value's dtype and row shape (two or more) into one
    ``pack/`` array of ``arrays``: their ``rows``, stacked (the caller holds the partition's lock)."""
    value = sources[_VALUE]
    names = [n for n, a in sources.items() if a.ndim > 0 and a.dtype == value.dtype and a.shape[1:] == value.shape[1:]]
    if len(names) < 2 or value.ndim == 0:
        return
    stacked = np.empty((len(names), len(rows), *value.shape[1:]), value.dtype)
    for i, name in enumerate(names):
        # mode="wrap": out= without numpy's buffered copy (mode="raise" buffers); the rows are the partition's,
        # checked when the push that wrote them was applied
        np.take(sources.pop(name), rows, axis=0, out=stacked[i], mode="wrap")
    arrays[_PACK + _PACKED.join(names)] = stacked


def capture_table(part: PartitionState) -> PartDelta:
    """A dynamic table's changes since its previous capture (its whole snapshot the first time)."""
    if part.table is None:
        raise InvalidRequest(f"{part.describe} is not a dynamic table")
    whole, arrays = part.table.take_changes()
    prefix = _TABLE if whole else _ROWS
    return PartDelta(part.key, None, {prefix + k: v for k, v in arrays.items()})


def capture_averages(store: ParameterStore, skip: set[str]) -> list[PartDelta]:
    """The whole moving average of every averaged partition not in ``skip`` (a step moves every one)."""
    out = []
    for part in store.partitions():
        if part.average is not None and part.key not in skip:
            with part.lock:
                out.append(PartDelta(part.key, None, {_AVERAGE: part.average.copy()}))
    return out


def coalesce(deltas: list[PartDelta]) -> list[PartDelta]:
    """Deltas of one partition, in the order written, as fewer deltas whose writing, in order, leaves the
    partition bit-equal: a whole write of arrays (no rows) drops the earlier deltas whose arrays it rewrites;
    consecutive deltas of rows that carry the same arrays become one, of each row its newest version. A dynamic
    table's deltas, and deltas that do not fit each other (or the partition: :func:`write` names the error),
    are kept as they are."""
    out: list[PartDelta] = []
    runs: list[list[PartDelta]] = []  # out's items as runs of deltas of rows to merge (one delta: as it is)
    for delta in deltas:
        if _is_table(delta):
            runs.append([delta])
            continue
        if delta.rows is None:
            written = set(delta.arrays)
            runs = [run for run in runs if _is_table(run[0]) or not _rewrites(written, run[0])]
            runs.append([delta])
            continue
        if runs and runs[-1][0].rows is not None and not _is_table(runs[-1][0]) and _fits(runs[-1][-1], delta):
            runs[-1].append(delta)
        else:
            runs.append([delta])
    for run in runs:
        if len(run) > 1 and sum(len(d.rows) for d in run if d.rows is not None) <= _MERGE_ROWS * len(run):
            out.append(_merged(run))
        else:
            out.extend(run)
    return out


def merges_little(deltas: Sequence[PartDelta]) -> bool:
    """Whether ``deltas`` (an entry's) hold a delta of rows that :func:`coalesce` would not merge with others:
    more than ``_MERGE_ROWS`` rows (sparse LR's ~20,000). Writing such an entry with its neighbours saves only
    the small arrays' and the small state's writes, not worth keeping it back for."""
    return any(d.rows is not None and len(d.rows) > _MERGE_ROWS and not _is_table(d) for d in deltas)


def _is_table(delta: PartDelta) -> bool:
    return any(k.startswith((_TABLE, _ROWS)) for k in delta.arrays)


def _rewrites(written: set[str], earlier: PartDelta) -> bool:
    """Whether a whole write of the arrays ``written`` leaves nothing of ``earlier`` (a delta before it, not
    of a dynamic table): every array ``earlier`` writes is among them; marks only where ``written`` has marks
    or the value (a whole write of the value marks every row built)."""
    names: set[str] = set()
    for name in earlier.arrays:
        names.update(name[len(_PACK):].split(_PACKED) if name.startswith(_PACK) else (name,))
    if _MARKS in names and _MARKS not in written and _VALUE not in written:
        return False
    return (names - {_MARKS}) <= written


def _fits(a: PartDelta, b: PartDelta) -> bool:
    """Whether deltas of rows ``a`` and ``b`` can be merged: the same arrays (dtype, shape past the rows),
    rows as one axis, no marks, each array as many rows as its delta's row numbers."""
    rows_a, rows_b = a.rows, b.rows
    if a.arrays.keys() != b.arrays.keys() or _MARKS in a.arrays or rows_a is None or rows_b is None:
        return False
    if any(r.ndim != 1 or r.dtype.kind not in "iu" for r in (rows_a, rows_b)):
        return False
    for name, x in a.arrays.items():
        y, axis = b.arrays[name], 1 if name.startswith(_PACK) else 0
        if x.dtype != y.dtype or x.ndim != y.ndim:
            return False
        if x.ndim and (x.ndim <= axis or x.shape[:axis] != y.shape[:axis] or x.shape[axis + 1:] != y.shape[axis + 1:]
                       or x.shape[axis] != len(rows_a) or y.shape[axis] != len(rows_b)):
            return False
    return True


def _merged(run: list[PartDelta]) -> PartDelta:
    """One delta for deltas of rows ``run`` (in order; :func:`_fits` each the next): of each row its newest
    version (the last delta's that wrote it), the rows sorted; a 0-d array, the last delta's."""
    rows = np.concatenate([d.rows for d in run if d.rows is not None])
    order = np.argsort(rows, kind="stable")  # equal rows keep the order of their deltas: the newest is last
    ordered = rows[order]
    newest = np.empty(len(ordered), np.bool_)
    np.not_equal(ordered[1:], ordered[:-1], out=newest[:-1])
    newest[-1:] = True
    picked = order[newest]
    arrays: dict[str, np.ndarray] = {}
    for name, last in run[-1].arrays.items():
        if last.ndim == 0:
            arrays[name] = last
            continue
        axis = 1 if name.startswith(_PACK) else 0
        arrays[name] = np.take(np.concatenate([d.arrays[name] for d in run], axis=axis), picked, axis=axis)
    return PartDelta(run[0].key, ordered[newest], arrays)


def write(store: ParameterStore, delta: PartDelta) -> None:
    """Writes ``delta`` into the store's partition of the same key.

    Raises:
        InvalidRequest: no such partition, or an array that does not fit it (names both).
    """
    if delta.key not in store:
        raise InvalidRequest(f"replica entry names partition {delta.key!r}, which this member does not hold")
    part = store.get(delta.key)
    if part.table is not None:
        try:
            prefix = _ROWS if any(k.startswith(_ROWS) for k in delta.arrays) else _TABLE
            given = {k[len(prefix):]: v for k, v in delta.arrays.items() if k.startswith(prefix)}
            counted = check_counts(given.pop("counts", None), part.table.name)  # the primary's counters, as of this change
            if prefix == _ROWS:
                part.table.apply_changes(given)
            else:
                part.table.load(given)
            part.table.set_counts(counted)
        except StoreError as e:
            raise InvalidRequest(str(e)) from e
        return
    rows = delta.rows
    marks = delta.arrays.get(_MARKS)
    if marks is not None and (rows is not None or marks.shape != (part.value.shape[0],) or marks.dtype != np.bool_):
        raise InvalidRequest(f"{part.describe}: replicated marks of shape {marks.shape} ({marks.dtype}) do not fit "
                             f"its {part.value.shape[0]} rows (or came with rows)")
    if marks is not None and part.lazy is None and not bool(marks.all()):
        raise InvalidRequest(f"{part.describe} is not lazy here; the primary's has rows not built yet")
    arrays, packs = _unpacked(part, delta)
    with part.lock:
        for pack, names, block in packs:
            if rows is None or not _scattered(part, rows, pack, names, block):
                arrays.extend(zip(names, block, strict=True))  # numpy writes them, below
        for name, array in arrays:
            if name == _MARKS:
                continue
            target = _target(part, name)
            if rows is None or target.ndim == 0:
                if target.shape != array.shape or target.dtype != array.dtype:
                    raise InvalidRequest(f"{part.describe}: replicated {name} has shape {array.shape} "
                                         f"({array.dtype}), the partition's {target.shape} ({target.dtype})")
                np.copyto(target, array)
            else:
                if array.shape[0] != rows.shape[0]:
                    raise InvalidRequest(f"{part.describe}: replicated {name} has {array.shape[0]} rows for "
                                         f"{rows.shape[0]} row numbers")
                try:
                    _put_rows(target, rows, array)
                except IndexError as e:
                    raise InvalidRequest(f"{part.describe}: replicated {name}: {e}") from e
        wrote_value = any(name == _VALUE for name, _ in arrays) or any(_VALUE in names for _, names, _ in packs)
        _mark(part, rows, marks, wrote_value)


def _scattered(part: PartitionState, rows: np.ndarray, pack: str, names: list[str], block: np.ndarray) -> bool:
    """(Under the partition's lock) Writes ``pack/`` array ``block`` into the arrays ``names`` it stacks with
    one ``scatter_rows`` call where the C loop was built and they all fit it (dtype, row shape, C-contiguous;
    C-contiguous int64 rows), the same bytes as :func:`_put_rows` of each; False where they do not (numpy writes them)."""
    if (_SCATTER_ROWS is None or rows.dtype != np.int64 or rows.ndim != 1 or not rows.flags.c_contiguous
            or block.shape[1] != len(rows) or not block.flags.c_contiguous):
        return False
    targets = [_target(part, n) for n in names]
    if not all(t.ndim >= 1 and t.dtype == block.dtype and t.shape[1:] == block.shape[2:] and t.flags.c_contiguous
               and t.shape[0] > 0 for t in targets):
        return False
    try:
        _SCATTER_ROWS(targets, rows, block)
    except ValueError as e:  # a row outside the partition: nothing was written
        raise InvalidRequest(f"{part.describe}: replicated {pack!r:.80}: {e}") from e
    return True


def _unpacked(part: PartitionState, delta: PartDelta) -> tuple[list[tuple[str, np.ndarray]],
                                                                 list[tuple[str, list[str], np.ndarray]]]:
    """``delta``'s arrays by name but its ``pack/`` arrays, and apart each ``pack/`` array (name, the names of
    the arrays it stacks, the array).

    Raises:
        InvalidRequest: a ``pack/`` array without rows, or whose first axis does not match its names.
    """
    out: list[tuple[str, np.ndarray]] = []
    packs: list[tuple[str, list[str], np.ndarray]] = []
    for name, array in delta.arrays.items():
        if not name.startswith(_PACK):
            out.append((name, array))
            continue
        names = name[len(_PACK):].split(_PACKED)
        if delta.rows is None or array.ndim < 2 or array.shape[0] != len(names):
            raise InvalidRequest(f"{part.describe}: replicated {name!r:.80} of shape {array.shape} does not stack "
                                 f"{len(names)} arrays of rows" + (" (it came without rows)" if delta.rows is None else ""))
        packs.append((name, names, array))
    return out, packs


def _put_rows(target: np.ndarray, rows: np.ndarray, array: np.ndarray) -> None:
    """``target[rows] = array``; rows of C-contiguous arrays are set as one opaque item each (the same bytes,
    half the CPU of numpy's fancy assignment for rows of 1 to 16 floats)."""
    width = target.itemsize * (target.size // target.shape[0]) if target.shape[0] else 0
    if (width and target.ndim > 1 and target.flags.c_contiguous and array.flags.c_contiguous
            and array.dtype == target.dtype and array.shape[1:] == target.shape[1:]):
        item = np.dtype((np.void, width))
        target.reshape(target.shape[0], -1).view(item).reshape(-1)[rows] = (
            array.reshape(array.shape[0], -1).view(item).reshape(-1))
        return
    target[rows] = array


def _mark(part: PartitionState, rows: np.ndarray | None, marks: np.ndarray | None, wrote_value: bool) -> None:
    """After a write into a lazy partition: its marks are the primary's ``marks``, else the rows of the value
    written are built (the caller holds the lock)."""
    lazy = part.lazy
    if lazy is None or (marks is None and not wrote_value):
        return
    if marks is not None:
        np.copyto(lazy.marks, marks)
        lazy.count = int(np.count_nonzero(marks))
    else:
        lazy.mark(rows)
    if lazy.complete:
        part.lazy = None


def _target(part: PartitionState, name: str) -> np.ndarray:
    if name == _VALUE:
        return part.value
    if name == _AVERAGE and part.average is not None:
        return part.average
    if name.startswith(_SLOT) and name[len(_SLOT):] in part.slots:
        return part.slots[name[len(_SLOT):]]
    raise InvalidRequest(f"{part.describe}: replicated array {name!r} does not belong to it")
