"""Restore: a checkpoint loaded onto the ps tasks of the current layout, whatever layout saved it.

:func:`restore` re-slices every variable and its optimizer slots onto the current partitions (another number
of ps tasks, placement strategy or partition count), re-splits dynamic tables by owner, and sends each ps task
its partitions in one ``LoadShard`` call, all tasks in parallel (:func:`load_shards`). A lazy partition saved as
its built rows travels as the rows the checkpoint holds (whatever the partitioning that saved it), and the ps
task keeps its partition lazy, the other rows unbuilt (:mod:`psflow.ps.built_rows`). Every variable is checked
(missing, another shape, dtype or kind: refused, naming it) before its rows are read. A restore whose loads the
restore fence refused (another restore began on the tasks since: this restorer was deposed, or a first restore met
a lease holder's) raises :class:`RestoreRefusedError`, so its caller waits for that restore instead of failing.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psflow.checkpoint.chain import ChainReader
from psflow.checkpoint.manifest import Manifest, read_manifest
from psflow.errors import CheckpointError
from psflow.ps.averages import AVERAGE_SLOT
from psflow.ps.client import ParameterClient
from psflow.ps.dynamic import skip_steps
from psflow.ps.protocol import LoadShardRequest
from psflow.ps.protocol.save_shard import applied_by_process
from psflow.ps.store import partition_key
from psflow.rpc.api import DeadlineExceededError, FencedOffError, InvalidRequest, RpcError

log = logging.getLogger(__name__)

__all__ = ["restore", "ShardLoad", "load_shards", "RestoreRefusedError"]


class RestoreRefusedError(CheckpointError):
    """Every ps task that failed its ``LoadShard`` refused it by the restore fence (the task holds another restore's
    generation, or is ready: :meth:`~psflow.ps.restore_gate.RestoreGate.check_load`), nothing loaded there: another
    restorer's restore began on the tasks since, so this one's is left to it. The message names every task."""



def _check_variable(path: str, manifest: Manifest, name: str, shape: tuple[int, ...], dtype: str,
                    dynamic: bool = False) -> dict[str, Any]:
    saved = manifest.variables.get(name)
    if saved is None:
        raise CheckpointError(f"checkpoint {path} has no variable {name!r} (it has {', '.join(sorted(manifest.variables))})")
    if ("dynamic" in saved) != dynamic:
        kinds = ("a static variable", "a dynamic table")
        raise CheckpointError(f"variable {name!r} is {kinds[dynamic]} in this run; checkpoint {path} has it as "
                              f"{kinds['dynamic' in saved]}")
    if tuple(saved["shape"]) != shape or saved["dtype"] != dtype:
        raise CheckpointError(f"variable {name!r} has shape {shape} ({dtype}); checkpoint {path} has "
                              f"{tuple(saved['shape'])} ({saved['dtype']})")
    return saved


def restore(client: ParameterClient, path: str, *, global_step: int | None = None,
            push_counts: bool = True, generation: int | None = None) -> Manifest:
    """Loads checkpoint ``path`` into the ps tasks of ``client``'s layout.

    Re-slices every variable and its optimizer slots onto the current
    partitions (see :mod:`psflow.checkpoint`; an increment: read through its chain, the newest full
    checkpoint and every increment after it, :mod:`psflow.checkpoint.chain`), then sends each ps task its
    partitions in one ``LoadShard`` call (tasks in parallel); the task
    holding global_step also gets global_step (``global_step`` if given,
    else the checkpoint's), the reader positions, the example count and the
    checkpoint's lineage (which the restored cluster continues). With a ``global_step`` past the checkpoint's (a
    restore within the run goes on after the last step handed out), every dynamic table row's last use moves up by
    the difference: steps no push of the restored history took age no row (``--ttl-steps``, lru). A replicated
    shard's checkpoint of the same number of ps tasks gives each task its
    shard's ``pushes_applied`` (which the task keeps in a restore within the
    run: see :mod:`psflow.ps.checkpointing`, ``LoadShard``); ``push_counts`` False sends
    none (a checkpoint another run wrote: its counts are not this run's). ``generation``: the restore's, which
    every ``LoadShard`` carries: the one its ``BeginRestore`` set, or 0 for a first restore with none (tasks
    not ready yet); a task holding another, or ready, refuses the load and changes nothing (a deposed
    restorer's late load). None: not sent, not checked.
    Does not mark the tasks ready (the chief does that afterwards).

    Raises:
        RestoreRefusedError: (a CheckpointError) every task that failed its load refused it by the restore fence
            (``generation`` is not the one it holds, or it is ready: names each task and both generations).
        CheckpointError: the checkpoint is incomplete or damaged, a variable
            is missing or has another shape, dtype or set of slots (names it); a task failed its load otherwise
            (names every task that failed, the refusals among them).
    """
    manifest = read_manifest(path)
    reader = ChainReader(path, manifest)  # an increment: its full checkpoint and the increments up to it
    per_task = {t: ShardLoad() for t in client.channels}
    # A restore within the run goes on after the last step handed out: the steps skipped age no dynamic table row.
    skipped = max(0, global_step - manifest.global_step) if global_step is not None else 0
    for name, placement in client.layout.items():
        var = placement.var
        saved = _check_variable(path, manifest, name, tuple(var.shape), var.dtype, placement.is_dynamic)
        if placement.is_dynamic:
            for part, snapshot in zip(placement.partitions, reader.table(name, len(placement.partitions)), strict=True):
                key = partition_key(name, part.index)
                load = per_task[part.task]
                load.keys.append(key)
                load.tables[key] = skip_steps(snapshot, skipped) if skipped else snapshot
            continue
        saved_parts = sorted(saved["partitions"], key=lambda p: p["row_start"])
        slots = [slot for slot in saved_parts[0]["slots"] if slot != AVERAGE_SLOT]
        saved_average = len(slots) < len(saved_parts[0]["slots"])
        for part in placement.partitions:
            key = partition_key(name, part.index)
            load = per_task[part.task]
            load.keys.append(key)
            built = reader.built(name, part.row_start, part.row_stop)
            if built is not None:  # only the rows saved travel: a lazy partition stays lazy (psflow.ps.built_rows)
                _load_built(reader, load, key, name, part.row_start, tuple(var.shape), slots, built,
                            var.moving_average_decay is not None, saved_average)
                continue
            load.values[key] = value = reader.rows(name, part.row_start, part.row_stop, None)
            part_slots = load.slots.setdefault(key, {})
            for slot in slots:
                part_slots[slot] = reader.rows(name, part.row_start, part.row_stop, slot)
            if var.moving_average_decay is not None:  # the saved average, else one starting at the restored value
                part_slots[AVERAGE_SLOT] = (
                    reader.rows(name, part.row_start, part.row_stop, AVERAGE_SLOT) if saved_average
                    else value)
    restored_step = manifest.global_step if global_step is None else global_step
    counts = _push_counts(path, manifest, len(per_task)) if push_counts else {}
    calls: dict[int, LoadShardRequest] = {}
    for task, load in per_task.items():
        # every task keeps the checkpoint and its own step with the restore's generation (its Stats name them)
        fields = dict(restored_step=restored_step, generation=generation, restored_from=path,
                      restored_from_step=manifest.global_step, **counts.get(task, {}))
        if task == client.step_task:  # the restored cluster continues the checkpoint's lineage
            calls[task] = load.request(global_step=restored_step, positions=manifest.reader_positions,
                                       examples=manifest.examples, lineage=manifest.lineage or None, **fields)
        else:
            calls[task] = load.request(**fields)
    load_shards(client, calls, f"restoring {path}")
    return manifest


def _load_built(reader: ChainReader, load: ShardLoad, key: str, name: str, row_start: int, shape: tuple[int, ...],
                slots: list[str], built: tuple[np.ndarray, dict[str, Any], dict[str, np.ndarray]], averaged: bool,
                saved_average: bool) -> None:
    """Partition ``key`` (from global row ``row_start``) sent as the rows the checkpoint's chain saved (``built``:
    :meth:`ChainReader.built`), each row-laid slot's initial row and the initializer giving the others."""
    rows, spec, initial = built
    load.values[key] = value = reader.rows_at(name, rows, None, spec, initial)
    part_slots = load.slots.setdefault(key, {})
    for slot in slots:
        state = None if slot in initial else reader.rows(name, row_start, row_start + 1, slot)
        # 0-d state (Adam's beta powers) whole; a row-laid slot at the saved rows (none without its initial row)
        part_slots[slot] = state if state is not None and state.ndim == 0 else reader.rows_at(name, rows, slot, spec, initial)
    if averaged:  # the saved average, else one starting at the restored value
        part_slots[AVERAGE_SLOT] = reader.rows_at(name, rows, AVERAGE_SLOT, spec, initial) if saved_average else value
    load.built[key] = (rows - row_start, {"initializer": spec, "shape": list(shape)},
                       {slot: row for slot, row in initial.items() if slot in slots})


def _push_counts(path: str, manifest: Manifest, num_tasks: int) -> dict[int, dict[str, Any]]:
    """ps task -> the ``LoadShard`` fields of the pushes its shard of the checkpoint ``path`` holds (replicated
    shards: ``pushes_applied`` and, where saved, ``pushes_applied_by``); none when the checkpoint has another
    number of ps tasks (its shards are not these) or no count (unreplicated, older). A damaged per-process count
    is left out, with a warning naming the checkpoint and the shard (the loss is then counted from totals)."""
    if len(manifest.shards) != num_tasks:
        return {}
    out: dict[int, dict[str, Any]] = {}
    for task, record in enumerate(manifest.shards):
        n = record.get("pushes_applied")
        if type(n) is int and n >= 0:
            out[task] = {"pushes_applied": n}
            try:
                by = applied_by_process(record.get("pushes_applied_by"))
            except InvalidRequest as e:
                log.warning("checkpoint %s, shard %d: %s; the shard's lost pushes are counted from its totals",
                            path, task, e)
                by = None
            if by is not None:
                out[task]["pushes_applied_by"] = by
    return out


@dataclass
class ShardLoad:
    """What one ps task loads: its partitions' keys, values, slots and dynamic tables' snapshots."""

    keys: list[str] = field(default_factory=list)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    slots: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    tables: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    #: partitions sent as their saved rows: key -> (local rows, {"initializer", "shape"}, slots' initial rows)
    built: dict[str, tuple[np.ndarray, dict[str, Any], dict[str, np.ndarray]]] = field(default_factory=dict)

    def request(self, **fields: Any) -> LoadShardRequest:
        return LoadShardRequest.build(self.values, self.slots, self.tables, self.keys, self.built, **fields)


def load_shards(client: ParameterClient, requests: Mapping[int, LoadShardRequest], what: str) -> None:
    """Sends each ps task its ``LoadShard`` (all in flight at once) and waits for every reply. Each call's
    deadline is the client's ``save_timeout`` (``--save-timeout``: a load takes as long as the shard is big, not
    one small call's ``rpc_timeout``), and goes with it: a replicated shard's primary waits that long for its
    backups to take the load. A task that dies fails its call at once (the connection breaks).

    Raises:
        RestoreRefusedError: every task that failed refused by the restore fence (names each), after all replied.
        CheckpointError: any other failure among them (names every task that failed), after all replied.
    """
    timeout = client.config.save_timeout
    calls = {task: client.call_async(task, dataclasses.replace(request, reply_within_ms=int(timeout * 1000)), timeout=timeout)
             for task, request in requests.items()}
    errors = []
    fenced = 0  # refused by the restore fence (its own status, ABORTED: FencedOffError), not failed otherwise
    for task, call in calls.items():  # every call collected, even after a refusal
        try:
            call.result()
        except RpcError as e:
            fenced += isinstance(e, FencedOffError)
            late = f" (no reply within --save-timeout, {timeout:g} s)" if isinstance(e, DeadlineExceededError) else ""
            name = client.channels[task].task  # a call's error names its task already (the carriers prefix it)
            errors.append(f"{e}{late}" if str(e).startswith(name) else f"{name}: {e}{late}")
    if errors:
        raise (RestoreRefusedError if fenced == len(errors) else CheckpointError)(f"{what} failed: " + "; ".join(errors))
