"""Settings a launcher checks before any task starts, each refused in one line naming the flag and the numbers.

A setting that only a task can refuse costs the user a cluster start and a
traceback; :func:`check_settings`, which the local launcher
(:func:`psflow.launch.local.run_local`) and the in-process path call before
they start anything, refuses what can be known up front:

1. the model, its variables and their placement on ``--ps`` tasks
   (:func:`psflow.train.build.build_model` on a cluster of that shape:
   placement depends on the task counts, not the addresses);
2. each dynamic table's ``--capacity-bytes``: every ps task's share must hold
   at least one row with its optimizer slots, metadata and index
   (:func:`psflow.ps.dynamic.sizes.row_bytes`);
3. memory: each ps task's variables with their optimizer slots
   (:func:`ps_memory`), all together, against the memory this machine has
   available (``MemAvailable`` of ``/proc/meminfo``, lowered by a cgroup
   limit) -- every ps task of a local run is on this machine. Dynamic tables
   count for nothing here (they start empty; ``--capacity-bytes`` bounds them).

4. resuming: the newest checkpoint in ``--checkpoint-dir`` must hold the
   optimizer slots this run's optimizers need, no more and no fewer
   (:func:`check_resume`): another ``--optimizer`` is refused naming both, with
   the two ways on (resume with the checkpoint's optimizer, or take its
   variables alone with ``--warm-start`` into another ``--checkpoint-dir``).
   Hyperparameters (``--learning-rate``, ...) may change on a resume.

The seed's range is :class:`~psflow.train.config.TrainConfig`'s own check;
another model or data layout in the checkpoint is refused by
:func:`psflow.train.chief.check_restorable` (the launcher calls it through
:func:`psflow.train.duties.claim_checkpoint_dir` before any task starts).

Not checked: memory of ps tasks on other machines (``psflow server``), the
workers' own memory, and the transient copies a checkpoint save makes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import DTYPE_SIZES, VariablePlacement
from psflow.ps.averages import AVERAGE_SLOT
from psflow.ps.dynamic import DynamicTableError, share_spec
from psflow.ps.dynamic.sizes import row_bytes
from psflow.ps.optimizers import make_optimizer
from psflow.train.build import build_model
from psflow.train.config import ConfigError, TrainConfig

__all__ = ["check_settings", "check_resume", "ps_memory", "available_memory", "VariableMemory"]

_MEMINFO = "/proc/meminfo"
_CGROUP_MAX = "/sys/fs/cgroup/memory.max"
_CGROUP_CURRENT = "/sys/fs/cgroup/memory.current"


@dataclass(frozen=True)
class VariableMemory:
    """One variable's share on one ps task: its values and optimizer slots.

    Attributes:
        name: the variable. task: the ps task index. bytes: values plus slots.
        slots: how many optimizer slots it carries (each as large as its values), its moving average
            (:mod:`psflow.ps.averages`) counted as one.
        optimizer: the optimizer's name, or None (not trainable).
    """

    name: str
    task: int
    bytes: int
    slots: int
    optimizer: str | None


def _optimizer_of(placement: VariablePlacement, run_optimizer: OptimizerSpec) -> OptimizerSpec | None:
    """The optimizer a ps task applies to the variable (as the ps service picks it); None when not trainable."""
    var = placement.var
    if not var.trainable:
        return None
    return OptimizerSpec.from_json(dict(var.optimizer)) if var.optimizer else run_optimizer


def ps_memory(layout: Sequence[VariablePlacement], run_optimizer: OptimizerSpec) -> list[VariableMemory]:
    """Each static variable's bytes on each ps task that holds part of it, with its optimizer slots.

    Pure: allocates nothing. A dynamic table is left out (it starts empty).
    """
    out: list[VariableMemory] = []
    for placement in layout:
        var = placement.var
        if var.dynamic is not None:
            continue
        spec = _optimizer_of(placement, run_optimizer)
        slots = len(make_optimizer(spec).slot_names) if spec is not None else 0
        slots += var.moving_average_decay is not None  # its moving average, as large as its values
        row = math.prod(var.shape[1:]) if len(var.shape) > 1 else 1
        per_task: dict[int, int] = {}
        for part in placement.partitions:
            values = part.num_rows * row * DTYPE_SIZES[var.dtype]
            per_task[part.task] = per_task.get(part.task, 0) + values + slots * part.num_rows * row * 4  # float32 slots
        out += [VariableMemory(var.name, task, size, slots, spec.name if spec is not None else None)
                for task, size in per_task.items()]
    return out


def available_memory() -> int | None:
    """Bytes this machine can still give its processes: ``MemAvailable``, lowered by a cgroup v2 limit
    (``memory.max - memory.current``); None where neither can be read (not Linux)."""
    found: list[int] = []
    try:
        with open(_MEMINFO, encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    try:
        with open(_CGROUP_MAX, encoding="ascii") as f:
            limit = f.read().strip()
        with open(_CGROUP_CURRENT, encoding="ascii") as f:
            current = int(f.read().strip())
        if limit != "max":
            found.append(max(0, int(limit) - current))
    except (OSError, ValueError):
        pass
    return min(found) if found else None


def _gib(size: int) -> str:
    return f"{size / 2**30:.1f} GiB" if size >= 2**30 else f"{size / 2**20:.1f} MiB"


def _check_memory(shares: list[VariableMemory], available: int, num_ps: int) -> None:
    """Raises ConfigError when the ps tasks' variables and slots, all together, exceed ``available``."""
    total = sum(s.bytes for s in shares)
    if total <= available:
        return
    biggest = max(shares, key=lambda s: s.bytes)
    slots = (f" with its {biggest.slots} {biggest.optimizer} slot{'s' if biggest.slots != 1 else ''}"
             if biggest.slots else "")
    fix = ("lower --num-features or --embedding-dim, use an optimizer with fewer slots, "
           "or run the ps tasks on machines with more memory (psflow server)")
    if biggest.bytes > available:
        raise ConfigError(f"variable {biggest.name!r} needs {_gib(biggest.bytes)} on ps/{biggest.task}{slots}; this "
                          f"machine has {_gib(available)} available: {fix}")
    per_task: dict[int, int] = {}
    for s in shares:
        per_task[s.task] = per_task.get(s.task, 0) + s.bytes
    tasks = ", ".join(f"ps/{t}: {_gib(b)}" for t, b in sorted(per_task.items()))
    raise ConfigError(f"the variables need {_gib(total)} with their optimizer slots on the {num_ps} ps tasks ({tasks}; "
                      f"largest: {biggest.name!r}, {_gib(biggest.bytes)} on ps/{biggest.task}); this machine has "
                      f"{_gib(available)} available: {fix}")


