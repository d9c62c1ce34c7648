"""Adoption: a chief that restores a checkpoint takes it over, so no older chief's fenced save takes it back.

An older chief whose save was made current and then fenced off (its re-check after the pointer switch was
refused: a newer chief was elected meanwhile) puts its previous pointer back and removes its checkpoint's
directory -- but only a pointer of its own epoch, and only a directory the pointer does not name
(:meth:`~psflow.checkpoint.save.CheckpointManager.save`). A newer chief may have restored the cluster from
that very checkpoint in between (the pointer named it). :func:`adopt_latest`, called by the restoring chief
before it reads the checkpoint (a restore after a ps death, :class:`psflow.train.recovery.ClusterRecovery`; the
first restore of a fresh cluster, :func:`psflow.train.chief.join_cluster`, where the chief holds a lease),
rewrites the pointer under the directory's mutex with the restorer's run id, epoch and holder (the same
checkpoint; as :meth:`~psflow.checkpoint.save.CheckpointManager.mark_final` does for a final one): the older
chief then finds a pointer of another epoch naming its checkpoint and leaves both. A checkpoint a restore used,
or the pointer names, is never deleted by a fenced writer; rotation by a later save of the lineage deletes it in
its turn (beyond ``max_to_keep``).
"""

from __future__ import annotations

import logging
import os

from psflow.checkpoint.lock import directory_mutex
from psflow.checkpoint.manifest import POINTER_NAME, read_manifest
from psflow.checkpoint.pointer import effective_pointer, latest_checkpoint, publish
from psflow.checkpoint.switch import refuse_newer_epoch, refuse_unless_ours
from psflow.coord import Lease

__all__ = ["adopt_latest", "checkpoint_to_restore"]

log = logging.getLogger(__name__)


def adopt_latest(directory: str, *, run_id: str, epoch: int, holder: str) -> str | None:
    """The newest complete checkpoint of ``directory`` (:func:`~psflow.checkpoint.pointer.latest_checkpoint`),
    taken over by a restoring chief of run ``run_id`` at lease ``epoch``; None when there is none.

    Under the directory's mutex (the one a save's pointer switch, its undo and its cleanup hold): the
    checkpoint is found, and unless the pointer already names it with this run and epoch, the pointer is
    rewritten naming it with ``run_id``, ``epoch`` and ``holder`` (its other fields kept; a pointer that was
    missing, damaged or named another checkpoint gets the checkpoint's step and lineage from its manifest).
    A pointer of another run that names the checkpoint (a resumed run's restore) is read as it is, nothing
    written: no chief of ``run_id`` wrote that checkpoint, and a fenced save removes only its own directory, so
    there is nothing to fence off (and a resumed run that then fails leaves the directory as it found it).
    Blocks for a few file operations; behind a process stopped inside the mutex it goes on past it after the
    mutex's timeout and publishes through its epoch's pointer file (:func:`~psflow.checkpoint.pointer.publish`).
    Not closed: an older chief stopped inside its failed save's cleanup (after its check that the pointer does
    not name its checkpoint) and resumed after this take-over past the mutex deletes that checkpoint; readers then
    fall back to the pointer's ``all`` and the restore fails and is retried. Idempotent. Thread-safe (the mutex).

    Raises:
        CheckpointFencedError: the pointer was written by a newer epoch of ``run_id`` (nothing written), or a
            newer epoch's pointer file decides after this one's write.
        CheckpointError: the newest checkpoint's manifest cannot be read; the mutex was not had in time.
        OSError: the pointer could not be written.
    """
    pointer = os.path.join(directory, POINTER_NAME)
    if latest_checkpoint(directory) is None:  # nothing to take (and no mutex taken in an empty directory)
        return None
    with directory_mutex(directory, may_pass=True) as held:
        path = latest_checkpoint(directory)
        if path is None:
            return None
        name = os.path.basename(path)
        current = effective_pointer(directory)[0] or {}
        refuse_newer_epoch(current, pointer, run_id=run_id, epoch=epoch, refused=f"checkpoint {path} not restored")
        theirs = current.get("epoch")
        if current.get("latest") == name and (current.get("run_id"), theirs) == (run_id, epoch):
            return path
        if current.get("latest") == name and current.get("run_id") not in (run_id, None):
            return path  # another run's checkpoint, named by its pointer: no fenced save of this run removes it
        taken = dict(current, latest=name, run_id=run_id, epoch=epoch, holder=holder)
        if current.get("latest") != name:
            manifest = read_manifest(path)
            listed = current.get("all")
            kept = [str(n) for n in listed if n != name] if isinstance(listed, list) else []
            taken.update({"all": [*kept, name], "global_step": manifest.global_step, "lineage": manifest.lineage})
        refuse_unless_ours(publish(directory, taken, held=held), taken, pointer, f"checkpoint {path} not restored")
    log.info("checkpoint %s: taken over for a restore by %s at epoch %d (the pointer %s had %s)", path, holder, epoch,
             pointer, f"epoch {theirs} of run {current.get('run_id')}" if current else "nothing")
    return path


def checkpoint_to_restore(directory: str, *, run_id: str | None, lease: Lease | None) -> str | None:
    """The checkpoint a restoring chief reads: with its ``lease`` and the ``run_id``, the newest one taken over at
    the lease's epoch (:func:`adopt_latest`); without either (the run's only chief: no older one to fence off),
    the newest one as it is (:func:`~psflow.checkpoint.pointer.latest_checkpoint`, nothing written). None: there
    is none.

    Raises:
        CheckpointFencedError, CheckpointError, OSError: as :func:`adopt_latest`.
    """
    if lease is None or run_id is None:
        return latest_checkpoint(directory)
    return adopt_latest(directory, run_id=run_id, epoch=lease.epoch, holder=lease.holder)
