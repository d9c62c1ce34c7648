"""Which checkpoint is the newest: the pointer file ``checkpoint`` and the complete checkpoints of a directory.

:func:`latest_checkpoint` follows the pointer only to a complete ``ckpt-*`` directory directly inside the
checkpoint directory; a pointer that names one that is gone falls back to the newest complete one it lists;
a pointer that is missing, damaged or names anything else is reported (once per process, a WARNING naming
the file) and ignored: the newest complete checkpoint inside the directory is used. What is complete is read
from the directory (the manifests), never from the pointer.

Per-epoch pointer files: a chief holding lease epoch E writes ``checkpoint.e<E>`` (the pointer's JSON, its
``epoch`` E) before ``checkpoint`` (:func:`publish`). Each epoch has one holder, so each such file has one
writer, and a chief of an older epoch, resumed after a stop, can never replace a newer epoch's file.
:func:`effective_pointer` reads ``checkpoint``, then the newest epoch file of its run: that one decides when its
epoch is newer than ``checkpoint``'s. A directory without epoch files reads ``checkpoint`` alone, as before.

A directory that cannot be listed (a disk's or a network filesystem's error, a store's refusal, a file where the
directory should be) makes :func:`latest_checkpoint` and :func:`incomplete_checkpoints` raise
:class:`CheckpointListingError` naming the directory: a :class:`~psflow.errors.CheckpointError` (a task ends on it
with one line) and an ``OSError`` (the callers that wait out a store's outage still do), raised from the error met.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from collections.abc import Iterator
from typing import Any

from psflow import jsonio, storage
from psflow.checkpoint.manifest import MANIFEST_NAME, POINTER_NAME, PREFIX, read_json
from psflow.errors import CheckpointError

__all__ = ["latest_checkpoint", "incomplete_checkpoints", "complete_checkpoints", "checkpoint_dirs", "is_complete",
           "parse_pointer", "write_pointer", "effective_pointer", "epoch_files", "publish",
           "epoch_file", "same_pointer", "pointer_files", "CheckpointListingError"]

log = logging.getLogger(__name__)


class CheckpointListingError(CheckpointError, OSError):
    """The checkpoint directory could not be listed or read while looking for its checkpoints (names it and the
    error met, which is its cause)."""


@contextlib.contextmanager
def _listing(directory: str) -> Iterator[None]:
    """Makes an ``OSError`` met while looking into ``directory`` a :class:`CheckpointListingError` naming it."""
    try:
        yield
    except OSError as e:
        if isinstance(e, CheckpointListingError):
            raise
        raise CheckpointListingError(f"checkpoint directory {directory} cannot be listed: "
                                     f"{' '.join(str(e).split()) or type(e).__name__}") from e


def latest_checkpoint(directory: str) -> str | None:
    """The newest complete checkpoint in ``directory``, or None.

    The pointer decides when it names a complete ``ckpt-*`` directory
    directly inside ``directory``. A pointer that names one that is gone or
    has no manifest falls back to the newest complete one the pointer lists
    (``all``). A pointer that is missing (while the directory holds
    checkpoints), unreadable, not a JSON object, or names anything else (an
    absolute path, a path with ``..`` or ``/``, a symlink, a name without the
    ``ckpt-`` prefix) is ignored: the newest complete checkpoint inside
    ``directory`` (by global_step, then save time, from the manifests) is
    used. Each such problem is logged once per process as a WARNING naming
    the pointer file and what was wrong.

    Raises:
        CheckpointListingError: ``directory`` could not be listed (see the module docstring).
    """
    with _listing(directory):
        path, problem = _latest(directory)
    if problem is not None and problem not in _POINTER_WARNED:
        _POINTER_WARNED.add(problem)
        log.warning("%s", problem)
    return path


#: Pointer problems already logged by this process (a reader asks at every step of some loops).
_POINTER_WARNED: set[str] = set()


def _latest(directory: str) -> tuple[str | None, str | None]:
    """(the newest complete checkpoint, what was wrong with the pointer, or None when nothing was)."""
    pointer = os.path.join(directory, POINTER_NAME)
    data, problem = effective_pointer(directory)
    if data is not None:
        name = data.get("latest")
        if not _checkpoint_name(name) or storage.islink(os.path.join(directory, str(name))):
            problem = f"names {name!r}, which is not a {PREFIX}* directory directly inside {directory}"
        elif is_complete(os.path.join(directory, str(name))):
            return os.path.join(directory, str(name)), None
        else:
            problem = f"names {os.path.join(directory, str(name))}, which is gone or has no manifest"
            listed = data.get("all")
            for other in reversed(listed if isinstance(listed, list) else []):
                path = os.path.join(directory, str(other))
                if _checkpoint_name(other) and not storage.islink(path) and is_complete(path):
                    return path, f"checkpoint pointer {pointer} {problem}; using {other}, the newest complete one it lists"
    complete = complete_checkpoints(directory)
    newest = complete[-1][0] if complete else None
    if data is None and problem is None:  # no pointer file
        if newest is None:
            return None, None  # and no checkpoint yet: a fresh directory
        problem = "is missing"
    using = (f"using the newest complete checkpoint inside it, {os.path.basename(newest)}" if newest is not None
             else "it holds no complete checkpoint")
    return newest, f"checkpoint pointer {pointer} {problem}; ignored: {using}"


#: A per-epoch pointer file's name: ``checkpoint.e<epoch>`` (not its temps, ``checkpoint.e7.tmp-*``).
_EPOCH_FILE = re.compile(rf"^{re.escape(POINTER_NAME)}\.e(\d+)$")


def epoch_file(directory: str, epoch: int) -> str:
    """The per-epoch pointer file of lease ``epoch`` in ``directory``."""
    return os.path.join(directory, f"{POINTER_NAME}.e{epoch}")


def epoch_files(directory: str) -> list[dict[str, Any]]:
    """The readable per-epoch pointer files of ``directory``: JSON objects with a ``run_id`` and the ``epoch`` their
    name says. A damaged one, or one whose epoch is not its name's, is left out (a WARNING once per process)."""
    try:
        names = storage.listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for name in names:
        match = _EPOCH_FILE.match(name)
        if match is None:
            continue
        data, problem = _pointer_data(os.path.join(directory, name))
        if data is not None and (data.get("epoch") != int(match.group(1)) or not isinstance(data.get("run_id"), str)):
            problem = f"holds epoch {data.get('epoch')!r} of run {data.get('run_id')!r}, not the epoch its name says"
        if problem is not None:
            _warn_once(f"checkpoint pointer {os.path.join(directory, name)} {problem}; ignored")
        elif data is not None:
            found.append(data)
    return found


