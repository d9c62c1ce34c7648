"""Warm start: whole variables' values written onto the ps tasks (slots and global_step untouched).

TensorFlow's warm start. :func:`read_warm_start` reads the values from a safetensors file, a directory
written by ``psflow export``, a checkpoint or a checkpoint directory (its newest checkpoint);
:func:`load_values` checks every array against the layout before anything is sent, then loads each ps task's
partitions in one ``LoadShard`` call.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

from psflow import storage
from psflow.checkpoint.manifest import MANIFEST_NAME
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.restore import ShardLoad, load_shards
from psflow.checkpoint.variables import DYNAMIC_IDS, read_safetensors, read_variables
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient
from psflow.ps.store import partition_key

__all__ = ["warm_start", "read_warm_start", "load_values"]


def read_warm_start(path: str) -> dict[str, np.ndarray]:
    """Whole variables to warm-start from, by name.

    ``path`` is a ``.safetensors`` file of whole variables, a directory
    written by ``psflow export``, a checkpoint, or a checkpoint directory (its
    newest checkpoint); optimizer slots are never read.

    Raises:
        CheckpointError: nothing readable at ``path`` (names it).
    """
    if storage.isdir(path):
        exported = os.path.join(path, "model.safetensors")
        if storage.exists(exported):
            path = exported
        else:
            checkpoint = path if storage.exists(os.path.join(path, MANIFEST_NAME)) else latest_checkpoint(path)
            if checkpoint is None:
                raise CheckpointError(f"warm start: {path} holds no checkpoint, exported model or safetensors file")
            return read_variables(checkpoint)
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
    return load_values(client, read_warm_start(path), f"warm start {path}")


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
        placement = client.layout.get(name.removesuffix(DYNAMIC_IDS))
        if placement is None:
            raise CheckpointError(f"{what}: variable {name!r} is not a variable of the model "
                                  f"(it has {', '.join(client.layout)})")
        if placement.is_dynamic:
            raise CheckpointError(f"{what}: {placement.var.name!r} is a dynamic table, which is not warm-started "
                                  f"(restore a checkpoint to continue its rows)")
        var = placement.var
        if tuple(array.shape) != tuple(var.shape) or str(array.dtype) != var.dtype:
            raise CheckpointError(f"{what}: variable {name!r} has shape {tuple(array.shape)} ({array.dtype}); "
                                  f"the model's has {tuple(var.shape)} ({var.dtype})")
    per_task: dict[int, ShardLoad] = {}
    for name, array in values.items():
        for part in client.layout[name].partitions:
            load = per_task.setdefault(part.task, ShardLoad())
            key = partition_key(name, part.index)
            load.keys.append(key)
            load.values[key] = np.ascontiguousarray(array[part.row_start:part.row_stop] if array.ndim else array)
    load_shards(client, {task: load.request(values_only=True) for task, load in per_task.items()}, what)
    return sorted(values)
