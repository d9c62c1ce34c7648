"""A checkpoint directory's name: ``ckpt-`` and the global_step its manifest holds (nine digits).

:func:`rename_after_step` gives a save's directory, named when the save began, the name of the step its
shards were snapshotted at: training goes on during a save, so the workers' pushes between the chief's
reading of the step and the ps tasks' snapshots made the name older than the content (a 3-worker run's
ckpt-000000102 held step 121).

A name removed as a save's (:func:`retire`: a failed save's own directory, a crashed save's leftover) is never
given again by :func:`free_name`, by this process nor by any later one (a restarted chief, or the worker process
the lease moved to): a ps task may still be writing its shard of that save (its SaveShard past
``--save-timeout``), and its late file would land in the new checkpoint of the same name (the final save right
after a failed periodic one, at the same global_step), whose manifest's sha256 it does not match: a checkpoint that
cannot be restored. Without the name, the late write finds no directory (locally) or leaves a prefix of shard files
alone (an object store), removed by the next save under the mutex
(:func:`~psflow.checkpoint.rotation.late_shards_only`).

The record survives the process: before a save's directory of a plain name (``ckpt-<step>``, no suffix) is
removed, :func:`remove_retired` writes a marker ``.retired/ckpt-<step>`` into the checkpoint directory (a small JSON
file: when, by which process). A marker that cannot be written (a full disk, a store refusing writes) does not keep
the directory (its space is what a full disk needs back): it is removed, the marker tried once more (the space
freed), and if that fails too only this process avoids the name (an ERROR line names it), and writes its marker
at the name's next removal in the process (a late shard's directory of that name, removed by a later save). A suffixed name is never
given twice (its suffix is the nanosecond of its making), so it needs none. Markers are kept for ever: at most one
per global_step value whose save failed or crashed, a few bytes each; a late write has no time bound psflow could
state (a store stuck on a put), and a restore of an older checkpoint brings the same steps round again.
Checkpoints already on disk, without markers, are read as before: the markers only decide the name of a new save.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Collection, Iterable

from psflow import jsonio, storage
from psflow.checkpoint.lock import directory_mutex
from psflow.checkpoint.manifest import PREFIX

__all__ = ["RETIRED_DIR", "checkpoint_name", "free_name", "remove_retired", "rename_after_step", "retire"]

log = logging.getLogger(__name__)

#: The folder of a checkpoint directory holding one marker per plain name removed as a save's (module docstring).
RETIRED_DIR = ".retired"

_PLAIN = re.compile(rf"^{re.escape(PREFIX)}\d{{9,}}$")  # checkpoint_name's (9 digits or more), without a suffix

_RETIRED: dict[str, set[str]] = {}  # checkpoint directory -> the names this process retired there (avoided by free_name)
_MARKED: dict[str, set[str]] = {}  # checkpoint directory -> those whose marker this process wrote (or that need none)
_RETIRED_LOCK = threading.Lock()


def _key(directory: str) -> str:
    return directory if storage.is_remote(directory) else os.path.abspath(directory)


def retire(directory: str, names: Iterable[str]) -> None:
    """Records that the save directories ``names`` (basenames) of ``directory`` are removed (called before their
    removal): no later save, of this process or another, takes one of them (see the module docstring).

    Each name enters this process's memory first (avoided here whatever happens to its marker), and is marked done
    only once its marker is written: a name whose marker failed (a full disk) gets it at its next retirement in the
    process (the same name removed again: a late shard's directory), not skipped as known.

    Raises:
        OSError: a plain name's marker could not be written (this process avoids that name all the same).
    """
    key = _key(directory.rstrip("/") or directory)
    for name in dict.fromkeys(names):
        with _RETIRED_LOCK:
            _RETIRED.setdefault(key, set()).add(name)
            if name in _MARKED.get(key, ()):
                continue
        _write_marker(directory, name)
        with _RETIRED_LOCK:
            _MARKED.setdefault(key, set()).add(name)


def _write_marker(directory: str, name: str) -> None:
    """``.retired/<name>``, for a plain name (a suffixed one is never given twice)."""
    if _PLAIN.match(name):
        marker = os.path.join(directory, RETIRED_DIR, name)
        storage.makedirs(os.path.dirname(marker))
        storage.write_atomically(marker, jsonio.dumps({"removed": time.time(), "pid": os.getpid()}).encode())


def remove_retired(directory: str, path: str) -> None:
    """Removes the save directory ``path`` of ``directory``, its name retired first (:func:`retire`; see the module
    docstring for a marker that cannot be written). Never raises for the marker nor the removal (``remove_tree``'s
    ``ignore_errors``)."""
    name = os.path.basename(path.rstrip("/"))
    try:
        retire(directory, [name])
        marked = True
    except OSError:
        marked = False
    storage.remove_tree(path, ignore_errors=True)
    if not marked:
        try:
            _write_marker(directory, name)
        except OSError as e:
            log.error("checkpoint directory %s: removed %s, but could not record its name in %s (%s): a later "
                      "process may name a checkpoint %s again", directory, name, RETIRED_DIR, e, name)


def _retired(directory: str) -> set[str]:
    with _RETIRED_LOCK:
        return set(_RETIRED.get(_key(directory.rstrip("/") or directory), ()))


def checkpoint_name(step: int) -> str:
    """The directory name of a checkpoint of global_step ``step`` (before any suffix)."""
    return f"{PREFIX}{step:09d}"


def free_name(directory: str, step: int, removed: Collection[str]) -> str:
    """The name a new checkpoint of ``step`` takes in ``directory`` (the caller holds its mutex):
    :func:`checkpoint_name`, with a suffix (``-`` and nanoseconds) if that is in use, was removed by this save
    as a crashed save's leftover (``removed``: an older chief's save may still be writing into it) or by any save
    of any process (:func:`retire`, its marker: a failed save's ps task may still be writing into it)."""
    name = checkpoint_name(step)
    if (name in removed or name in _retired(directory) or storage.exists(os.path.join(directory, name))
            or storage.exists(os.path.join(directory, RETIRED_DIR, name))):
        return f"{name}-{time.time_ns()}"
    return name


def rename_after_step(directory: str, path: str, step: int, removed: Collection[str], *, may_pass: bool = False) -> str:
    """Renames the checkpoint ``path`` (inside ``directory``, its manifest written) after ``step``, the
    global_step its manifest holds; returns its path, renamed or not.

    Under the directory's mutex (a rotation or a restore sees it under one name or the other); the new name is
    :func:`free_name`'s (``removed``: the leftovers this save removed). A name already of this step is kept. An object
    store keeps the first name (its "directories" cannot be renamed; the manifest's step is the checkpoint's),
    as does a rename that fails (logged), and one past a mutex held too long (``may_pass``, a chief with a lease
    epoch: its name is unique already). Never raises for a failed rename; the mutex's errors are raised.
    """
    name, wanted = os.path.basename(path), checkpoint_name(step)
    if name == wanted or name.startswith(f"{wanted}-") or storage.is_remote(path):
        return path
    with directory_mutex(directory, may_pass=may_pass) as held:
        if not held:
            return path
        target = os.path.join(directory, free_name(directory, step, removed))
        try:
            storage.rename_dir(path, target)
        except OSError as e:
            log.warning("checkpoint %s (global_step %d) keeps its name: renaming it to %s failed: %s",
                        path, step, target, e)
            return path
    storage.sync_dir(directory)
    return target
