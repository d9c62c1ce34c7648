"""Leftovers of saves that did not finish, and when a save may remove them: whether their writer is certainly gone.

A save's writer file (``writer.json``) names the writing process as a lock file does (:func:`writer_identity`):
``host``, ``pid``, ``pid_start`` (its start time in clock ticks since boot), ``boot_id`` and ``pid_ns``.
:func:`writer_gone` is True only when all of them are recorded, the host, boot and pid namespace are this
process's, and that pid is gone, a zombie, or another process now (its start time differs): a reused pid is never
taken for the writer, and a writer on another host, of another boot (possibly another machine of the same name)
or pid namespace, or whose file lacks a field (an older psflow's) is never judged gone.

Not even one of this host name and another boot id, though the host may only have rebooted (its processes are all
gone then): the boot id is the kernel's, one per boot of a machine, and nothing psflow can read tells a reboot from
another machine of the same name (containers and pods are given host names, a pod rescheduled elsewhere keeps its
name while the old one may still run on a node cut off from the cluster, and ``/etc/machine-id`` is often the
image's, the same on every machine). Such a writer may be a live (deposed) chief whose directory, taken, would make
its save fail or, on an object store, its late manifest make a checkpoint without some of its shards. Its leftovers are
removed under the mutex as any writer's are (an incomplete ``ckpt-*`` of the run or lineage, a ``.creating-*`` of
an older epoch of the run); only a ``.creating-*`` of another run, or of the run's current epoch, stays (hidden,
an empty directory but its writer file, read by nothing).

Past the mutex (a save of a chief whose lease epoch let it go past a holder stopped inside it, maybe for good) only
the leftovers of writers certainly gone were removed, so one of a writer nothing here can judge (another host, boot
or pid namespace; a writer file of an older psflow, a field missing: :func:`writer_unknown`) stayed for ever. It
now goes there too once the run is past it (:func:`left_behind`): written by another run (the run's lock keeps
another run's chief from saving into the directory now) or by an older epoch of the saving run, and at least
:data:`BEHIND_BY` complete checkpoints of its lineage hold a global_step above the step its name was given at (its
save began there). Its writer crashed, or is a deposed chief (epochs only grow) whose save cannot be made current, as
above, and whose save has lasted that many of the saver's periods; taken away, its save fails, and on an object store
a manifest it still puts makes a prefix without its writer file, never named by a pointer that decides, older than
what rotation keeps. Counted in saves, not in time: no clock of another machine is read. A leftover of this run's
current epoch or a newer one, or without an epoch, stays; a ``.creating-*`` has no step in its name and stays as said
above.

``.creating-<pid>-<ns>`` directories (:func:`remove_creating`): a chief with a lease epoch that went past the
directory's mutex (:func:`~psflow.checkpoint.lock.directory_mutex`'s ``may_pass``) builds its save's directory
under that hidden name, writes its writer file into it and renames it to ``ckpt-<step>-<ns>``; one killed in
between leaves it behind. Nothing else ever writes into it (the shards are written after the rename) and no
reader looks at it. It is removed:

    * at any save, under the mutex or past it, when its writer is certainly gone;
    * under the mutex, also when its writer file names the saving run and an epoch older than the saver's: that
      writer, if alive, is a deposed chief (epochs only grow) whose save cannot be made current (the newer
      epoch's pointer decides, the ps tasks refuse its fence); taking its directory away makes its rename fail,
      and its save end fenced off (CheckpointFencedError, not counted) before any shard is written. The directory
      is first renamed (one atomic step against the writer's own rename: one of the two wins) and then removed.

A ``.creating-*`` directory without a readable writer file (a chief killed between making it and writing the
file) cannot be judged and is kept (an empty directory). An object store has no such directories.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Iterable, Mapping
from typing import Any

from psflow import storage
from psflow.checkpoint.holder import boot_id, holder_alive, pid_namespace, pid_start
from psflow.checkpoint.manifest import PREFIX, WRITER_NAME, read_json

__all__ = ["BEHIND_BY", "CREATING_PREFIX", "writer_identity", "writer_gone", "writer_unknown", "left_behind",
           "remove_creating"]

log = logging.getLogger("psflow.checkpoint")

#: Complete checkpoints of its lineage with a global_step above a leftover's after which its writer's save, if that
#: writer cannot be judged, is taken as over (:func:`left_behind`).
BEHIND_BY = 3

#: The prefix of a save's directory being built past the mutex.
CREATING_PREFIX = ".creating-"

_IDENTITY = ("host", "pid", "pid_start", "boot_id", "pid_ns")

_NAMED_AT = re.compile(rf"^{re.escape(PREFIX)}(\d{{9,}})(?:-\d+)?$")  # a save's directory: the step it was named at


def writer_identity() -> dict[str, Any]:
    """This process, as a writer file records it: ``host``, ``pid``, ``pid_start``, ``boot_id``, ``pid_ns``
    (None where /proc has no answer: such a writer is never judged gone)."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "pid_start": pid_start(pid), "boot_id": boot_id(),
            "pid_ns": pid_namespace()}


