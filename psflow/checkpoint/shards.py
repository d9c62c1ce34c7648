"""Reading a checkpoint's shard files: each one checked against the manifest's sha256, rows re-sliced along axis 0.

:class:`ShardFiles` opens the safetensors files of one checkpoint (fetched once into a local temp directory
from an object store); :func:`saved_rows` assembles any row range of a variable or of one of its slots from
the saved partitions that overlap it (a lazy partition saved as its built rows, ``"built": n``, gives its
other rows from its initializer and slot initial rows, bit for bit what an eager one holds:
:func:`part_rows`, :mod:`psflow.ps.built_rows`); :func:`saved_table` re-splits a dynamic table's saved snapshots onto a
number of partitions (by :func:`~psflow.ps.dynamic.owner_of`). Nothing is ever unpickled: tensors are
safetensors.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np
from safetensors import safe_open

from psflow import storage
from psflow.checkpoint.manifest import Manifest
from psflow.errors import CheckpointError
from psflow.ps.averages import AVERAGE_SLOT
from psflow.ps.built_rows import built_rows_name, initial_slot_name, whole_rows
from psflow.ps.checkpointing import dynamic_tensor_names, shard_tensor_names
from psflow.ps.dynamic import DynamicTableError, resplit_snapshots
from psflow.ps.store import partition_key

__all__ = ["ShardFiles", "saved_rows", "part_rows", "stored_tensor", "saved_table", "dynamic_snapshot", "verify_shard"]


class ShardFiles:
    """Open safetensors files of one checkpoint, checked against the manifest.

    A checkpoint in an object store: each shard is fetched once into a local temp directory (removed with
    this object), checked there and read from there (safetensors maps a local file).
    """

    def __init__(self, path: str, manifest: Manifest) -> None:
        self.path = path
        self._expected = {s["file"]: s for s in manifest.shards}
        self._open: dict[str, Any] = {}
        self._fetched: str | None = None

    def get(self, file: str) -> Any:
        handle = self._open.get(file)
        if handle is None:
            full = os.path.join(self.path, file)
            expected = self._expected.get(file)
            if expected is None:
                raise CheckpointError(f"{full}: not listed in the manifest")
            local = self._local(full, file)
            verify_shard(local, expected, shown=full)
            try:
                handle = safe_open(local, framework="numpy")
            except Exception as e:  # safetensors raises its own error types
                raise CheckpointError(f"{full}: unreadable shard: {e}") from e
            self._open[file] = handle
        return handle

    def _local(self, full: str, file: str) -> str:
        """A local file holding shard ``full``: itself, or its copy fetched from the object store."""
        if not storage.is_remote(full):
            return full
        if self._fetched is None:
            self._fetched = tempfile.mkdtemp(prefix="psflow-shards-")
            weakref.finalize(self, shutil.rmtree, self._fetched, True)
        local = os.path.join(self._fetched, os.path.basename(file))
        try:
            storage.download(full, local)
        except OSError as e:
            raise CheckpointError(f"{full}: cannot read shard: {e}") from e
        return local


def verify_shard(file: str, expected: Mapping[str, Any], *, shown: str | None = None) -> None:
    """The local file ``file`` has the manifest's sha256 (errors name ``shown``, default ``file``)."""
    shown = shown or file
    digest = hashlib.sha256()
    try:
        with open(file, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError as e:
        raise CheckpointError(f"{shown}: cannot read shard: {e}") from e
    if digest.hexdigest() != expected["sha256"]:
        raise CheckpointError(f"{shown}: sha256 differs from the manifest's (damaged shard)")


def stored_tensor(shards: ShardFiles, part: Mapping[str, Any], name: str, var: str) -> np.ndarray:
    """Tensor ``name`` of the shard holding saved partition ``part`` of ``var``, whole.

    Raises:
        CheckpointError: the shard lacks it (names the file, the variable and the tensor).
    """
    tensor = shards.get(part["shard"])
    if name not in tensor.keys():
        raise CheckpointError(f"{os.path.join(shards.path, part['shard'])}: variable {var!r} partition "
                              f"{part['index']} has no tensor {name!r}")
    return np.asarray(tensor.get_tensor(name))


def part_rows(shards: ShardFiles, var: str, part: Mapping[str, Any], name: str, slot: str | None, lo: int,
              hi: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Global rows ``lo:hi`` (within it) of saved partition ``part``'s tensor ``name`` (the value or ``slot``), as an
    eager partition holds them: sliced from the tensor, or (``"built"``) the initial rows with the built ones laid
    over them. ``shape``, ``dtype``: the variable's.

    Raises:
        CheckpointError: a built partition's shard or record lacks what gives its rows (names the file and variable).
    """
    row_start = part["row_start"]
    if "built" not in part:
        return np.asarray(shards.get(part["shard"]).get_slice(name)[lo - row_start:hi - row_start])
    key = partition_key(var, part["index"])
    spec = part.get("initializer")
    if not isinstance(spec, dict):
        raise CheckpointError(f"{os.path.join(shards.path, part['shard'])}: variable {var!r} partition "
                              f"{part['index']} holds only its built rows but the manifest records no initializer")
    built = stored_tensor(shards, part, built_rows_name(key), var)
    saved = stored_tensor(shards, part, name, var)
    if built.ndim != 1 or saved.shape[:1] != built.shape:
        raise CheckpointError(f"{os.path.join(shards.path, part['shard'])}: variable {var!r} partition "
                              f"{part['index']}: {built.size} built rows but tensor {name!r} has shape {saved.shape}")
    initial = None if slot in (None, AVERAGE_SLOT) else stored_tensor(shards, part, initial_slot_name(key, slot), var)
    return whole_rows(spec, shape, dtype, row_start, lo - row_start, hi - row_start, built, saved, initial)


def saved_rows(shards: ShardFiles, var: str, saved: list[dict[str, Any]], start: int, stop: int,
               slot: str | None, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Rows ``start:stop`` of a variable (or of one of its slots) from the saved partitions; ``shape``,
    ``dtype``: the variable's (a lazy partition's rows not saved are computed from them)."""
    pieces = []
    for part in saved:
        value_name, slot_names = shard_tensor_names(partition_key(var, part["index"]), part["slots"])
        name = value_name if slot is None else slot_names[slot]
        tensor = shards.get(part["shard"])
        if not tensor.get_slice(name).get_shape():
            # A scalar variable (one partition), or 0-d optimizer state: taken
            # from the saved partition holding the first wanted row.
            if slot is None or part["row_start"] <= start < part["row_stop"]:
                return np.asarray(tensor.get_tensor(name))
            continue
        lo, hi = max(start, part["row_start"]), min(stop, part["row_stop"])
        if lo < hi:
            pieces.append(part_rows(shards, var, part, name, slot, lo, hi, shape, dtype))
    if not pieces:
        raise CheckpointError(f"{shards.path}: no saved rows {start}:{stop} of variable {var!r}")
    return pieces[0] if len(pieces) == 1 else np.concatenate(pieces, axis=0)


def dynamic_snapshot(shards: ShardFiles, var: str, saved: list[dict[str, Any]]) -> list[dict[str, np.ndarray]]:
    """The snapshot of each saved partition of dynamic table ``var``, by partition index."""
    out = []
    for part in sorted(saved, key=lambda p: p["index"]):
        tensor = shards.get(part["shard"])
        names = dynamic_tensor_names(partition_key(var, part["index"]), list(part["dynamic"]))
        out.append({key: np.asarray(tensor.get_tensor(name)) for key, name in names.items()})
    return out


def saved_table(shards: ShardFiles, var: str, saved: list[dict[str, Any]], num_parts: int) -> list[dict[str, np.ndarray]]:
    """Dynamic table ``var``'s saved rows re-split onto ``num_parts`` partitions (by owner_of)."""
    try:
        return resplit_snapshots(var, dynamic_snapshot(shards, var, saved), num_parts)
    except (DynamicTableError, KeyError) as e:
        raise CheckpointError(f"{shards.path}: dynamic table {var!r}: {e}") from e
