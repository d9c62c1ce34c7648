"""Warm start: whole variables' values written onto the ps tasks (slots and global_step untouched).

TensorFlow's warm start. :func:`read_warm_start` reads the values from a safetensors file, a directory
written by ``psflow export``, a checkpoint or a checkpoint directory (its newest checkpoint);
:func:`load_values` checks every array against the layout before anything is sent, then loads each ps task's
partitions in one ``LoadShard`` call.

From a checkpoint, :func:`warm_start` reads partition by partition. A lazy table's partition saved as its built
rows (:mod:`psflow.ps.built_rows`) whose variable has the checkpoint's initializer spec (seed included) and
shape travels as those rows only (``LoadShard`` values-only with ``b/<key>``): the rows not saved hold what
the model's initializer gives them already, so a lazy partition on the ps task stays lazy, building only the
saved rows (issue 29: W&D's 2^20-row tables). Another initializer or seed, or a checkpoint of every row: the
partition is sent whole, as before, and built whole. The values are those of the whole variables either way.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from psflow import storage
from psflow.checkpoint.chain import ChainReader
from psflow.checkpoint.export_files import MODEL_FILE, read_exported_variables
from psflow.checkpoint.manifest import MANIFEST_NAME, read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.restore import ShardLoad, load_shards
from psflow.checkpoint.variables import DYNAMIC_IDS, read_safetensors, read_variables
from psflow.errors import CheckpointError
from psflow.ps.built_rows import same_initializer
from psflow.ps.client import ParameterClient
from psflow.ps.store import partition_key

__all__ = ["warm_start", "read_warm_start", "load_values"]


def read_warm_start(path: str) -> dict[str, np.ndarray]:
    """Whole variables to warm-start from, by name.

    ``path`` is a ``.safetensors`` file of whole variables, a directory
    written by ``psflow export``, a checkpoint, or a checkpoint directory (its
    newest checkpoint); optimizer slots are never read. An export's
    model.safetensors is read only once its bytes are the file its model.json
    names (:func:`~psflow.checkpoint.export_files.read_exported_variables`, the
    check ``psflow predict`` makes): one another export is rewriting meanwhile,
    or a damaged one, is refused, never trained on.

    Raises:
        CheckpointError: nothing readable at ``path`` (names it); an export without its model.json (being
            written), or whose model.safetensors is not the file model.json names (names the directory and the
            file: export again).
    """
    checkpoint = _checkpoint_at(path)
    if checkpoint is not None:
        return read_variables(checkpoint)
    if storage.isdir(path):
        try:
            return read_exported_variables(path)
        except CheckpointError as e:
            raise CheckpointError(f"warm start: {e}") from e
    try:
        return read_safetensors(path)
    except Exception as e:  # safetensors raises its own error types
        raise CheckpointError(f"warm start: cannot read {path}: {e}") from e


def warm_start(client: ParameterClient, path: str) -> list[str]:
    """Overwrites the values of the variables found at ``path`` on the ps tasks (slots and global_step untouched).

    TensorFlow's warm start: the chief calls it right after it initialized the
    variables (never after restoring a checkpoint, which holds newer values).
    Variables not found at ``path`` keep their initializer's values. Every
    variable found there is checked before anything is sent.

    Returns:
        The names of the variables warm-started.

    Raises:
        CheckpointError: ``path`` is unreadable, or holds a variable the model
            did not declare or one of another shape or dtype (names it).
    """
    checkpoint = _checkpoint_at(path)
    if checkpoint is not None:
        return _load_checkpoint(client, checkpoint, f"warm start {path}")
    return load_values(client, read_warm_start(path), f"warm start {path}")


def _checkpoint_at(path: str) -> str | None:
    """The checkpoint ``path`` names (itself, or a checkpoint directory's newest), or None: a file or an
    exported model.

    Raises:
        CheckpointError: a directory holding no checkpoint, exported model or safetensors file (names it).
    """
    if not storage.isdir(path) or storage.exists(os.path.join(path, MODEL_FILE)):
        return None
    checkpoint = path if storage.exists(os.path.join(path, MANIFEST_NAME)) else latest_checkpoint(path)
    if checkpoint is None:
        raise CheckpointError(f"warm start: {path} holds no checkpoint, exported model or safetensors file")
    return checkpoint


def _load_checkpoint(client: ParameterClient, checkpoint: str, what: str) -> list[str]:
    """:func:`load_values` of checkpoint ``checkpoint``'s variables, read a partition at a time: a partition saved
    as its built rows of the variable's own initializer spec and shape is sent as those rows (the ps task builds
    only them, :func:`psflow.ps.built_rows.warm_built`), any other whole. The same checks, the same values."""
    manifest = read_manifest(checkpoint)
    if any("dynamic" in saved for saved in manifest.variables.values()):
        return load_values(client, read_variables(checkpoint), what)  # refused there, naming the table
    for name, saved in manifest.variables.items():  # every variable checked before anything is read
        _check(client, name, tuple(saved["shape"]), str(saved["dtype"]), what)
    reader = ChainReader(checkpoint, manifest)
    per_task: dict[int, ShardLoad] = {}
    for name in manifest.variables:
        var = client.layout[name].var
        for part in client.layout[name].partitions:
            load = per_task.setdefault(part.task, ShardLoad())
            key = partition_key(name, part.index)
            load.keys.append(key)
            if not var.shape:  # a scalar
                load.values[key] = reader.rows(name, 0, 1, None)
                continue
            built = reader.built(name, part.row_start, part.row_stop)
            if built is not None and same_initializer(built[1], var.initializer):
                rows, spec, initial = built
                load.values[key] = reader.rows_at(name, rows, None, spec, initial)
                load.built[key] = (rows - part.row_start, {"initializer": spec, "shape": list(var.shape)}, {})
            else:  # another initializer (or seed), or saved with every row: sent whole, built whole
                load.values[key] = reader.rows(name, part.row_start, part.row_stop, None)
    load_shards(client, {task: load.request(values_only=True) for task, load in per_task.items()}, what)
    return sorted(manifest.variables)


def _check(client: ParameterClient, name: str, shape: tuple[int, ...], dtype: str, what: str) -> None:
    """Refuses variable ``name`` of ``shape`` and ``dtype`` at the warm start's source, naming it, where the model did
    not declare it, declared a dynamic table, or declared it of another shape or dtype."""
    placement = client.layout.get(name.removesuffix(DYNAMIC_IDS))
    if placement is None:
        raise CheckpointError(f"{what}: variable {name!r} is not a variable of the model "
                              f"(it has {', '.join(client.layout)})")
    if placement.is_dynamic:
        raise CheckpointError(f"{what}: {placement.var.name!r} is a dynamic table, which is not warm-started "
                              f"(restore a checkpoint to continue its rows)")
    var = placement.var
    if shape != tuple(var.shape) or dtype != var.dtype:
        raise CheckpointError(f"{what}: variable {name!r} has shape {shape} ({dtype}); "
                              f"the model's has {tuple(var.shape)} ({var.dtype})")


def load_values(client: ParameterClient, values: Mapping[str, np.ndarray], what: str) -> list[str]:
    """Overwrites the values of whole variables on the ps tasks (slots and global_step untouched).

    Every array is checked against the layout before anything is sent.

    Args:
        client: a registered client.
        values: variable name -> its whole value.
        what: where the values come from, for errors (``"warm start PATH"``).

    Returns:
        The names of the variables loaded, sorted.

    Raises:
        CheckpointError: a variable the model did not declare, or one of
            another shape or dtype (names it).
    """
    for name, array in values.items():
        _check(client, name, tuple(array.shape), str(array.dtype), what)
    per_task: dict[int, ShardLoad] = {}
    for name, array in values.items():
        for part in client.layout[name].partitions:
            load = per_task.setdefault(part.task, ShardLoad())
            key = partition_key(name, part.index)
            load.keys.append(key)
            load.values[key] = np.ascontiguousarray(array[part.row_start:part.row_stop] if array.ndim else array)
    load_shards(client, {task: load.request(values_only=True) for task, load in per_task.items()}, what)
    return sorted(values)