def _check_dynamic(layout: Sequence[VariablePlacement], run_optimizer: OptimizerSpec) -> None:
    """Raises ConfigError when a dynamic table's ``--capacity-bytes`` cannot hold one row on each ps task
    (naming the table that needs the most, and the least capacity that holds a row of every table)."""
    given, least, short = 0, 0, []
    for placement in layout:
        var = placement.var
        if var.dynamic is None:
            continue
        spec = _optimizer_of(placement, run_optimizer)
        shares = len(placement.partitions)
        try:
            share = share_spec(var.name, var.shape[1], dict(var.dynamic), optimizer=spec,
                               initializer=dict(var.initializer), num_shares=shares)
        except DynamicTableError as e:
            raise ConfigError(f"--embedding-table dynamic: {e}") from e
        if share.capacity_bytes is None:
            continue
        raw, row = var.dynamic.get("capacity_bytes"), row_bytes(share)
        given = raw if isinstance(raw, int) else share.capacity_bytes * shares  # share_spec checked it is an int
        least = max(least, row * shares)
        if share.capacity_bytes < row:
            count = len(make_optimizer(spec).slot_names) if spec is not None else 0
            slots = f", {count} {spec.name} slot{'s' if count != 1 else ''}" if spec is not None else ""
            short.append((row * shares, f"of dynamic table {var.name!r}: a row takes {row} bytes (dim {var.shape[1]}"
                          f"{slots}, metadata and index), and the table's share on each of the {shares} ps "
                          f"task{'s' if shares != 1 else ''} gets {share.capacity_bytes}"))
    if short:
        raise ConfigError(f"--capacity-bytes {given} cannot hold one row {max(short)[1]}; give at least {least}")


