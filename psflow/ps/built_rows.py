"""A lazy partition in a checkpoint: only its built rows, and what gives the others (issue 29).

A lazy partition (:mod:`psflow.ps.lazy_rows`) saved whole by a checkpoint shard holds only the rows built so
far; every other row holds its initial content, a function of the variable's initializer spec (with its
seed), the row and the optimizer's slot initial values alone. So the shard stores:

* the tensor ``<key>@built_rows``: the built local rows, sorted int64 (:func:`built_rows_name`);
* the value's, each slot's and the moving average's rows at those positions, under the usual names
  (``<key>``, ``<key>:<slot>``), ``n`` rows each;
* ``<key>@initial/<slot>``: each row-laid optimizer slot's initial row (shape ``full_shape[1:]``; the moving
  average's initial row is the value's), :func:`initial_slot_name`;

and its partition record says ``"built": n`` and ``"initializer": {...}`` (the variable's initializer spec,
seed included). :func:`whole_rows` gives any row range as an eager partition holds it, bit for bit. A
partition whose built rows and their indices would take as many bytes as the whole is saved whole as before
(no ``built``); so is an eager one.

A restore sends a ps task such a partition's saved rows (``LoadShard``'s ``b/<key>``, ``i/<key>/<slot>``):
:func:`check_built` checks them and :func:`load_built` writes them, keeping a lazy partition lazy. A warm start
from such a checkpoint sends only the value's saved rows where the model's initializer is the checkpoint's
(``LoadShard`` values only): :func:`warm_built` writes them, the slots kept, the partition lazy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from psflow.ps.averages import AVERAGE_SLOT
from psflow.ps.initializers import CONSTANT_INITIALIZERS, InitializerError, initial_rows, validate_initializer

__all__ = ["BUILT_ROWS", "INITIAL_PREFIX", "built_rows_name", "check_built", "initial_slot_name", "initial_block",
           "load_built", "same_initializer", "warm_built", "whole_rows", "worth_it"]

#: A full shard's tensor of a lazy partition's built local rows: ``<key>@built_rows``.
BUILT_ROWS = "built_rows"

#: A full shard's tensor of a lazy partition's slot initial row: ``<key>@initial/<slot>``.
INITIAL_PREFIX = "initial/"

#: Rows of initial content computed at a time by :func:`initial_block` (bounds its temporaries).
_CHUNK_ELEMENTS = 1 << 20


def built_rows_name(key: str) -> str:
    """The tensor name of a lazy partition's built local rows in a full shard."""
    return f"{key}@{BUILT_ROWS}"


def initial_slot_name(key: str, slot: str) -> str:
    """The tensor name of a lazy partition's slot ``slot``'s initial row in a full shard."""
    return f"{key}@{INITIAL_PREFIX}{slot}"


def worth_it(built: int, rows: int, row_bytes: int) -> bool:
    """Whether ``built`` rows of ``rows`` and their int64 indices take fewer bytes than the whole partition."""
    return built * (row_bytes + 8) < rows * row_bytes


