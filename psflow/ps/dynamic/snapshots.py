"""A dynamic table's snapshot format: its check, and the re-split of M tasks' snapshots onto N tasks.

A snapshot (:meth:`DynamicTable.snapshot`) is a dict of numpy arrays, every
row sorted by id: ``ids`` int64 [n], ``values`` float32 [n, dim], ``slot/NAME``
float32 [n, dim] per optimizer slot, ``state/NAME`` float32 0-d (Adam's beta
powers), ``last_step`` and ``frequency`` int64 [n], ``step`` int64 0-d; a checkpoint's also ``counts``, the
table's counters (int64 ``[len(COUNTED)]``, :func:`counts_array`), which a load then continues from. A re-split
keeps each task's counters where the task count stays; onto another count it sums them and splits each sum as
evenly as it goes (the table's totals are exact, a task's share of them is not its own history).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from psflow.placement.hashing import check_ids, owner_of
from psflow.ps.dynamic.spec import DynamicTableError

__all__ = ["COUNTED", "check_counts", "check_snapshot", "counts_array", "resplit_snapshots", "skip_steps"]

#: The counters of a table's ``stats``, in the order a replicated change carries them (its ``counts``).
COUNTED = ("admitted", "rejected_lookups", "absent_reads", "dropped_gradients", "evicted_ttl", "evicted_capacity")


def counts_array(counts: Mapping[str, int]) -> np.ndarray:
    """A table's counters as a replicated change carries them: int64 ``[len(COUNTED)]``, in ``COUNTED``'s order."""
    return np.array([counts[k] for k in COUNTED], np.int64)


def check_counts(counts: object, name: str, *, what: str = "replicated counts") -> dict[str, int]:
    """The counters of a replicated change's ``counts`` (int64 ``[len(COUNTED)]``, each >= 0), by name; ``what``
    names them in the error (a snapshot's: a checkpoint's or a replica's copy).

    Raises:
        DynamicTableError: missing or malformed; names the table.
    """
    if not (isinstance(counts, np.ndarray) and counts.dtype == np.int64 and counts.shape == (len(COUNTED),)
            and bool((counts >= 0).all())):
        got = f"{counts.dtype} {counts.shape}" if isinstance(counts, np.ndarray) else type(counts).__name__
        raise DynamicTableError(f"dynamic table {name!r}: {what} must be {len(COUNTED)} int64 "
                                f"counters >= 0, got {got}")
    return dict(zip(COUNTED, (int(c) for c in counts), strict=True))


def check_snapshot(arrays: Mapping[str, np.ndarray], *, name: str, dim: int, slot_names: Iterable[str],
                   state_names: Iterable[str]) -> int:
    """The row count of ``arrays`` if it is a valid snapshot of table ``name`` with these slots and state.

    Raises:
        DynamicTableError: keys, dtypes or shapes differ from the table's
            snapshot, or ids are not strictly increasing; names the table.
    """
    where = f"dynamic table {name!r}: snapshot"
    ids = check_ids(arrays.get("ids"), where)
    n = ids.size
    want: dict[str, tuple[Any, tuple[int, ...]]] = {
        "ids": (np.int64, (n,)), "values": (np.float32, (n, dim)), "last_step": (np.int64, (n,)),
        "frequency": (np.int64, (n,)), "step": (np.int64, ())}
    want.update({f"slot/{slot}": (np.float32, (n, dim)) for slot in slot_names})
    want.update({f"state/{state}": (np.float32, ()) for state in state_names})
    if "counts" in arrays:  # a checkpoint's: the counters the table goes on from
        check_counts(arrays["counts"], name, what="snapshot counts")
        want["counts"] = (np.int64, (len(COUNTED),))
    if set(arrays) != set(want):
        raise DynamicTableError(f"{where} has arrays {sorted(arrays)}; this table needs {sorted(want)}")
    for key, (dtype, shape) in want.items():
        array = arrays[key]
        if not isinstance(array, np.ndarray) or array.dtype != dtype or array.shape != shape:
            got = f"{array.dtype} {array.shape}" if isinstance(array, np.ndarray) else type(array).__name__
            raise DynamicTableError(f"{where}: {key!r} must be {np.dtype(dtype)} {shape}, got {got}")
    if n > 1 and not bool(np.all(ids[1:] > ids[:-1])):
        raise DynamicTableError(f"{where}: ids must be strictly increasing (sorted, no duplicates)")
    return int(n)


def resplit_snapshots(name: str, snapshots: Sequence[Mapping[str, np.ndarray]], num_ps: int) -> list[dict[str, np.ndarray]]:
    """Re-splits the snapshots of a table's M ps tasks onto ``num_ps`` tasks by :func:`owner_of`.

    ``snapshots[t]`` is task t's :meth:`DynamicTable.snapshot`; each must hold
    only ids that ``owner_of(ids, M)`` gives task t. Returns one snapshot per new
    task, sorted by id, with every row, slot, last step and frequency unchanged;
    the 0-d ``state/*`` arrays come from task 0 (Adam's beta powers agree across
    tasks when each got one apply per step, as for static partitions) and
    ``step`` is the largest.

    Raises:
        DynamicTableError: no snapshots, differing arrays, an id on a task that
            does not own it, or an id on two tasks; names the table.
    """
    where = f"dynamic table {name!r}: re-split"
    if not snapshots:
        raise DynamicTableError(f"{where}: no snapshots given")
    keys = set(snapshots[0])
    row_keys = sorted(key for key in keys if key not in ("step", "counts") and not key.startswith("state/"))
    for task, snap in enumerate(snapshots):
        if set(snap) != keys or "ids" not in keys:
            raise DynamicTableError(f"{where}: task {task} has arrays {sorted(snap)}; task 0 has {sorted(keys)}")
        wrong = np.flatnonzero(owner_of(check_ids(snap["ids"], where), len(snapshots)) != task)
        if wrong.size:
            raise DynamicTableError(f"{where}: task {task} holds id {int(snap['ids'][wrong[0]])}, "
                                    f"which task {int(owner_of(snap['ids'][wrong[:1]], len(snapshots))[0])} owns")
    try:
        merged = {key: np.concatenate([snap[key] for snap in snapshots]) for key in row_keys}
    except ValueError as e:
        raise DynamicTableError(f"{where}: snapshots differ in row shape: {e}") from e
    order = np.argsort(merged["ids"], kind="stable")
    merged = {key: array[order] for key, array in merged.items()}
    ids = merged["ids"]
    if ids.size > 1 and bool(np.any(ids[1:] == ids[:-1])):
        raise DynamicTableError(f"{where}: id {int(ids[1:][ids[1:] == ids[:-1]][0])} is on two tasks")
    owners = owner_of(ids, num_ps)
    shared = {key: np.array(snapshots[0][key]) for key in keys if key.startswith("state/")}
    shared["step"] = np.array(max(int(snap["step"]) for snap in snapshots), np.int64)
    counts = _split_counts([snap["counts"] for snap in snapshots], num_ps) if "counts" in keys else None
    out = []
    for task in range(num_ps):
        mine = np.flatnonzero(owners == task)
        out.append({**{key: array[mine] for key, array in merged.items()}, **{k: v.copy() for k, v in shared.items()}})
        if counts is not None:
            out[-1]["counts"] = counts[task]
    return out


def _split_counts(counts: Sequence[np.ndarray], num_ps: int) -> list[np.ndarray]:
    """Each of ``num_ps`` tasks' counters from the saved tasks' ``counts``: their own where the count of tasks
    stays (each gets its own rows back), else the sums split as evenly as they go (task t gets one more of a
    sum's remainder while t < remainder): the totals stay exact."""
    if len(counts) == num_ps:
        return [np.array(c, np.int64) for c in counts]
    total = np.sum(np.stack(counts), axis=0, dtype=np.int64)
    return [np.asarray(total // num_ps + (task < total % num_ps), np.int64) for task in range(num_ps)]


def skip_steps(snapshot: Mapping[str, np.ndarray], steps: int) -> dict[str, np.ndarray]:
    """``snapshot`` with its rows' ``last_step`` and its ``step`` moved ``steps`` later (a copy; the rest shared).

    A restore within a run goes on after the last global_step value handed out, not at the checkpoint's: the values
    between them are taken by no push of the restored history, so they must age no row (``--ttl-steps``, lru).
    """
    return {**snapshot, "last_step": snapshot["last_step"] + np.int64(steps),
            "step": np.array(int(snapshot["step"]) + steps, np.int64)}
