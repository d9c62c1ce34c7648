"""Rotation: which checkpoints a save keeps and which it may delete.

Read from the directory, never from the pointer (which may be missing, damaged or name something outside
it): a save keeps its own checkpoint and the newest ``max_to_keep - 1`` other complete checkpoints of its
lineage (by global_step, then save time) and deletes only checkpoints of its own lineage, and leftovers of
crashed saves; a save in progress of a newer epoch of the same run is never touched. Called under the
directory's mutex (:func:`~psflow.checkpoint.lock.directory_mutex`), or past it deleting less (below).

Incremental checkpoints (:mod:`psflow.checkpoint.chain`): ``max_to_keep`` counts restorable checkpoints
(full ones and increments alike); every checkpoint a kept increment's chain needs (its base, the base's
base, ... back to its full checkpoint) is kept too, beyond ``max_to_keep``, so rotation never deletes a full
checkpoint or an increment that a kept checkpoint still needs.

Past the mutex (:func:`delete_old` with ``held`` False: a chief of lease epoch E went on past a mutex kept by a
process stopped inside it, maybe for good, or by one holding the ``flock`` on a network filesystem), a save still
rotates, so checkpoints do not pile up, but deletes only a checkpoint (:func:`deletable_unheld`) that is

    (a) of its own run and its own lineage (its manifest's ``run`` and ``lineage``, and its writer file's run);
    (b) complete (its manifest readable);
    (c) written at epoch E or an older one (its manifest's and its writer file's; never a newer epoch's, nor one
        without an epoch);
    (d) not in ``kept``;
    (e) not named (``latest``) by ``checkpoint`` nor by any epoch file ``checkpoint.e<N>``, nor listed in the
        ``all`` of the pointer that decides, nor the base (recursively) of any of these or of a kept increment;
        the pointer files are read again right before each deletion.

Why this is safe against the stopped holder resuming mid-save: every such chief writes only into its own
checkpoint's directory, and it is of an older epoch (a newer one's holder decides; the ps tasks refuse an older
fence). Resumed, it may (1) finish creating or writing its own directory: (b) keeps an incomplete one; (2) finish
its switch: its pointer, written after this chief's epoch file, never decides (:mod:`psflow.checkpoint.pointer`),
and its checkpoint, if this chief deleted it as complete-and-older before that switch, makes the switch fail as
fenced off (:func:`~psflow.checkpoint.switch.switch_pointer`): a checkpoint it is about to publish is complete
and older, but it can never become the one readers follow, since this chief's epoch file already decides; one it
published before this chief's switch is named by its epoch file, kept by (e); (3) rotate under the mutex it
holds: its own :func:`deletable` never lists a newer epoch's checkpoint, and two deleters of one old checkpoint
are fine (each removal tolerates the other's); (4) undo its fenced switch or remove its fenced checkpoint: only
its own. Readers (a restore, the evaluator, an export) hold no lock: under the mutex, a rotation deletes whatever
is not in ``kept`` (the newest ``max_to_keep`` of the lineage and their bases), the one a reader is reading too;
past it, the set deleted is a subset of what the held rotation would delete (it adds (a), (c) and (e)), so the
guarantee is the same, and a checkpoint any pointer file names is never deleted. Checkpoints of other runs, of
other lineages and without an epoch are left to a save that holds the mutex.

Leftovers past the mutex (:func:`remove_leftovers`, ``held`` False): an incomplete ``ckpt-*`` of this run or
lineage whose writer is certainly gone, or cannot be judged, is of an older epoch or another run, and the run is past
it (``BEHIND_BY`` complete checkpoints of the lineage above the step it was named at), and ``.creating-*``
directories, as :mod:`psflow.checkpoint.leftovers` says; under the mutex also what :func:`deletable` lists incomplete.
A leftover's name is retired before it is removed (:func:`~psflow.checkpoint.naming.remove_retired`): its writer's
ps tasks may still write there; so is an incomplete directory a rotation under the mutex removes (:func:`delete_old`).

Shards written after their save's directory was removed (:func:`late_shards_only`): a ps task may still write its
shard when its save's directory goes (the chief's own failed save, a ps task slower than ``--save-timeout``, removed
by its cleanup; a deposed chief's save removed by a newer one's rotation). On an object store the late put makes
the prefix again; locally a file made while ``rmtree`` runs keeps the directory (the ps task's temp file, renamed
to the shard). What is left holds shard files and no writer file: nothing else can tell whose it is, so
:func:`deletable` lists it under the mutex (every save's directory has its writer file from its first moment:
made under the mutex, renamed from ``.creating-*``, or, on a store, made by the writer file itself), and it is
never restorable (no manifest). Past the mutex it is kept: a save under the mutex may be between making its
directory and writing its writer file. A late write that lands again after the removal is removed at the next
save under the mutex.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Collection

from psflow import storage
from psflow.checkpoint.leftovers import left_behind, remove_creating, writer_gone
from psflow.checkpoint.lock import directory_mutex
from psflow.checkpoint.manifest import INCREMENT, MANIFEST_NAME, POINTER_NAME, WRITER_NAME, lineage_of, read_json
from psflow.checkpoint.naming import remove_retired
from psflow.checkpoint.pointer import checkpoint_dirs, complete_checkpoints, effective_pointer, epoch_files, is_complete

__all__ = ["kept_after", "deletable", "deletable_unheld", "delete_old", "killed_while_created", "late_shards_only",
           "remove_leftovers"]

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
    empty one (a save killed while creating it: see :func:`killed_while_created`) and one holding shard files
    alone (:func:`late_shards_only`).
    """
    out = []
    for path in checkpoint_dirs(directory):
        if os.path.basename(path) in keep:
            continue
        if killed_while_created(path) or late_shards_only(path):
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