def writer_gone(writer: Mapping[str, Any] | None) -> bool:
    """Whether the process a writer file names is certainly gone (see the module docstring); False when unsure."""
    if writer is None or any(writer.get(k) is None for k in _IDENTITY) or type(writer.get("pid_start")) is not int:
        return False
    here = writer_identity()
    if any(writer.get(k) != here[k] for k in ("host", "boot_id", "pid_ns")):
        return False
    return holder_alive(dict(writer)) is False


def writer_unknown(writer: Mapping[str, Any] | None) -> bool:
    """Whether nothing this process can read tells if the writer a writer file names lives: another host, boot or
    pid namespace, or a field missing (an older psflow's file). False without a writer file (nothing to judge)."""
    if writer is None:
        return False
    if any(writer.get(k) is None for k in _IDENTITY) or type(writer.get("pid_start")) is not int:
        return True
    here = writer_identity()
    return any(writer.get(k) != here[k] for k in ("host", "boot_id", "pid_ns"))


def left_behind(writer: Mapping[str, Any] | None, name: str, run_id: str, epoch: int | None,
                complete_steps: Iterable[int]) -> bool:
    """Whether the save directory ``name`` (``ckpt-<step>``, maybe suffixed), its writer file ``writer``, may be
    removed by a save of run ``run_id`` at lease ``epoch`` past the mutex though its writer cannot be judged (see the
    module docstring): :func:`writer_unknown`, of another run or an older epoch of this one, and named at a step that
    at least :data:`BEHIND_BY` of ``complete_steps`` (the global_steps of its lineage's complete checkpoints) are
    above. False for any other name."""
    match = _NAMED_AT.match(name)
    if match is None or writer is None or not writer_unknown(writer):
        return False
    if writer.get("run_id") == run_id and not _older_epoch_of(writer, run_id, epoch):
        return False  # this run's save at this epoch or a newer one: maybe the chief of the lease, saving now
    return sum(1 for s in complete_steps if s > int(match.group(1))) >= BEHIND_BY


def _older_epoch_of(writer: Mapping[str, Any] | None, run_id: str, epoch: int | None) -> bool:
    theirs = writer.get("epoch") if writer is not None else None
    return (writer is not None and writer.get("run_id") == run_id and type(theirs) is int and epoch is not None
            and theirs < epoch)


def remove_creating(directory: str, run_id: str, epoch: int | None, *, held: bool) -> set[str]:
    """Removes the ``.creating-*`` directories of ``directory`` that a save of run ``run_id`` at lease ``epoch``
    may remove (see the module docstring); ``held``: the caller holds the directory's mutex. Returns the names
    removed. Never raises for a directory another process removed or renamed meanwhile."""
    if storage.is_remote(directory):
        return set()
    removed = set()
    for path in storage.subdirectories(directory, CREATING_PREFIX):
        writer = read_json(os.path.join(path, WRITER_NAME))
        gone = writer_gone(writer)
        if writer is None or not (gone or (held and _older_epoch_of(writer, run_id, epoch))):
            continue
        # Taken under a name of this process first: the writer's rename to ckpt-* and this one are one each.
        taken = os.path.join(directory, f"{CREATING_PREFIX}{os.getpid()}-{time.time_ns()}")
        try:
            storage.rename_dir(path, taken)
        except OSError:
            continue  # renamed by its writer, or removed by another save, meanwhile
        storage.remove_tree(taken, ignore_errors=True)
        removed.add(os.path.basename(path))
        log.info("checkpoint directory %s: removed %s, left by a save of pid %s on %s (run %s, epoch %s) that %s",
                 directory, os.path.basename(path), writer.get("pid"), writer.get("host"), writer.get("run_id"),
                 writer.get("epoch"), "is gone" if gone else "a newer epoch fenced off")
    return removed
