"""Incremental checkpoints read back: a checkpoint's chain (its full base and the increments after it) as one.

An increment (:attr:`~psflow.checkpoint.manifest.Manifest.kind` ``"increment"``) holds, of each static
partition, the rows changed since its base (the previous complete checkpoint, named by ``base``, in the same
directory), everything small whole (global_step, reader positions, counts, 0-d optimizer state), and dynamic
tables and averaged or 0-d partitions whole. Its *chain* is the newest full checkpoint it descends from and
every increment after it, in order (:func:`checkpoint_chain`). :class:`ChainReader` reads any row range of a
variable or slot as the chain's newest checkpoint holds it: the full checkpoint's rows, then each
increment's rows laid over them in order; a dynamic table from the newest checkpoint. A lazy partition saved
as its built rows (``"built"``, :mod:`psflow.ps.built_rows`) reads as the eager one would, its other rows
computed from its initializer; :meth:`ChainReader.built` and :meth:`ChainReader.rows_at` give a restore only
the rows saved, so a restored lazy partition stays lazy. A full checkpoint is a chain of one. Restore, export,
evaluation and :func:`~psflow.checkpoint.variables.read_variables` read through it, so an increment restores
onto any number of ps tasks as a full checkpoint does.

Guarantees: a chain whose base is missing, incomplete, of another lineage or circular is refused with
:class:`~psflow.errors.CheckpointError` naming the checkpoint and its missing base; every shard read is checked
against its manifest's sha256 (:class:`~psflow.checkpoint.shards.ShardFiles`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from psflow.checkpoint.manifest import INCREMENT, Manifest, read_manifest
from psflow.checkpoint.pointer import is_complete
from psflow.checkpoint.shards import ShardFiles, part_rows, saved_rows, saved_table, stored_tensor
from psflow.errors import CheckpointError
from psflow.ps.averages import AVERAGE_SLOT
from psflow.ps.built_rows import built_rows_name, initial_block, initial_slot_name
from psflow.ps.shard_snapshot import changed_rows_name, shard_tensor_names
from psflow.ps.store import partition_key

__all__ = ["checkpoint_chain", "ChainReader"]

#: Longest chain followed (a guard against a damaged directory; ``--full-checkpoint-every`` is far below it).
_MAX_CHAIN = 100_000


def checkpoint_chain(path: str, manifest: Manifest | None = None) -> list[tuple[str, Manifest]]:
    """(path, manifest) of checkpoint ``path``'s chain, its full checkpoint first and ``path`` last.

    Raises:
        CheckpointError: a base is missing or incomplete, of another lineage, or the chain loops (names it).
    """
    chain = [(path, manifest if manifest is not None else read_manifest(path))]
    seen = {os.path.basename(path)}
    while chain[-1][1].kind == INCREMENT:
        child, child_manifest = chain[-1]
        base = str(child_manifest.base)
        base_path = os.path.join(os.path.dirname(child), base)
        if base in seen or len(chain) > _MAX_CHAIN or os.path.basename(base) != base:
            raise CheckpointError(f"checkpoint {child}: its chain of bases is damaged at {base!r}")
        if not is_complete(base_path):
            raise CheckpointError(f"checkpoint {child} is an increment of {base_path}, which is missing or "
                                  "incomplete: it cannot be restored")
        base_manifest = read_manifest(base_path)
        if base_manifest.lineage != child_manifest.lineage:
            raise CheckpointError(f"checkpoint {child} is an increment of {base_path}, of another lineage "
                                  f"({base_manifest.lineage!r}, not {child_manifest.lineage!r})")
        seen.add(base)
        chain.append((base_path, base_manifest))
    chain.reverse()
    return chain


class ChainReader:
    """The variables of checkpoint ``path`` (a full one or an increment), read through its chain."""

    def __init__(self, path: str, manifest: Manifest | None = None) -> None:
        self.path = path
        self.chain = [(ShardFiles(p, m), m) for p, m in checkpoint_chain(path, manifest)]
        self.manifest = self.chain[-1][1]

    def rows(self, var: str, start: int, stop: int, slot: str | None) -> np.ndarray:
        """Rows ``start:stop`` of variable ``var`` (or of its ``slot``) as the newest checkpoint holds them."""
        full_shards, full = self.chain[0]
        shape, dtype = self._kind(var)
        out = np.array(saved_rows(full_shards, var, _parts(full, var), start, stop, slot, shape, dtype), copy=True)
        for shards, manifest in self.chain[1:]:
            out = _overlay(out, shards, var, _parts(manifest, var), start, stop, slot, shape, dtype)
        return out

    def built(self, var: str, start: int, stop: int) -> tuple[np.ndarray, dict[str, Any], dict[str, np.ndarray]] | None:
        """(the global rows ``start:stop`` of ``var`` whose content the chain's newest checkpoint saved, sorted; the
        initializer spec giving the others; each row-laid slot's initial row) when the full checkpoint holds every
        partition overlapping the range as built rows and no increment holds one with every row; None otherwise
        (read :meth:`rows`). The other rows of the range hold their initial content in the newest checkpoint."""
        held = np.empty(0, np.int64)
        spec: dict[str, Any] | None = None
        initial: dict[str, np.ndarray] = {}
        for n, (shards, manifest) in enumerate(self.chain):
            for part in _parts(manifest, var):
                lo, hi = max(start, part["row_start"]), min(stop, part["row_stop"])
                if lo >= hi:
                    continue
                key = partition_key(var, part["index"])
                if "built" in part:  # the partition whole: its built rows, every other row initial
                    if not isinstance(part.get("initializer"), dict) or spec not in (None, part["initializer"]):
                        return None
                    spec = part["initializer"]
                    shard = shards.get(part["shard"])
                    initial.update({slot: stored_tensor(shards, part, initial_slot_name(key, slot), var)
                                    for slot in part["slots"] if slot != AVERAGE_SLOT and slot not in initial
                                    and initial_slot_name(key, slot) in shard.keys()})
                    held = held[(held < lo) | (held >= hi)]
                    rows = stored_tensor(shards, part, built_rows_name(key), var)
                elif "changed" in part and n > 0:  # an increment's rows, over the base's
                    rows = stored_tensor(shards, part, changed_rows_name(key), var)
                else:
                    return None  # saved with every row
                rows = rows.astype(np.int64) + part["row_start"]
                held = np.union1d(held, rows[(rows >= lo) & (rows < hi)])
        if spec is None:
            return None
        return held, spec, initial

    def rows_at(self, var: str, rows: np.ndarray, slot: str | None, spec: dict[str, Any],
                initial: dict[str, np.ndarray]) -> np.ndarray:
        """The global ``rows`` (sorted, distinct) of ``var`` (or of its row-laid ``slot``; read a 0-d one with
        :meth:`rows`) as the newest checkpoint holds them, where :meth:`built` gave ``spec`` and ``initial``."""
        shape, dtype = self._kind(var)

        def fresh(at: np.ndarray) -> np.ndarray:  # the initial content of global rows `at`
            if slot is None or slot == AVERAGE_SLOT:
                return initial_block(spec, shape, dtype, at)
            if slot not in initial:
                raise CheckpointError(f"checkpoint {self.path}: variable {var!r} has no initial row of slot {slot!r}")
            block = np.empty((at.size, *initial[slot].shape), dtype=initial[slot].dtype)
            block[...] = initial[slot]
            return block

        out = fresh(rows)
        for n, (shards, manifest) in enumerate(self.chain):
            for part in _parts(manifest, var):
                key = partition_key(var, part["index"])
                inside = np.flatnonzero((rows >= part["row_start"]) & (rows < part["row_stop"]))
                if not inside.size:
                    continue
                value_name, slot_names = shard_tensor_names(key, part["slots"])
                name = value_name if slot is None else slot_names.get(slot)
                if name is None:
                    raise CheckpointError(f"{shards.path}: variable {var!r} partition {part['index']} has no slot {slot!r}")
                if "built" in part and n > 0:  # an increment holding the partition whole: unsaved rows initial
                    out[inside] = fresh(rows[inside])
                held_name = built_rows_name(key) if "built" in part else changed_rows_name(key)
                held = stored_tensor(shards, part, held_name, var) + part["row_start"]
                at = np.minimum(np.searchsorted(held, rows[inside]), max(held.size - 1, 0))
                hit = held[at] == rows[inside] if held.size else np.zeros(inside.size, np.bool_)
                if hit.any():
                    out[inside[hit]] = stored_tensor(shards, part, name, var)[at[hit]]
        return out

    def _kind(self, var: str) -> tuple[tuple[int, ...], str]:
        """The variable's shape and dtype (the newest checkpoint's)."""
        saved = self.manifest.variables.get(var)
        if saved is None:
            raise CheckpointError(f"checkpoint {self.path} has no variable {var!r}")
        return tuple(saved["shape"]), str(saved["dtype"])

    def table(self, var: str, num_parts: int) -> list[dict[str, np.ndarray]]:
        """A dynamic table re-split onto ``num_parts`` partitions (saved whole in every checkpoint: the newest)."""
        shards, manifest = self.chain[-1]
        return saved_table(shards, var, manifest.variables[var]["partitions"], num_parts)


def _parts(manifest: Manifest, var: str) -> list[dict[str, Any]]:
    saved = manifest.variables.get(var)
    if saved is None:
        raise CheckpointError(f"a checkpoint of the chain has no variable {var!r}")
    return sorted(saved["partitions"], key=lambda p: p["row_start"])


def _overlay(out: np.ndarray, shards: ShardFiles, var: str, parts: list[dict[str, Any]], start: int, stop: int,
             slot: str | None, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """``out`` (rows ``start:stop``) with one increment's saved rows laid over it."""
    for part in parts:
        key = partition_key(var, part["index"])
        value_name, slot_names = shard_tensor_names(key, part["slots"])
        name = value_name if slot is None else slot_names.get(slot)
        if name is None:
            raise CheckpointError(f"{shards.path}: variable {var!r} partition {part['index']} has no slot {slot!r}")
        tensor = shards.get(part["shard"])
        if not tensor.get_slice(name).get_shape():  # 0-d (as in saved_rows): from the partition holding `start`
            if slot is None or part["row_start"] <= start < part["row_stop"]:
                out = np.array(tensor.get_tensor(name), copy=True)
            continue
        row_start = part["row_start"]
        lo, hi = max(start, row_start), min(stop, part["row_stop"])
        if lo >= hi:
            continue
        if "changed" not in part:  # saved whole (a lazy one: its built rows, the others initial)
            out[lo - start:hi - start] = part_rows(shards, var, part, name, slot, lo, hi, shape, dtype)
            continue
        rows = np.asarray(tensor.get_tensor(changed_rows_name(key))) + row_start
        wanted = (rows >= lo) & (rows < hi)
        if wanted.any():
            out[rows[wanted] - start] = np.asarray(tensor.get_tensor(name))[wanted]
    return out
