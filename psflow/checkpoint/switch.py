"""The pointer's compare-and-swap: a save's switch, its undo when fenced off, and the fence every writer asks.

A writer with a lease epoch publishes through its own pointer file ``checkpoint.e<epoch>``
(:func:`~psflow.checkpoint.pointer.publish`), so it may go on past a directory mutex kept by a stopped chief
(:func:`~psflow.checkpoint.lock.directory_mutex`'s ``may_pass``): that chief, resumed, writes its own epoch's
file and finds the newer one deciding, and is fenced off (see :mod:`psflow.checkpoint`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from psflow import storage
from psflow.checkpoint.lock import directory_mutex
from psflow.checkpoint.manifest import POINTER_NAME, read_json
from psflow.checkpoint.pointer import (
    effective_pointer,
    epoch_file,
    epoch_files,
    is_complete,
    publish,
    same_pointer,
    write_pointer,
)
from psflow.checkpoint.rotation import kept_after
from psflow.errors import CheckpointError

__all__ = ["CheckpointFencedError", "refuse_newer_epoch", "switch_pointer", "undo_pointer", "refuse_unless_ours"]

log = logging.getLogger("psflow.checkpoint.save")


class CheckpointFencedError(CheckpointError):
    """A newer chief's epoch fenced this save off; the pointer does not name it (not a failed save)."""


def refuse_newer_epoch(current: dict[str, Any], pointer: str, *, run_id: str, epoch: int | None, refused: str) -> None:
    """The fence on the pointer, for a chief of run ``run_id`` at lease ``epoch`` about to write it (a save's
    switch, :meth:`CheckpointManager.mark_final`, :func:`~psflow.checkpoint.adopt.adopt_latest`; under the
    directory's mutex, or past it with an epoch): ``current``, the pointer that decides
    (:func:`~psflow.checkpoint.pointer.effective_pointer`), was written by a newer epoch of the same run (any
    epoch, for a chief without one). A pointer of another run never refuses (a resumed run).

    Raises:
        CheckpointFencedError: refused; the message is ``refused``, then why (the pointer's epoch and holder).
    """
    theirs = current.get("epoch")
    if current.get("run_id") == run_id and type(theirs) is int and (epoch is None or epoch < theirs):
        raise CheckpointFencedError(
            f"{refused}: the pointer {pointer} (or {os.path.basename(pointer)}.e{theirs}) was written at epoch "
            f"{theirs} (by {current.get('holder') or 'a newer chief'}); this chief's epoch {epoch} is older")


def refuse_unless_ours(now: dict[str, Any], data: dict[str, Any], pointer: str, refused: str) -> None:
    """After :func:`~psflow.checkpoint.pointer.publish`: ``now``, the pointer deciding, must be ``data``.

    Raises:
        CheckpointFencedError: a newer epoch's pointer decides (published while this chief was stopped).
    """
    if not same_pointer(now, data):
        raise CheckpointFencedError(
            f"{refused}: the pointer {pointer} names {now.get('latest')}, written at epoch {now.get('epoch')} (by "
            f"{now.get('holder') or 'a newer chief'}) of run {now.get('run_id')}; this chief's epoch "
            f"{data.get('epoch')} is older")


def switch_pointer(directory: str, data: dict[str, Any], *, max_to_keep: int,
                   before_publish: Callable[[], None] | None = None) -> tuple[list[str], dict[str, Any] | None]:
    """Makes checkpoint ``data["latest"]`` current: compare-and-swap of the pointer (see :mod:`psflow.checkpoint`);
    ``data`` holds the pointer's other fields but ``all``. Returns (kept, the pointer that decided before).
    ``before_publish``: called under the mutex, after the checks here and just before the pointer is written (a
    save's :func:`~psflow.checkpoint.publish_checks.check_no_restore_since`); what it raises refuses the switch,
    nothing written.

    With an ``epoch``, past a mutex held too long: published through this epoch's own pointer file, which no
    other chief writes.

    Raises:
        CheckpointFencedError: the pointer was written by a newer epoch of this run (read before, found deciding
            after this chief's write, or when the new checkpoint is found deleted: that chief rotated it away).
        CheckpointError: the new checkpoint is no longer complete (and no newer epoch's pointer decides).
        Whatever ``before_publish`` raised.
    """
    name, epoch = data["latest"], data.get("epoch")
    pointer = os.path.join(directory, POINTER_NAME)
    with directory_mutex(directory, may_pass=epoch is not None) as held:
        previous = effective_pointer(directory)[0]
        refuse_newer_epoch(previous or {}, pointer, run_id=data["run_id"], epoch=epoch,
                           refused=f"checkpoint {name} not made current")
        if not is_complete(os.path.join(directory, name)):
            # A newer chief past the mutex rotates an older epoch's complete checkpoints it does not keep: this
            # one, while this chief was stopped after its check above. Its epoch file decides now: fenced off.
            refuse_newer_epoch(effective_pointer(directory)[0] or {}, pointer, run_id=data["run_id"], epoch=epoch,
                               refused=f"checkpoint {name} not made current (deleted by a newer chief's rotation)")
            raise CheckpointError(f"checkpoint {os.path.join(directory, name)} was deleted before it was made current")
        if before_publish is not None:
            before_publish()
        kept = kept_after(directory, name, data["lineage"], max_to_keep)
        data = dict(data, all=kept)
        refuse_unless_ours(publish(directory, data, held=held), data, pointer, f"checkpoint {name} not made current")
    return kept, previous


def undo_pointer(directory: str, name: str, previous: dict[str, Any] | None, *, run_id: str, epoch: int | None,
                 holder: str) -> None:
    """Puts the previous pointer back if the pointer that decides still names ``name`` (a fenced save's).

    The previous checkpoint is published again under this chief's run and epoch (its epoch file and
    ``checkpoint``), so the pointer's run never goes back to another run's (that would hide this run's epoch
    files from readers). Where a newer epoch's pointer decides, ``checkpoint`` is only set to it if it still
    names ``name``. With no previous pointer, the epoch file and ``checkpoint`` are removed; a newer epoch's file
    of this run found afterwards (its chief published while this one was stopped past its check) is written back
    as ``checkpoint``. Never past the mutex.
    """
    pointer = os.path.join(directory, POINTER_NAME)
    mine = {"latest": name, "run_id": run_id, "epoch": epoch}
    with directory_mutex(directory):
        current = effective_pointer(directory)[0]
        if not same_pointer(current, mine):
            # a newer chief's pointer replaced it already, or took this checkpoint as its own (mark_final)
            if current is not None and same_pointer(read_json(pointer), mine):
                write_pointer(pointer, current)
            return
        if previous is None:
            if epoch is not None:
                storage.remove(epoch_file(directory, epoch))
            storage.remove(pointer)
            # This chief may have stopped past its check, and a newer chief then published past the mutex: the
            # ``checkpoint`` just removed was that chief's, and without one no epoch file is read. Its epoch file
            # is still there: put it back as ``checkpoint`` (listed after the removal, as publish re-reads).
            newer = [f for f in epoch_files(directory)
                     if f["run_id"] == run_id and (epoch is None or int(f["epoch"]) > epoch)]
            if newer:
                write_pointer(pointer, max(newer, key=lambda f: int(f["epoch"])))
                return
        else:
            publish(directory, dict(previous, run_id=run_id, epoch=epoch, holder=holder), held=True)
    log.warning("checkpoint %s: pointer %s put back to the previous checkpoint (this chief was fenced off)",
                os.path.join(directory, name), pointer)