def initial_block(spec: Mapping[str, Any], full_shape: tuple[int, ...], dtype: str, rows: np.ndarray) -> np.ndarray:
    """The initial values of the variable's (global) ``rows``, computed a chunk of rows at a time:
    bit-equal to :func:`psflow.ps.initializers.initial_rows` (and to an eager partition's rows)."""
    if spec.get("name") in CONSTANT_INITIALIZERS or rows.size == 0:
        return initial_rows(spec, full_shape, rows, dtype)
    out = np.empty((rows.size, *full_shape[1:]), dtype=dtype)
    row_size = int(np.prod(full_shape[1:], dtype=np.int64)) if len(full_shape) > 1 else 1
    step = max(1, _CHUNK_ELEMENTS // max(1, row_size))
    for lo in range(0, rows.size, step):
        out[lo:lo + step] = initial_rows(spec, full_shape, rows[lo:lo + step], dtype)
    return out


def whole_rows(spec: Mapping[str, Any], full_shape: tuple[int, ...], dtype: str, row_start: int,
               lo: int, hi: int, built: np.ndarray, saved: np.ndarray, initial_row: np.ndarray | None) -> np.ndarray:
    """Local rows ``lo:hi`` of a partition starting at global row ``row_start`` saved as built rows, as an eager
    partition holds them: the initial content (``initial_row`` broadcast for a slot; the initializer's rows
    for the value or the moving average, ``initial_row`` None) with the ``saved`` rows at local ``built``
    (sorted) laid over it."""
    if initial_row is None:
        out = initial_block(spec, full_shape, dtype, np.arange(row_start + lo, row_start + hi, dtype=np.int64))
    else:
        out = np.empty((hi - lo, *initial_row.shape), dtype=initial_row.dtype)
        out[...] = initial_row
    a, b = np.searchsorted(built, lo), np.searchsorted(built, hi)
    if b > a:
        out[built[a:b] - lo] = saved[a:b]
    return out


def check_built(part: Any, targets: Mapping[str, np.ndarray], rows: np.ndarray, record: Any, value: np.ndarray,
                slots: Mapping[str, np.ndarray], initial: Mapping[str, np.ndarray]) -> str | None:
    """Why a ``LoadShard`` of partition ``part`` (a :class:`~psflow.ps.store.PartitionState`; ``targets``: its saved
    slots) as saved ``rows`` is refused, or None. ``record``: ``{"initializer", "shape"}``."""
    current = part.value
    n, row_shape = current.shape[0], current.shape[1:]
    if rows.dtype != np.int64 or rows.ndim != 1 or (rows.size and (rows[0] < 0 or rows[-1] >= n
                                                                    or bool(np.any(rows[1:] <= rows[:-1])))):
        return f"{part.describe}: the loaded rows are not sorted distinct local rows (int64)"
    if not (isinstance(record, dict) and isinstance(record.get("initializer"), dict)
            and isinstance(record.get("shape"), list) and tuple(record["shape"][1:]) == row_shape):
        return f"{part.describe}: the load of its saved rows has no initializer of its row shape"
    try:
        validate_initializer(record["initializer"])
    except InitializerError as e:
        return f"{part.describe}: {e}"
    if value.shape != (rows.size, *row_shape) or value.dtype != current.dtype:
        return f"{part.describe}: {rows.size} rows loaded, but a value of shape {value.shape} ({value.dtype})"
    for name, target in targets.items():
        sent = slots.get(name)
        want = (rows.size, *target.shape[1:]) if target.ndim else target.shape
        if sent is None or sent.shape != want or sent.dtype != target.dtype:
            return f"{part.describe} slot {name!r}: loaded array is not of shape {want} ({target.dtype})"
        row = initial.get(name)
        if target.ndim and name != AVERAGE_SLOT and (row is None or row.shape != target.shape[1:]):
            return f"{part.describe} slot {name!r}: no initial row of shape {target.shape[1:]} loaded"
    return None


def load_built(part: Any, targets: Mapping[str, np.ndarray], rows: np.ndarray, record: Mapping[str, Any],
               value: np.ndarray, slots: Mapping[str, np.ndarray], initial: Mapping[str, np.ndarray]) -> None:
    """Overwrites partition ``part`` (checked by :func:`check_built`; the caller holds its lock) with a checkpoint
    holding only its ``rows``. A lazy partition built from the same initial content stays lazy: the loaded rows
    are written and marked built, rows built here but not saved are marked unbuilt again (a touch builds them
    anew), the others stay unbuilt (memory follows the rows the checkpoint holds). Any other partition is written whole,
    its rows not saved computed from ``record``'s initializer."""
    lazy, spec, shape = part.lazy, record["initializer"], tuple(record["shape"])
    if lazy is not None and _same_initial(lazy, spec, shape, initial):
        stale = np.setdiff1d(np.flatnonzero(lazy.marks), rows, assume_unique=True)
        if stale.size:
            lazy.forget(stale)
        part.value[rows] = value
        for name, target in targets.items():
            if target.ndim:
                target[rows] = slots[name]
            else:
                np.copyto(target, slots[name])
        lazy.mark(rows)
        if lazy.complete:
            part.lazy = None
        return
    n, dtype = part.value.shape[0], str(part.value.dtype)
    np.copyto(part.value, whole_rows(spec, shape, dtype, part.row_start, 0, n, rows, value, None))
    for name, target in targets.items():
        whole = (whole_rows(spec, shape, dtype, part.row_start, 0, n, rows, slots[name],
                            None if name == AVERAGE_SLOT else initial[name]) if target.ndim else slots[name])
        np.copyto(target, whole)
    if lazy is not None:
        lazy.mark(None)
        part.lazy = None


def warm_built(part: Any, rows: np.ndarray, record: Mapping[str, Any], value: np.ndarray) -> None:
    """Overwrites the value of partition ``part`` (checked by :func:`check_built` with no slots; the caller holds
    its lock) with a warm start's checkpoint holding only its ``rows``; the slots keep theirs, a moving average
    starts at the new value. The same content as the whole variable's values-only load, bit for bit. A lazy
    partition whose initializer and shape are ``record``'s stays lazy: the saved rows are built (their slots
    initial) and written; rows built here before but not saved get the initializer's value (what the
    checkpoint holds for them); the others stay unbuilt, holding that value already. Any other partition is
    built whole and written whole, its rows not saved computed from ``record``'s initializer."""
    lazy, spec, shape = part.lazy, record["initializer"], tuple(record["shape"])
    average, dtype = part.average, str(part.value.dtype)
    if lazy is not None and _builds_as(lazy, spec, shape):
        before = np.setdiff1d(np.flatnonzero(lazy.marks), rows, assume_unique=True)
        if before.size:
            fresh = initial_block(spec, shape, dtype, before + part.row_start)
            part.value[before] = fresh
            if average is not None:
                average[before] = fresh
        part.materialize(rows)
        part.value[rows] = value
        if average is not None:
            average[rows] = value
        return
    part.materialize(None)  # the slots keep their initial values: every row built first, as a whole load does
    whole = whole_rows(spec, shape, dtype, part.row_start, 0, part.value.shape[0], rows, value, None)
    np.copyto(part.value, whole)
    if average is not None:
        np.copyto(average, whole)


def _same_initial(lazy: Any, spec: Mapping[str, Any], shape: tuple[int, ...], initial: Mapping[str, np.ndarray]) -> bool:
    """Whether lazy partition ``lazy`` builds a row as the checkpoint's ``spec`` and slot ``initial`` rows do."""
    if not _builds_as(lazy, spec, shape):
        return False
    mine = lazy.slot_rows
    if set(mine) != set(initial):
        return False
    return all(np.asarray(mine[k], dtype=initial[k].dtype).tobytes() == initial[k].tobytes() for k in mine)


def _builds_as(lazy: Any, spec: Mapping[str, Any], shape: tuple[int, ...]) -> bool:
    """Whether lazy partition ``lazy`` gives a row the value a variable of ``shape`` and initializer ``spec`` has."""
    return tuple(lazy.full_shape) == shape and same_initializer(lazy.initializer, spec)


def same_initializer(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Whether initializer specs ``a`` and ``b`` give every row the same value (their seeds included); an invalid
    spec gives no row the other's."""
    try:
        return validate_initializer(a) == validate_initializer(b)
    except InitializerError:
        return False
