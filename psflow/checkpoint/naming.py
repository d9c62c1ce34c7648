"""A checkpoint directory's name: ``ckpt-`` and the global_step its manifest holds (nine digits).

:func:`rename_after_step` gives a save's directory, named when the save began, the name of the step its
shards were snapshotted at: training goes on during a save, so the workers' pushes between the chief's
reading of the step and the ps tasks' snapshots made the name older than the content (a 3-worker run's
ckpt-000000102 held step 121).

A name this process removed as a save's (:func:`retire`: a failed save's own directory, a crashed save's leftover)
is never given again by :func:`free_name` in this process: a ps task may still be writing its shard of that save
(its SaveShard past ``--save-timeout``), and its late file would land in the new checkpoint of the same name
(the final save right after a failed periodic one, at the same global_step), whose manifest's sha256 it does not
match: a checkpoint that cannot be restored. Without the name, the late write finds no directory (locally) or
leaves a prefix of shard files alone (an object store), removed by the next save under the mutex
(:func:`~psflow.checkpoint.rotation.late_shards_only`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Collection, Iterable

from psflow import storage
from psflow.checkpoint.lock import directory_mutex
from psflow.checkpoint.manifest import PREFIX

__all__ = ["checkpoint_name", "free_name", "rename_after_step", "retire"]

log = logging.getLogger(__name__)

_RETIRED: dict[str, set[str]] = {}  # checkpoint directory -> the names this process removed there as a save's
_RETIRED_LOCK = threading.Lock()


def _key(directory: str) -> str:
    return directory if storage.is_remote(directory) else os.path.abspath(directory)


def retire(directory: str, names: Iterable[str]) -> None:
    """Records that this process removed the save directories ``names`` (basenames) of ``directory``: no later
    save of the process takes one of them (see the module docstring)."""
    names = list(names)
    if names:
        with _RETIRED_LOCK:
            _RETIRED.setdefault(_key(directory.rstrip("/") or directory), set()).update(names)


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
    of this process (:func:`retire`: a failed save's ps task may still be writing into it)."""
    name = checkpoint_name(step)
    if name in removed or name in _retired(directory) or storage.exists(os.path.join(directory, name)):
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