def remove_leftovers(directory: str, run_id: str, lineage: str, epoch: int | None, *, held: bool = True) -> set[str]:
    """Removes the leftovers of crashed saves for a save of run ``run_id`` at lease ``epoch``; returns the names
    removed. ``held`` (the caller holds the directory's mutex): the directories without a manifest among what
    :func:`deletable` lists. Past it: those of this run or ``lineage`` whose writer is certainly gone
    (:func:`~psflow.checkpoint.leftovers.writer_gone`) or, unjudged, left behind by the run
    (:func:`~psflow.checkpoint.leftovers.left_behind`). Either way, the ``.creating-*`` directories
    :func:`~psflow.checkpoint.leftovers.remove_creating` may remove."""
    removed = remove_creating(directory, run_id, epoch, held=held)
    if held:
        stale = [p for p in deletable(directory, run_id, lineage, epoch, keep=()) if not is_complete(p)]
    else:
        steps = [m["global_step"] for _, m in complete_checkpoints(directory)
                 if m.get("lineage") == lineage and type(m.get("global_step")) is int]
        stale = [p for p in checkpoint_dirs(directory)
                 if not is_complete(p) and _gone_writer_of(p, run_id, lineage, epoch, steps)]
    for path in stale:  # its name never given again, even by another process: its writer's ps tasks may still write
        remove_retired(directory, path)
        removed.add(os.path.basename(path))
    return removed


def _gone_writer_of(path: str, run_id: str, lineage: str, epoch: int | None, steps: list[int]) -> bool:
    """Its writer, of ``run_id`` or ``lineage``, is certainly gone, or cannot be judged and the run is past it
    (``steps``: the global_steps of the lineage's complete checkpoints; :mod:`psflow.checkpoint.leftovers`)."""
    writer = read_json(os.path.join(path, WRITER_NAME))
    return (writer is not None and (writer.get("run_id") == run_id or writer.get("lineage") == lineage)
            and (writer_gone(writer) or left_behind(writer, os.path.basename(path), run_id, epoch, steps)))


