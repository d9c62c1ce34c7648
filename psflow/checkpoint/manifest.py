"""What a checkpoint holds: its files' names and ``manifest.json`` (:class:`Manifest`), read back by :func:`read_manifest`.

A checkpoint directory ``ckpt-<step>`` is complete when its manifest exists: the manifest is written last
(see :mod:`psflow.checkpoint`), so a directory without one is a save that did not finish and is never restored.
A manifest of another format or format version is refused, naming the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from psflow import jsonio, storage
from psflow.errors import CheckpointError

__all__ = ["FULL", "INCREMENT", "Manifest", "SavedCheckpoint", "read_manifest", "read_json", "lineage_of", "psflow_version",
           "MANIFEST_NAME", "POINTER_NAME", "WRITER_NAME", "FORMAT", "FORMAT_VERSION", "PREFIX"]


MANIFEST_NAME = "manifest.json"


POINTER_NAME = "checkpoint"


WRITER_NAME = "writer.json"


FORMAT = "psflow-checkpoint"


FORMAT_VERSION = 1


PREFIX = "ckpt-"


#: :attr:`Manifest.kind` of a checkpoint holding every row, and of one holding the rows changed since its base.
FULL, INCREMENT = "full", "increment"


@dataclass(frozen=True)
class Manifest:
    """What a checkpoint holds; ``manifest.json`` of a checkpoint directory.

    Attributes:
        global_step: the step of the snapshot (read on the task holding it).
        variables: name -> ``{"shape", "dtype", "trainable", "partitions": [{"index", "task",
            "row_start", "row_stop", "shard", "slots"}]}``.
        shards: ``[{"file", "task", "bytes", "sha256"}]``, in ps task order, none of a task holding nothing
            (:mod:`psflow.checkpoint.shard_files`; a checkpoint of an older psflow has one); a replicated shard's also
            ``"pushes_applied"``, the count of the pushes it holds (restored with it within a run: see
            :func:`psflow.checkpoint.restore.restore`).
        reader_positions: worker task -> ReaderPosition JSON.
        examples: examples pushed up to those reader positions (read with
            them), so a resumed run can be checked to consume each record once.
        cluster: the cluster that wrote it (ClusterSpec dict).
        optimizer: the model's optimizer spec (JSON) or None.
        model: the model that wrote it: ``{"name", "config", "data"}`` (its
            registry name or import path, its ModelConfig dict, and how its
            data was read: format, schema, num_features), or None (older
            checkpoints).
        psflow_version: the writer's version.
        created: Unix time of the save.
        lineage: the model state's lineage (see :mod:`psflow.checkpoint`), or None (older checkpoints).
        run: the writing run: ``{"run_id", "epoch", "holder", "writer", "host", "pid"}``, or None.
        final: written when training ended (every worker finished its data, or ``--max-steps`` was
            reached): no newer checkpoint of this run follows. An evaluator stops after it.
        kind: ``"full"`` (every row) or ``"increment"`` (the rows changed since ``base``; see
            :mod:`psflow.checkpoint.chain`). A static partition of an increment with ``"changed": n`` holds
            only those rows; a shard record's ``marks`` (``{"token", "epoch"}``) dates its snapshot. A static
            partition with ``"built": n`` (a lazy one, in a full checkpoint or saved whole in an increment) holds
            only its ``n`` built rows; its other rows are the initial ones of its ``"initializer"`` spec
            (:mod:`psflow.ps.built_rows`).
        base: an increment's base: the name of the previous complete checkpoint (in the same directory).
    """

    global_step: int
    variables: dict[str, dict[str, Any]]
    shards: list[dict[str, Any]]
    reader_positions: dict[str, str] = field(default_factory=dict)
    examples: int = 0
    cluster: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] | None = None
    model: dict[str, Any] | None = None
    psflow_version: str = ""
    created: float = 0.0
    lineage: str | None = None
    run: dict[str, Any] | None = None
    final: bool = False
    kind: str = "full"
    base: str | None = None

    def to_json(self) -> str:
        data = {"format": FORMAT, "format_version": FORMAT_VERSION, **self.__dict__}
        # Keys in their own order, never sorted: the model record's features are in the data's order, which the
        # model's dense and merged sparse inputs follow (sorting them made psflow predict misread Criteo's I1..I13).
        return jsonio.dumps(data, nonfinite="error", what="checkpoint manifest", indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> Manifest:
        """Parses a manifest.

        Raises:
            CheckpointError: not a psflow manifest (names ``where``).
        """
        try:
            data = json.loads(text)
            if data.pop("format", None) != FORMAT:
                raise ValueError("not a psflow checkpoint manifest")
            version = data.pop("format_version", None)
            if version != FORMAT_VERSION:
                raise ValueError(f"format version {version!r}, this psflow reads {FORMAT_VERSION}")
            manifest = cls(**data)
            if manifest.kind not in (FULL, INCREMENT) or (manifest.kind == INCREMENT) != isinstance(manifest.base, str):
                raise ValueError(f"kind {manifest.kind!r} with base {manifest.base!r}")
            return manifest
        except (ValueError, TypeError) as e:
            raise CheckpointError(f"{where}: bad manifest: {e}") from e


@dataclass(frozen=True)
class SavedCheckpoint:
    """A completed save: its directory and global_step."""

    path: str
    global_step: int


def psflow_version() -> str:
    from psflow import __version__

    return __version__


def read_manifest(path: str) -> Manifest:
    """The manifest of checkpoint directory ``path``.

    Raises:
        CheckpointError: missing or malformed (names the file).
    """
    file = os.path.join(path, MANIFEST_NAME)
    try:
        return Manifest.from_json(storage.read_bytes(file).decode("utf-8", "replace"), file)
    except OSError as e:
        raise CheckpointError(f"checkpoint {path} has no readable manifest: {e}") from e


def read_json(path: str) -> dict[str, Any] | None:
    """A small JSON object file, or None (missing, unreadable, not an object)."""
    try:
        data = json.loads(storage.read_bytes(path))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def lineage_of(path: str) -> str | None:
    """The lineage a complete checkpoint's manifest records (None: incomplete, unreadable or older)."""
    manifest = read_json(os.path.join(path, MANIFEST_NAME))
    lineage = manifest.get("lineage") if manifest is not None else None
    return lineage if isinstance(lineage, str) else None
