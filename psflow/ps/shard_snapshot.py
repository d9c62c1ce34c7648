"""The tensors of one ps task's checkpoint shard: every partition whole, or (an increment) its changed rows.

:func:`shard_tensors` snapshots every partition of a task (each under its own lock) into safetensors
tensors plus each partition's manifest record. A full shard holds every row of every eager partition, and of
a lazy one only its built rows (record ``"built": n``, ``"initializer"``; tensors ``<key>@built_rows`` and
``<key>@initial/<slot>``: :mod:`psflow.ps.built_rows`), so the chief's step-0 save of W&D's tables is
O(built rows), not O(table); a lazy partition with so many rows built that they and their indices take as
many bytes as the whole is saved whole (its rows not built yet as their initial content,
:func:`partition_copy`). An incremental shard, given
the base snapshot's marks (``since``: its token and epoch, see :mod:`psflow.ps.row_marks`), holds of each
static partition only the rows changed since then: the tensor ``<key>@changed_rows`` (local rows, sorted int64)
and the value's and each slot's rows at those positions under the usual names; its record says
``"changed": n``. A partition saved whole in an increment (another task's token, a 0-d value, a moving
average, an optimizer without row-wise slots, so many rows changed that they and their indices
would take as many bytes as the whole partition) has no ``changed`` (a lazy one is then saved as a full shard
saves it: its built rows, or every row); a dynamic table's share is always saved
whole (its snapshot). 0-d slots (Adam's beta powers) are always held whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from psflow.ps.averages import AVERAGE_SLOT
from psflow.ps.built_rows import built_rows_name, initial_slot_name, worth_it
from psflow.ps.store import PartitionState

__all__ = ["SLOT_SEPARATOR", "DYNAMIC_SEPARATOR", "CHANGED_ROWS", "shard_tensor_names", "dynamic_tensor_names",
           "changed_rows_name", "non_finite", "partition_copy", "saved_slots", "shard_tensors"]

#: Separates a partition key from a slot name in a shard's tensor names:
#: ``weights/part_0`` is the value, ``weights/part_0:accum`` one of its slots.
SLOT_SEPARATOR = ":"

#: Separates a dynamic table partition's key from its snapshot arrays other than values and slots:
#: ``emb/part_0@ids``, ``emb/part_0@last_step``, ``emb/part_0@frequency``, ``emb/part_0@step``, ``emb/part_0@state/NAME``,
#: ``emb/part_0@counts`` (the share's counters).
DYNAMIC_SEPARATOR = "@"

#: An increment's tensor of a partition's saved local rows: ``<key>@changed_rows``.
CHANGED_ROWS = "changed_rows"


def shard_tensor_names(key: str, slots: list[str]) -> tuple[str, dict[str, str]]:
    """The tensor name of a partition's value and of each of its slots."""
    return key, {slot: f"{key}{SLOT_SEPARATOR}{slot}" for slot in slots}


def changed_rows_name(key: str) -> str:
    """The tensor name of an incremental partition's saved local rows."""
    return f"{key}{DYNAMIC_SEPARATOR}{CHANGED_ROWS}"


def dynamic_tensor_names(key: str, snapshot_keys: list[str]) -> dict[str, str]:
    """A dynamic table partition's snapshot array name -> its tensor name in a shard.

    ``values`` and ``slot/NAME`` are stored as a static partition's value and slots
    (see :func:`shard_tensor_names`); the rest under ``<key>@<name>``.
    """
    out = {}
    for name in snapshot_keys:
        if name == "values":
            out[name] = key
        elif name.startswith("slot/"):
            out[name] = f"{key}{SLOT_SEPARATOR}{name[len('slot/'):]}"
        else:
            out[name] = f"{key}{DYNAMIC_SEPARATOR}{name}"
    return out


def saved_slots(part: PartitionState) -> dict[str, np.ndarray]:
    """The arrays a checkpoint holds beside a partition's value: its optimizer slots and its moving average."""
    if part.average is None:
        return part.slots
    return {**part.slots, AVERAGE_SLOT: part.average}


