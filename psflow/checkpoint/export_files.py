"""An exported model's files checked against its model.json: what ``psflow predict`` and a warm start read.

``psflow export`` (:mod:`psflow.export`) records in model.json's ``files`` the size and sha256 of each
.safetensors file it writes, from the bytes written. A reader reads each file once, then
:func:`checked_tensors` loads those bytes only if they are the bytes recorded: a reader during another export
into the directory (which replaces each file atomically, model.json first removed and last written), or a file
damaged since (cut short, a bit flipped), gets a refusal naming the directory and the file, never one export's
model.json with another's variables. An export written by a psflow before the sums (no ``files``) is read
unchecked. Here, under :mod:`psflow.checkpoint`, so the warm start (:mod:`psflow.checkpoint.warm_start`) and
:func:`psflow.export.load_model` use one check.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as safetensors_load

from psflow import storage
from psflow.errors import CheckpointError

__all__ = ["MODEL_FILE", "MODEL_JSON", "checked_tensors", "files_problem", "read_exported_variables"]

#: The export's variables, and its description (format, model, step, each file's size and sha256).
MODEL_FILE = "model.safetensors"
MODEL_JSON = "model.json"

_SHA256 = re.compile("[0-9a-f]{64}")


def files_problem(meta: Mapping[str, Any]) -> str | None:
    """What is wrong with model.json's ``files`` field (each entry a size and a sha256), or None (absent: an export
    written before the sums)."""
    files = meta.get("files", {})
    if not isinstance(files, dict):
        return f"field 'files' is {type(files).__name__} {files!r:.60}; not a model.json psflow export wrote"
    for name, entry in files.items():
        if not (isinstance(entry, dict) and type(entry.get("size")) is int and entry["size"] >= 0
                and isinstance(entry.get("sha256"), str) and _SHA256.fullmatch(entry["sha256"])):
            return f"field 'files' says {name!r} is {entry!r:.100}, not a size and sha256; not a model.json psflow export wrote"
    return None


def checked_tensors(model_dir: str, meta: Mapping[str, Any], name: str, data: bytes) -> dict[str, np.ndarray]:
    """The tensors of the export's file ``name``, whose bytes as read are ``data``, once they are the bytes
    model.json's ``files`` records (size and sha256; an export written before the sums records none: unchecked).
    ``meta``: model.json, its ``files`` checked (:func:`files_problem`).

    Raises:
        CheckpointError: ``data`` differs from the record (another export wrote the file after this model.json,
            or it is damaged), or is no safetensors file: names ``model_dir`` and ``name``.
    """
    recorded = meta.get("files", {}).get(name)
    if recorded is not None:
        digest = hashlib.sha256(data).hexdigest()
        if len(data) != recorded["size"] or digest != recorded["sha256"]:
            raise CheckpointError(
                f"{model_dir}: {name} is not the file its model.json names ({recorded['size']} bytes, sha256 "
                f"{recorded['sha256'][:16]}...; read {len(data)} bytes, sha256 {digest[:16]}...): written by "
                "another export meanwhile, or damaged: export again")
    try:
        return dict(safetensors_load(data))
    except SafetensorError as e:
        raise CheckpointError(f"{model_dir}: {name} is not a safetensors file: {e}") from e


def read_exported_variables(model_dir: str) -> dict[str, np.ndarray]:
    """The variables of the export in ``model_dir`` (its model.safetensors), checked against its model.json
    (:func:`checked_tensors`). Reads model.json, then model.safetensors once. Blocks on the reads only.

    Raises:
        CheckpointError: no model.json (not an export, or one being written: an export removes it first), one
            that is not a JSON object or has a malformed ``files`` field (names it), or a model.safetensors that
            cannot be read or is not the file model.json names (names the directory and the file).
    """
    meta_path = os.path.join(model_dir, MODEL_JSON)
    try:
        meta = json.loads(storage.read_bytes(meta_path))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{model_dir}: not a whole psflow export: {meta_path} cannot be read (an export "
                              f"into it removes it first: export again, or name a .safetensors file): {e}") from e
    problem = files_problem(meta) if isinstance(meta, dict) else f"{type(meta).__name__}, not a JSON object"
    if problem is not None:
        raise CheckpointError(f"{meta_path}: {problem}")
    path = os.path.join(model_dir, MODEL_FILE)
    try:
        data = storage.read_bytes(path)  # its only read: checked, then loaded
    except OSError as e:
        raise CheckpointError(f"{model_dir}: cannot read {MODEL_FILE}: {e}") from e
    return checked_tensors(model_dir, meta, MODEL_FILE, data)
