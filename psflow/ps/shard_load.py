"""A ``LoadShard``'s partitions: every array checked against this task's partitions, nothing changed
(:func:`plan_load`), then written (:meth:`LoadPlan.write`).

The two halves are apart so the check, which reads a whole shard's arrays, runs outside the mutex a load changes
the task under (:meth:`~psflow.ps.restore_gate.RestoreGate.loading`: the restore fence asked again there) and
the write, memory copies, within it (:mod:`psflow.ps.checkpointing`, which describes the request).

Guarantees: :func:`plan_load` refuses (INVALID_ARGUMENT naming the task's partition and the array) before
anything changes; :meth:`LoadPlan.write` overwrites each partition under its own lock (a static one's value and
saved slots whole, or a lazy one's saved rows: :mod:`psflow.ps.built_rows`; a dynamic table's share whole, rows
beyond its capacity evicted by policy, logged).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from psflow.ps.built_rows import check_built, load_built, warm_built
from psflow.ps.protocol import LoadShardRequest
from psflow.ps.shard_snapshot import saved_slots
from psflow.ps.store import ParameterStore, PartitionState, StoreError
from psflow.rpc.api import InvalidRequest

__all__ = ["LoadPlan", "plan_load"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoadPlan:
    """A checked ``LoadShard``'s partitions and their arrays: ``dense`` (partition, value, slots), ``tables`` (a
    dynamic table's partition, its snapshot arrays), ``built`` (a partition sent as its saved rows: partition,
    (rows, record, initial rows), value, slots). ``values_only``: a warm start (the slots keep theirs)."""

    dense: list[tuple[PartitionState, np.ndarray, dict[str, np.ndarray]]]
    tables: list[tuple[PartitionState, dict[str, np.ndarray]]]
    built: list[tuple[PartitionState, Any, np.ndarray, dict[str, np.ndarray]]]
    values_only: bool

    @property
    def count(self) -> int:
        """The partitions loaded."""
        return len(self.dense) + len(self.tables) + len(self.built)

    def write(self, task_name: str) -> None:
        """Overwrites every partition of the plan, each under its own lock (``task_name``: the log's)."""
        values_only = self.values_only
        for part, snapshot in self.tables:
            assert part.table is not None
            evicted = part.table.load(snapshot)
            if evicted:
                log.warning("%s: %s: %d restored rows beyond its capacity were evicted", task_name, part.describe,
                            evicted)
        for part, value, slots in self.dense:
            with part.lock:
                if values_only:  # the slots keep their initial values: build them (and every row) first
                    part.materialize(None)
                np.copyto(part.value, value)
                targets = saved_slots(part)
                for slot, arr in slots.items():
                    np.copyto(targets[slot], arr)
                if values_only and part.average is not None:  # new initial values: the average starts there
                    np.copyto(part.average, value)
                if part.marks is not None:  # every row changed (an increment after a restore holds them all)
                    part.marks.mark(None)
                if part.lazy is not None:  # value and every saved slot were loaded whole: every row is built
                    part.lazy.mark(None)
                    part.lazy = None
        for part, (rows, record, initial), value, slots in self.built:
            with part.lock:
                if values_only:
                    warm_built(part, rows, record, value)
                else:
                    load_built(part, saved_slots(part), rows, record, value, slots, initial)
                if part.marks is not None:
                    part.marks.mark(None)


def plan_load(request: LoadShardRequest, store: ParameterStore) -> LoadPlan:
    """``request``'s partitions of ``store``, every array checked; nothing changes.

    Raises:
        InvalidRequest: an unknown partition, an array missing or of another shape or dtype, a slot this
            optimizer does not have (or any slot in a values-only load), a dynamic table warm-started.
    """
    values_only = request.values_only
    if values_only and request.has_slots():
        raise InvalidRequest("a values-only load carries no optimizer slots")
    plan = LoadPlan([], [], [], values_only)
    for key in request.parts:
        if not isinstance(key, str) or key not in store:
            raise InvalidRequest(f"unknown variable partition {key!r:.80}")
        part = store.get(key)
        if part.table is not None:
            plan.tables.append((part, _table_snapshot(request, key, part, values_only)))
            continue
        built = request.built(key)
        if built is not None:  # a warm start's (values only) too: psflow.ps.built_rows.warm_built
            plan.built.append(_built(request, key, part, built, values_only))
            continue
        value = _checked(request.value(key), part.value, part.describe)
        slots = {} if values_only else _slots(request, key, part)
        plan.dense.append((part, value, slots))
    return plan


def _built(request: LoadShardRequest, key: str, part: PartitionState, built: Any, values_only: bool
           ) -> tuple[PartitionState, Any, np.ndarray, dict[str, np.ndarray]]:
    """A partition sent as its saved rows (:mod:`psflow.ps.built_rows`): checked, nothing changes. Values
    only (a warm start): its value's rows alone, the slots are not checked (they keep theirs)."""
    rows, record, initial = built
    value, slots = request.value(key), request.slots(key)
    if value is None:
        raise InvalidRequest(f"{part.describe}: no array sent")
    targets = {} if values_only else saved_slots(part)
    extra = sorted(name for name in slots if name not in targets)
    if extra:
        raise InvalidRequest(f"{part.describe}: the checkpoint has slots {extra} this optimizer does not have "
                             f"({sorted(targets) or 'none'})")
    why = check_built(part, targets, rows, record, value, slots, initial)
    if why is not None:
        raise InvalidRequest(why)
    return part, built, value, slots


def _table_snapshot(request: LoadShardRequest, key: str, part: PartitionState,
                    values_only: bool) -> dict[str, np.ndarray]:
    """The snapshot arrays sent for a dynamic table's partition, checked (nothing changes)."""
    assert part.table is not None
    if values_only:
        raise InvalidRequest(f"{part.describe}: a dynamic table is not warm-started (restore a checkpoint instead)")
    snapshot = request.table(key)
    try:
        part.table.check_snapshot(snapshot)
    except StoreError as e:
        raise InvalidRequest(str(e)) from e
    return snapshot


def _slots(request: LoadShardRequest, key: str, part: PartitionState) -> dict[str, np.ndarray]:
    """The slot arrays of partition ``key`` in ``request``: exactly the partition's slots, checked."""
    slots = {}
    have = saved_slots(part)
    sent = request.slots(key)
    for slot, current in have.items():
        slots[slot] = _checked(sent.get(slot), current, f"{part.describe} slot {slot!r}")
    extra = sorted(name for name in sent if name not in have)
    if extra:
        raise InvalidRequest(f"{part.describe}: the checkpoint has slots {extra} this optimizer does not have "
                             f"({sorted(have) or 'none'})")
    return slots


def _checked(arr: np.ndarray | None, current: np.ndarray, what: str) -> np.ndarray:
    if arr is None:
        raise InvalidRequest(f"{what}: no array sent")
    if arr.shape != current.shape or arr.dtype != current.dtype:
        raise InvalidRequest(f"{what} has shape {current.shape} ({current.dtype}); "
                             f"loaded array has {arr.shape} ({arr.dtype})")
    return arr
