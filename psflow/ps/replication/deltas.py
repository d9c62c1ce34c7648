"""What a state change wrote to a partition, captured on the primary and written on a backup, bit for bit.

A :class:`~psflow.ps.protocol.PartDelta` names its arrays:

* ``value``, ``slot/<name>`` (each optimizer slot), ``average`` (the moving average): the rows ``rows`` of
  each (``rows`` None: the whole array). Only the rows a push wrote are copied.
* ``table/<name>``: a dynamic table's whole snapshot (:meth:`~psflow.ps.dynamic.DynamicTable.snapshot`;
  its rows move, admit and evict by id, so its share is copied whole when a change touched it).

Guarantees: :func:`capture` reads each partition under its lock (a whole update, never half of one) and
returns copies; :func:`write` writes them under the partition's lock. Capturing rows ``R`` of the primary's
partition and writing them on a backup whose partition has the same shape makes those rows bit-equal.
"""

from __future__ import annotations

import numpy as np

from psflow.ps.protocol import PartDelta
from psflow.ps.store import ParameterStore, PartitionState
from psflow.rpc.api import InvalidRequest

__all__ = ["capture", "capture_averages", "write"]

_VALUE, _AVERAGE, _SLOT, _TABLE = "value", "average", "slot/", "table/"


def capture(part: PartitionState, rows: np.ndarray | None, *, averages: bool = True) -> PartDelta:
    """Copies of what partition ``part`` holds at ``rows`` (None: everything): value, slots, and the moving
    average unless ``averages`` is False; a dynamic table's whole snapshot."""
    if part.table is not None:
        return PartDelta(part.key, None, {_TABLE + k: v for k, v in part.table.snapshot().items()})
    arrays: dict[str, np.ndarray] = {}
    with part.lock:
        def take(array: np.ndarray) -> np.ndarray:
            return array.copy() if rows is None else array[rows]

        arrays[_VALUE] = take(part.value)
        for name, slot in part.slots.items():
            arrays[_SLOT + name] = take(slot)
        if averages and part.average is not None:
            arrays[_AVERAGE] = take(part.average)
    return PartDelta(part.key, rows, arrays)


def capture_averages(store: ParameterStore, skip: set[str]) -> list[PartDelta]:
    """The whole moving average of every averaged partition not in ``skip`` (a step moves every one)."""
    out = []
    for part in store.partitions():
        if part.average is not None and part.key not in skip:
            with part.lock:
                out.append(PartDelta(part.key, None, {_AVERAGE: part.average.copy()}))
    return out


def write(store: ParameterStore, delta: PartDelta) -> None:
    """Writes ``delta`` into the store's partition of the same key.

    Raises:
        InvalidRequest: no such partition, or an array that does not fit it (names both).
    """
    if delta.key not in store:
        raise InvalidRequest(f"replica entry names partition {delta.key!r}, which this member does not hold")
    part = store.get(delta.key)
    if part.table is not None:
        part.table.load({k[len(_TABLE):]: v for k, v in delta.arrays.items() if k.startswith(_TABLE)})
        return
    rows = delta.rows
    with part.lock:
        for name, array in delta.arrays.items():
            target = _target(part, name)
            if rows is None:
                if target.shape != array.shape or target.dtype != array.dtype:
                    raise InvalidRequest(f"{part.describe}: replicated {name} has shape {array.shape} "
                                         f"({array.dtype}), the partition's {target.shape} ({target.dtype})")
                np.copyto(target, array)
            else:
                target[rows] = array


def _target(part: PartitionState, name: str) -> np.ndarray:
    if name == _VALUE:
        return part.value
    if name == _AVERAGE and part.average is not None:
        return part.average
    if name.startswith(_SLOT) and name[len(_SLOT):] in part.slots:
        return part.slots[name[len(_SLOT):]]
    raise InvalidRequest(f"{part.describe}: replicated array {name!r} does not belong to it")