def effective_pointer(directory: str) -> tuple[dict[str, Any] | None, str | None]:
    """The pointer that decides in ``directory`` and what was wrong with ``checkpoint`` (None: nothing).

    The newest epoch file of ``checkpoint``'s run decides if its epoch is newer than ``checkpoint``'s (one without
    an epoch counts as -1), else ``checkpoint`` does. A ``checkpoint`` that is missing or damaged is reported as
    before, and no epoch file is read (every writer writes ``checkpoint`` after its epoch file: only a hand or
    a damaged disk takes it away). (None, None): there is no pointer at all.
    """
    data, problem = _pointer_data(os.path.join(directory, POINTER_NAME))
    if data is None:
        return data, problem
    files = epoch_files(directory)
    theirs = data.get("epoch")
    ours = [f for f in files if f["run_id"] == data.get("run_id")]
    newest = max(ours, key=lambda f: int(f["epoch"])) if ours else None
    if newest is not None and int(newest["epoch"]) > (theirs if type(theirs) is int else -1):
        return newest, None
    return data, problem


def same_pointer(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two pointers name the same checkpoint for the same run and epoch."""
    keys = ("latest", "run_id", "epoch")
    return a is not None and b is not None and all(a.get(k) == b.get(k) for k in keys)


def publish(directory: str, data: dict[str, Any], *, held: bool) -> dict[str, Any]:
    """Makes ``data`` (with its ``run_id`` and ``epoch``) the pointer of ``directory``; returns the pointer that
    decides afterwards (:func:`effective_pointer`): ``data``, or a newer epoch's, which then wins.

    With an int ``epoch``, ``checkpoint.e<epoch>`` is written first, then ``checkpoint`` (each replaced whole).
    ``checkpoint`` is then read back with the epoch files: where a newer epoch's file of the run decides (a
    newer chief published while this one was stopped), ``checkpoint`` is set to it (for readers of older
    psflow versions). ``held``: the caller holds the directory's mutex; only then, when ``data`` decides, are the
    epoch files of other runs and older epochs of this run deleted.

    Raises:
        OSError: a file could not be written.
    """
    epoch = data.get("epoch")
    if type(epoch) is int:
        write_pointer(epoch_file(directory, epoch), data)
    pointer = os.path.join(directory, POINTER_NAME)
    write_pointer(pointer, data)
    current: dict[str, Any] | None = data
    for _ in range(3):  # another writer may have written the shared file meanwhile: read it again
        current, _problem = effective_pointer(directory)
        raw, _problem = _pointer_data(pointer)
        if current is None or current == raw:
            break
        write_pointer(pointer, current)
    if held and same_pointer(current, data):
        for other in epoch_files(directory):
            if other["run_id"] != data.get("run_id") or (type(epoch) is int and int(other["epoch"]) < epoch):
                try:
                    storage.remove(epoch_file(directory, int(other["epoch"])))
                except FileNotFoundError:
                    pass
    return current if current is not None else data


def _warn_once(problem: str) -> None:
    if problem not in _POINTER_WARNED:
        _POINTER_WARNED.add(problem)
        log.warning("%s", problem)


def _pointer_data(pointer: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the pointer's JSON object, None), or (None, what is wrong); (None, None): there is no pointer file."""
    try:
        raw = storage.read_bytes(pointer)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot be read ({e})"
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if not isinstance(data, dict):
        return None, f"is not a JSON object (damaged? {len(raw)} bytes)"
    return data, None


