"""Rotation: which checkpoints a save keeps and which it may delete.

Read from the directory, never from the pointer (which may be missing, damaged or name something outside
it): a save keeps its own checkpoint and the newest ``max_to_keep - 1`` other complete checkpoints of its
lineage (by global_step, then save time) and deletes only checkpoints of its own lineage, and leftovers of
crashed saves; a save in progress of a newer epoch of the same run is never touched. Called under the
directory's mutex (:func:`~psflow.checkpoint.lock.directory_mutex`).

Incremental checkpoints (:mod:`psflow.checkpoint.chain`): ``max_to_keep`` counts restorable checkpoints
(full ones and increments alike); every checkpoint a kept increment's chain needs (its base, the base's
base, ... back to its full checkpoint) is kept too, beyond ``max_to_keep``, so rotation never deletes a full
checkpoint or an increment that a kept checkpoint still needs.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection

from psflow import storage
from psflow.checkpoint.lock import directory_mutex
from psflow.checkpoint.manifest import INCREMENT, MANIFEST_NAME, WRITER_NAME, lineage_of, read_json
from psflow.checkpoint.pointer import checkpoint_dirs, complete_checkpoints, is_complete

__all__ = ["kept_after", "deletable", "delete_old", "killed_while_created", "remove_leftovers"]

log = logging.getLogger("psflow.checkpoint")


def kept_after(directory: str, name: str, lineage: str, max_to_keep: int) -> list[str]:
    """What rotation keeps once checkpoint ``name`` is current, oldest first: ``name`` and the newest
    ``max_to_keep - 1`` other complete checkpoints of ``lineage`` in ``directory`` (by global_step, then
    save time, read from their manifests, never from the pointer, which may be missing or damaged)."""
    ours = [os.path.basename(p) for p, m in complete_checkpoints(directory)
            if m.get("lineage") == lineage or os.path.basename(p) == name]
    others = [n for n in ours if n != name]
    kept = _with_bases(directory, set(others[max(0, len(others) - (max_to_keep - 1)):]) | {name})
    return [n for n in ours if n in kept] if name in ours else [*(n for n in others if n in kept), name]


def _with_bases(directory: str, kept: set[str]) -> set[str]:
    """``kept`` and every checkpoint their chains need (the bases of increments, recursively)."""
    out, todo = set(kept), list(kept)
    while todo:
        manifest = read_json(os.path.join(directory, todo.pop(), MANIFEST_NAME)) or {}
        base = manifest.get("base") if manifest.get("kind") == INCREMENT else None
        if isinstance(base, str) and base not in out and os.path.basename(base) == base:
            out.add(base)
            todo.append(base)
    return out


def deletable(directory: str, run_id: str, lineage: str, epoch: int | None, keep: Collection[str]) -> list[str]:
    """Checkpoint directories a save of run ``run_id`` may delete: of ``lineage``, not in ``keep``, not a newer
    epoch's save.

    A directory whose writer or manifest is unreadable, or of another lineage, is never listed, except an
    empty one (a save killed while creating it: see :func:`killed_while_created`).
    """
    out = []
    for path in checkpoint_dirs(directory):
        if os.path.basename(path) in keep:
            continue
        if killed_while_created(path):
            out.append(path)
            continue
        writer = read_json(os.path.join(path, WRITER_NAME))
        theirs = writer.get("epoch") if writer is not None else None
        if (writer is not None and writer.get("run_id") == run_id and type(theirs) is int
                and epoch is not None and theirs > epoch):
            continue  # a newer chief of this run is saving there
        if is_complete(path):
            ours = lineage_of(path) == lineage
        else:
            ours = writer is not None and (writer.get("lineage") == lineage or writer.get("run_id") == run_id)
        if ours:
            out.append(path)
    return out


def remove_leftovers(directory: str, run_id: str, lineage: str, epoch: int | None) -> set[str]:
    """Removes the leftovers of crashed saves (directories without a manifest) among what :func:`deletable` lists
    for a save of run ``run_id``; the caller holds the directory's mutex. Returns the names removed."""
    removed = set()
    for stale in deletable(directory, run_id, lineage, epoch, keep=()):
        if not is_complete(stale):
            storage.remove_tree(stale, ignore_errors=True)
            removed.add(os.path.basename(stale))
    return removed


def delete_old(directory: str, run_id: str, kept: list[str], lineage: str, epoch: int | None) -> None:
    """Deletes, under the directory's mutex, what :func:`deletable` lists beside ``kept``. With an ``epoch``,
    past a mutex held too long, nothing is deleted (logged): the next save that holds it rotates."""
    with directory_mutex(directory, may_pass=epoch is not None) as held:
        if not held:
            log.info("checkpoint directory %s: old checkpoints not rotated (its mutex not held); the next save does",
                     directory)
            return
        for path in deletable(directory, run_id, lineage, epoch, keep=kept):
            storage.remove_tree(path, ignore_errors=True)


def killed_while_created(path: str) -> bool:
    """A save's directory holding nothing but (maybe) its writer file's temp: the save was killed while creating it.

    Only meaningful under ``directory_mutex``: a save makes its directory and writes its writer file under it.
    """
    try:
        entries = storage.listdir(path)
    except OSError:
        return False
    return all(e.startswith(f"{WRITER_NAME}.tmp-") for e in entries)