def delete_old(directory: str, run_id: str, kept: list[str], lineage: str, epoch: int | None) -> None:
    """Deletes, under the directory's mutex, what :func:`deletable` lists beside ``kept``; an incomplete one (a save
    that crashed or is still going on, of an older epoch, since this save's :func:`remove_leftovers`) with its name
    retired first (:func:`~psflow.checkpoint.naming.remove_retired`), as a leftover's: its ps tasks may still write
    their shards there, into a restarted chief's new save of that name. A complete one needs none: every shard of
    it was written before its save read the reply. With an ``epoch``, past a mutex held too long: what
    :func:`deletable_unheld` lists (see the module docstring; complete only), each checked again against the
    pointer files right before its deletion."""
    with directory_mutex(directory, may_pass=epoch is not None) as held:
        if held:
            for path in deletable(directory, run_id, lineage, epoch, keep=kept):
                if is_complete(path):
                    storage.remove_tree(path, ignore_errors=True)
                else:
                    remove_retired(directory, path)
            return
        if epoch is None:
            return  # (not reached: directory_mutex raised, a writer without an epoch never goes past it)
        gone = []
        for path in deletable_unheld(directory, run_id, lineage, epoch, kept):
            if os.path.basename(path) in _protected(directory, kept):  # a pointer file written meanwhile
                continue
            storage.remove_tree(path, ignore_errors=True)
            gone.append(os.path.basename(path))
        if gone:
            log.info("checkpoint directory %s: rotated past its mutex (held by another process): deleted %s",
                     directory, ", ".join(gone))


def deletable_unheld(directory: str, run_id: str, lineage: str, epoch: int, kept: Collection[str]) -> list[str]:
    """The checkpoints a save of run ``run_id`` at lease ``epoch`` may delete past the directory's mutex: (a) to (e)
    of the module docstring, the pointer files read once here."""
    protected = _protected(directory, kept)
    return [path for path in checkpoint_dirs(directory)
            if os.path.basename(path) not in protected and _older_and_ours(path, run_id, lineage, epoch)]


def _older_and_ours(path: str, run_id: str, lineage: str, epoch: int) -> bool:
    """(a) to (c): complete, of run ``run_id`` and ``lineage``, written at ``epoch`` or an older one (its manifest
    and its writer file agree)."""
    manifest = read_json(os.path.join(path, MANIFEST_NAME))
    writer = read_json(os.path.join(path, WRITER_NAME))
    if manifest is None or writer is None or manifest.get("lineage") != lineage:
        return False
    run = manifest.get("run")
    for record in (run if isinstance(run, dict) else {}, writer):
        theirs = record.get("epoch")
        if record.get("run_id") != run_id or type(theirs) is not int or theirs > epoch:
            return False
    return True


def _protected(directory: str, kept: Collection[str]) -> set[str]:
    """(d) and (e): ``kept``, what ``checkpoint`` and every epoch file name, the deciding pointer's ``all``, and
    the bases of all of these."""
    names = set(kept)
    for data in (read_json(os.path.join(directory, POINTER_NAME)), *epoch_files(directory)):
        if data is not None and isinstance(data.get("latest"), str):
            names.add(data["latest"])
    listed = (effective_pointer(directory)[0] or {}).get("all")
    names.update(n for n in (listed if isinstance(listed, list) else []) if isinstance(n, str))
    return _with_bases(directory, names)


def killed_while_created(path: str) -> bool:
    """A save's directory holding nothing but (maybe) its writer file's temp: the save was killed while creating it.

    Only meaningful under ``directory_mutex``: a save makes its directory and writes its writer file under it.
    """
    try:
        entries = storage.listdir(path)
    except OSError:
        return False
    return all(e.startswith(f"{WRITER_NAME}.tmp-") for e in entries)


#: A shard file's name (:meth:`~psflow.checkpoint.save.CheckpointManager._write_shards`) or its writer's temp
#: (:func:`~psflow.storage.write_atomically`).
_SHARD_FILE = re.compile(r"^shard-\d+-of-\d+\.safetensors(\.tmp-\d+)?$")


def late_shards_only(path: str) -> bool:
    """A save's directory holding shard files (or their temps) and nothing else, no writer file, no manifest: what a
    ps task's late shard write leaves of a directory removed (see the module docstring).

    Only meaningful under ``directory_mutex``, as :func:`killed_while_created`. Anything else inside (a file a person
    put there, an unreadable writer file) keeps it out. The writer file and the manifest are also asked for by
    name (a store's listing may lag an object just written, its read does not): either there keeps it.
    """
    try:
        entries = storage.listdir(path)
        if not entries or not all(_SHARD_FILE.match(e) or e.startswith(f"{WRITER_NAME}.tmp-") for e in entries):
            return False
        return not any(storage.exists(os.path.join(path, n)) for n in (WRITER_NAME, MANIFEST_NAME))
    except OSError:
        return False
