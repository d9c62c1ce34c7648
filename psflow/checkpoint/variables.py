"""A checkpoint's variables read whole (partitions joined), for export, evaluation and warm start.

:func:`read_variables` gives every variable of a checkpoint (a dynamic table as its rows sorted by id plus
its ids, ``<name>@ids``), optionally its optimizer slots, or each variable's moving average in its place;
:func:`read_safetensors` reads a plain safetensors file (local or in an object store).
"""

from __future__ import annotations

import numpy as np

from psflow import storage
from psflow.checkpoint.chain import ChainReader
from psflow.checkpoint.manifest import Manifest, read_manifest
from psflow.ps.averages import AVERAGE_SLOT

__all__ = ["DYNAMIC_IDS", "averaged_variables", "read_variables", "read_safetensors"]


#: Suffix of a dynamic table's ids beside its rows in :func:`read_variables` and exported models.
DYNAMIC_IDS = "@ids"


def averaged_variables(manifest: Manifest) -> list[str]:
    """The variables whose moving average (slot ``ExponentialMovingAverage``) the checkpoint holds, sorted."""
    return sorted(name for name, saved in manifest.variables.items() if "dynamic" not in saved
                  and any(AVERAGE_SLOT in (part.get("slots") or ()) for part in saved.get("partitions") or ()))


def read_variables(path: str, *, slots: bool = False, moving_averages: bool = False) -> dict[str, np.ndarray]:
    """Every variable of checkpoint ``path``, whole (partitions joined).

    A dynamic table ``emb`` gives its rows sorted by id as ``emb`` ``[n, dim]``
    and their ids as ``emb@ids`` (:data:`DYNAMIC_IDS`) ``[n]`` int64.

    Args:
        path: a checkpoint directory (with a manifest); an increment is read through its chain.
        slots: also return each optimizer slot as ``"<var>:<slot>"`` (a moving
            average as ``"<var>:ExponentialMovingAverage"``).
        moving_averages: each averaged variable's moving average in place of
            its value (the others as they are; see :func:`averaged_variables`).

    Raises:
        CheckpointError: incomplete or damaged checkpoint.
    """
    manifest = read_manifest(path)
    reader = ChainReader(path, manifest)  # an increment: read through its chain (psflow.checkpoint.chain)
    out: dict[str, np.ndarray] = {}
    for name, saved in manifest.variables.items():
        if "dynamic" in saved:
            (table,) = reader.table(name, 1)
            out[name], out[f"{name}{DYNAMIC_IDS}"] = table["values"], table["ids"]
            if slots:
                out.update({f"{name}:{k[len('slot/'):]}": v for k, v in table.items() if k.startswith("slot/")})
            continue
        parts = sorted(saved["partitions"], key=lambda p: p["row_start"])
        rows = saved["shape"][0] if saved["shape"] else 1
        average = moving_averages and AVERAGE_SLOT in parts[0]["slots"]
        out[name] = reader.rows(name, 0, rows, AVERAGE_SLOT if average else None)
        if slots:
            for slot in parts[0]["slots"]:
                out[f"{name}:{slot}"] = reader.rows(name, 0, rows, slot)
    return out


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of the safetensors file ``path`` (a local path or a URL, see :mod:`psflow.storage`).

    Raises:
        OSError: the file cannot be read; safetensors' own errors for a file that is not one.
    """
    from safetensors.numpy import load, load_file

    if storage.is_remote(path):
        return dict(load(storage.read_bytes(path)))
    return dict(load_file(path))