def _checkpoint_name(name: object) -> bool:
    """``name`` can only name a directory directly inside the checkpoint directory: ``ckpt-*``, no path."""
    return (isinstance(name, str) and name.startswith(PREFIX) and os.path.basename(name) == name
            and "/" not in name and "\\" not in name)


def is_complete(path: str) -> bool:
    return storage.exists(os.path.join(path, MANIFEST_NAME))


def complete_checkpoints(directory: str) -> list[tuple[str, dict[str, Any]]]:
    """The complete checkpoints directly inside ``directory`` with their manifests, oldest first.

    Ordered by global_step, then save time (``created``), then name. A checkpoint whose manifest cannot be
    read is not listed. Read from the directory alone, never from the pointer.
    """
    found = []
    for path in checkpoint_dirs(directory):
        manifest = read_json(os.path.join(path, MANIFEST_NAME))
        if manifest is not None:
            found.append((path, manifest))
    return sorted(found, key=_age)


def incomplete_checkpoints(directory: str) -> list[str]:
    """The ``ckpt-*`` directories directly inside ``directory`` that are no checkpoint one can restore (no
    manifest, or one that cannot be read: saves that did not complete), by name.

    Raises:
        CheckpointListingError: ``directory`` could not be listed.
    """
    with _listing(directory):
        complete = {path for path, _ in complete_checkpoints(directory)}
        return [path for path in checkpoint_dirs(directory) if path not in complete]


def pointer_files(directory: str) -> list[str]:
    """The names of the pointer files in ``directory``, readable or not: ``checkpoint`` and the epoch files
    ``checkpoint.e<N>`` (not their temps); none for a missing directory.

    Raises:
        CheckpointListingError: ``directory`` could not be listed.
    """
    with _listing(directory):
        try:
            names = storage.listdir(directory)
        except FileNotFoundError:
            return []
    return sorted(n for n in names if n == POINTER_NAME or _EPOCH_FILE.match(n))


def _age(item: tuple[str, dict[str, Any]]) -> tuple[int, float, str]:
    path, manifest = item
    step, created = manifest.get("global_step"), manifest.get("created")
    return (step if type(step) is int else -1, float(created) if isinstance(created, (int, float)) else 0.0,
            os.path.basename(path))


def checkpoint_dirs(directory: str) -> list[str]:
    return storage.subdirectories(directory, PREFIX)  # a symlink is left out: it leads outside


def parse_pointer(data: bytes | None) -> dict[str, Any]:
    if data is None:
        return {}
    try:
        parsed = json.loads(data)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def write_pointer(pointer: str, data: dict[str, Any]) -> None:
    """Replaces the pointer file whole (write, then rename: a reader sees the old or the new one); the caller
    holds the directory's mutex.

    Raises:
        OSError: it could not be written.
    """
    storage.write_atomically(pointer, jsonio.dumps(data, nonfinite="error", what=pointer, indent=1).encode())