def check_resume(config: TrainConfig, layout: Sequence[VariablePlacement]) -> None:
    """Refuses to resume the newest checkpoint of ``config.checkpoint.dir`` with optimizers whose slots differ
    from the ones it saved (another ``--optimizer``); nothing to check without a checkpoint.

    Reads the checkpoint's manifest only. Variables the checkpoint lacks, or whose slots it does not list,
    are left to the restore.

    Raises:
        ConfigError: names the checkpoint, its optimizer and this run's, a variable whose slots differ,
            and the two ways on.
        CheckpointError: the newest checkpoint's manifest cannot be read.
    """
    latest = latest_checkpoint(config.checkpoint.dir) if config.checkpoint.dir else None
    if latest is None:
        return
    manifest = read_manifest(latest)
    run_optimizer = config.optimizer_spec()
    for placement in layout:
        saved = manifest.variables.get(placement.var.name) or {}
        parts = saved.get("partitions") or [{}]
        if not isinstance(parts[0], dict) or parts[0].get("slots") is None:
            continue
        had = tuple(str(slot) for slot in parts[0]["slots"] if slot != AVERAGE_SLOT)  # a moving average: not the optimizer's
        spec = _optimizer_of(placement, run_optimizer)
        optimizer = make_optimizer(spec) if spec is not None else None
        want = optimizer.slot_names if optimizer is not None else ()
        # A static variable's checkpoint holds the optimizer's 0-d state (Adam's beta powers) among its slots; a
        # dynamic table's does not: the row-shaped slots are what must agree.
        state = optimizer.state_names if optimizer is not None else ()
        if sorted(slot for slot in had if slot not in state) == sorted(want):
            continue
        theirs = str((manifest.optimizer or {}).get("name") or "another optimizer")
        ours = spec.name if spec is not None else "none (not trainable)"
        raise ConfigError(
            f"--checkpoint-dir {config.checkpoint.dir}: its newest checkpoint {latest} was written with --optimizer "
            f"{theirs} (variable {placement.var.name!r} has slots {', '.join(had) or 'none'}); this run asks for "
            f"{ours} (slots {', '.join(want) or 'none'}). Resume with --optimizer {theirs}, or start from its "
            f"variables alone, with fresh optimizer state: --warm-start {latest} and another --checkpoint-dir")


def check_settings(config: TrainConfig, *, memory: bool = True, available: int | None = None) -> None:
    """Refuses, before any task starts, settings the tasks would refuse later (see the module docstring).

    Blocking; builds the model (no variables are allocated), reads ``/proc/meminfo`` and the newest
    checkpoint's manifest. ``memory``: check the ps tasks' memory (False where they run on other machines:
    ``psflow server``); ``available``: the memory to compare with (default :func:`available_memory`;
    None from it skips the check).

    Raises:
        ConfigError: a dynamic table's capacity cannot hold a row, the ps tasks' variables do not fit
            this machine's memory (names the variable, the task and the numbers), or the newest
            checkpoint was written with another optimizer (:func:`check_resume`).
        ModelError: the model or the placement refuses its settings.
        CheckpointError: the newest checkpoint's manifest cannot be read.
    """
    shape = ClusterSpec({"ps": [f"127.0.0.1:{i + 1}" for i in range(config.cluster.num_ps)],
                         "worker": [f"127.0.0.1:{config.cluster.num_ps + i + 1}" for i in range(config.cluster.num_workers)]})
    _, variables = build_model(config, shape)
    layout = variables.placements()
    run_optimizer = config.optimizer_spec()
    _check_dynamic(layout, run_optimizer)
    free = available if available is not None else (available_memory() if memory else None)
    if memory and free is not None:
        _check_memory(ps_memory(layout, run_optimizer), free, config.cluster.num_ps)
    check_resume(config, layout)