def partition_copy(part: PartitionState) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Copies of the partition's value and saved slots, taken under its lock; a lazy partition's rows not
    built yet hold their initial content in the copies (built after the lock is released, a chunk of rows
    at a time, :meth:`~psflow.ps.lazy_rows.LazyRows.initial_copy`), and the partition stays lazy."""
    with part.lock:
        slots = {name: np.array(s, copy=True) for name, s in saved_slots(part).items()}
        value, lazy = part.value.copy(), part.lazy
        marks = lazy.marks.copy() if lazy is not None else None
    if lazy is not None and marks is not None:
        lazy.initial_copy(marks, value, slots, slots.get(AVERAGE_SLOT) if part.average is not None else None)
    return value, slots


def _built_copy(part: PartitionState) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray], dict[str, Any],
                                                dict[str, np.ndarray]] | None:
    """(built local rows, the value's and saved slots' rows there, the initializer spec, each row-laid slot's
    initial row) of a lazy partition, taken under its lock; None: save it whole (an eager partition, a slot
    without a known initial row, too many rows built)."""
    with part.lock:
        lazy, n = part.lazy, part.value.shape[0] if part.value.ndim else 0
        if lazy is None or n == 0:
            return None
        slots = saved_slots(part)
        laid = {k for k, s in slots.items() if s.ndim}
        if any(slots[k].shape[0] != n for k in laid) or any(k not in lazy.slot_rows for k in laid - {AVERAGE_SLOT}):
            return None
        row_bytes = sum(a.nbytes // n for a in (part.value, *slots.values()) if a.ndim)
        rows = np.flatnonzero(lazy.marks).astype(np.int64)
        if not worth_it(rows.size, n, row_bytes):
            return None
        saved = {k: (s[rows] if s.ndim else np.array(s, copy=True)) for k, s in slots.items()}
        initial = {k: np.asarray(lazy.slot_rows[k], dtype=slots[k].dtype) for k in sorted(laid - {AVERAGE_SLOT})}
        return rows, part.value[rows], saved, dict(lazy.initializer), initial


def _changed_copy(part: PartitionState, token: str,
                  epoch: int) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]] | None:
    """(local rows, the value's and slots' rows there) changed since the snapshot ``(token, epoch)``, taken
    under the partition's lock; None: save it whole. Changed rows are built (an apply built them first)."""
    with part.lock:
        marks = part.marks
        rows = marks.changed_since(token, epoch) if marks is not None else None
        n = part.value.shape[0]
        if rows is None or n == 0:
            return None
        slots = saved_slots(part)
        if any(s.ndim and s.shape[0] != n for s in slots.values()):
            return None  # a slot not laid out by row: whole
        row_bytes = sum(a.nbytes // n for a in (part.value, *slots.values()) if a.ndim)
        if rows.size * (row_bytes + rows.itemsize) >= n * row_bytes:
            return None  # the rows and their indices would not be smaller than the whole partition
        value = part.value[rows]
        return rows, value, {k: (s[rows] if s.ndim else np.array(s, copy=True)) for k, s in slots.items()}


def shard_tensors(partitions: Sequence[PartitionState], since: Mapping[str, Any] | None
                  ) -> tuple[dict[str, np.ndarray], list[dict[str, Any]]]:
    """(tensors, the partitions' manifest records) of one shard; ``since``: ``{"token", "epoch"}`` of the base
    snapshot (an increment), or None (every row). The caller advanced the task's mark clock first."""
    tensors: dict[str, np.ndarray] = {}
    parts: list[dict[str, Any]] = []
    token = since.get("token") if since is not None else None
    epoch = since.get("epoch") if since is not None else None
    for part in sorted(partitions, key=lambda p: p.key):
        if part.table is not None:
            snap = part.table.snapshot(counts=True)  # its counters too: a restore goes on counting
            names = dynamic_tensor_names(part.key, sorted(snap))
            tensors.update({names[k]: np.array(v, order="C") for k, v in snap.items()})  # (0-d stays 0-d)
            parts.append({"key": part.key, "var": part.var_name, "index": part.index, "row_start": 0,
                          "rows": int(snap["ids"].size), "dynamic": sorted(snap),
                          "slots": sorted(k[len("slot/"):] for k in snap if k.startswith("slot/"))})
            continue
        record: dict[str, Any] = {"key": part.key, "var": part.var_name, "index": part.index,
                                  "row_start": part.row_start,
                                  "rows": int(part.value.shape[0]) if part.value.ndim else 1}
        changed = (_changed_copy(part, token, epoch) if isinstance(token, str) and type(epoch) is int else None)
        built = _built_copy(part) if changed is None else None
        if built is not None:
            rows, value, slots, spec, initial = built
            tensors[built_rows_name(part.key)] = rows
            tensors.update({initial_slot_name(part.key, k): row for k, row in initial.items()})
            record.update(built=int(rows.size), initializer=spec)
        elif changed is None:
            value, slots = partition_copy(part)
        else:
            rows, value, slots = changed
            tensors[changed_rows_name(part.key)] = rows
            record["changed"] = int(rows.size)
        value_name, slot_names = shard_tensor_names(part.key, sorted(slots))
        tensors[value_name] = value
        for slot, name in slot_names.items():
            tensors[name] = slots[slot]
        parts.append({**record, "slots": sorted(slots)})
    return tensors, parts


def non_finite(tensors: Mapping[str, np.ndarray]) -> list[tuple[str, int]]:
    """``(name, count)`` of every floating-point tensor holding NaN or infinite values (a diverged model), by name.

    One pass per tensor, a float64 sum (NaN and infinities carry through it; float32 values cannot overflow it),
    and an element-wise count only for a tensor whose sum is not finite: no temporary as large as a table.
    """
    out = []
    for name in sorted(tensors):
        array = tensors[name]
        if array.dtype.kind != "f" or not array.size:
            continue
        with np.errstate(all="ignore"):
            if np.isfinite(np.sum(array, dtype=np.float64)):
                continue
            count = int(array.size - np.count_nonzero(np.isfinite(array)))
        if count:
            out.append((name, count))
    return out
