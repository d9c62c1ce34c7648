"""Which checkpoint is the newest: the pointer file ``checkpoint`` and the complete checkpoints of a directory.

:func:`latest_checkpoint` follows the pointer only to a complete ``ckpt-*`` directory directly inside the
checkpoint directory; a pointer that names one that is gone falls back to the newest complete one it lists;
a pointer that is missing, damaged or names anything else is reported (once per process, a WARNING naming
the file) and ignored: the newest complete checkpoint inside the directory is used. What is complete is read
from the directory (the manifests), never from the pointer.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from psflow import jsonio, storage
from psflow.checkpoint.manifest import MANIFEST_NAME, POINTER_NAME, PREFIX, read_json

__all__ = ["latest_checkpoint", "incomplete_checkpoints", "complete_checkpoints", "checkpoint_dirs", "is_complete",
           "parse_pointer", "read_pointer", "write_pointer"]

log = logging.getLogger(__name__)


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
    """
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
    data, problem = _pointer_data(pointer)
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
    manifest, or one that cannot be read: saves that did not complete), by name."""
    complete = {path for path, _ in complete_checkpoints(directory)}
    return [path for path in checkpoint_dirs(directory) if path not in complete]


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


def read_pointer(pointer: str) -> dict[str, Any]:
    """The pointer file's JSON object, for a writer that holds the directory's mutex: {} when there is no
    pointer file or it is damaged (the writer replaces it).

    Raises:
        OSError: the pointer exists but cannot be read.
    """
    try:
        return parse_pointer(storage.read_bytes(pointer))
    except FileNotFoundError:
        return {}


def write_pointer(pointer: str, data: dict[str, Any]) -> None:
    """Replaces the pointer file whole (write, then rename: a reader sees the old or the new one); the caller
    holds the directory's mutex.

    Raises:
        OSError: it could not be written.
    """
    storage.write_atomically(pointer, jsonio.dumps(data, nonfinite="error", what=pointer, indent=1).encode())
