"""The checkpoint save's message: SaveShard, its request and its reply (see :mod:`psflow.ps.protocol`; its semantics:
:mod:`psflow.ps.checkpointing`; the manifest a save builds from the replies: :mod:`psflow.checkpoint.save_manifest`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from psflow.ps.protocol.fields import message, optional_int, refuse, strict_bool, string_map
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

__all__ = ["SaveShardReply", "SaveShardRequest", "applied_by_process"]

_SHARD = "shard"  # the array name of a SaveShard's bytes (the caller writes the file)


@message
class SaveShardRequest:
    """Snapshot this task's partitions as shard ``shard`` of ``num_shards``: written to ``path`` by the
    task, or (``path`` None) returned in the reply. ``epoch``/``holder``: the chief's fence. ``since``: an
    incremental shard's base snapshot, ``{"token": str, "epoch": int}`` (see :mod:`psflow.ps.row_marks`);
    None: every row."""

    METHOD: ClassVar[str] = "SaveShard"
    path: str | None
    shard: int | None = None
    num_shards: int | None = None
    epoch: int | None = None
    holder: str = ""
    since: dict[str, Any] | None = None

    def to_frame(self) -> Frame:
        meta: dict[str, Any] = {"path": self.path, "shard": self.shard, "num_shards": self.num_shards}
        if self.epoch is not None:
            meta.update(epoch=self.epoch, holder=self.holder)
        if self.since is not None:
            meta["since"] = dict(self.since)
        return Frame(meta)

    @classmethod
    def from_frame(cls, frame: Frame) -> SaveShardRequest:
        meta = frame.meta
        path = meta.get("path")
        if path is not None and not isinstance(path, str):
            raise InvalidRequest(f"path must be a string or null, got {path!r:.60}")
        epoch, holder = optional_int(meta, "epoch", minimum=0), str(meta.get("holder", ""))[:400]  # the fence
        return cls(path, optional_int(meta, "shard", minimum=0), optional_int(meta, "num_shards", minimum=0),
                   epoch, holder, _marks(meta, "since"))


def _marks(meta: Mapping[str, Any], key: str) -> dict[str, Any] | None:
    """A snapshot's marks ``{"token": str, "epoch": int >= 0}``, or None when absent or null."""
    value = meta.get(key)
    if value is None:
        return None
    if not (isinstance(value, dict) and isinstance(value.get("token"), str) and type(value.get("epoch")) is int
            and value["epoch"] >= 0):
        raise refuse(key, 'a {"token": str, "epoch": int >= 0} object', value)
    return {"token": value["token"], "epoch": value["epoch"]}


@message
class SaveShardReply:
    """What a shard holds: ``partitions`` (their manifest records), the shard's size and sha256, the
    global_step, the reader positions and the examples pushed with them (on the task holding
    global_step), and the bytes themselves when the caller writes the file (``data``).
    ``pushes_applied``: a replicated shard's count of the pushes the snapshot holds (None: unreplicated, not sent),
    ``pushes_applied_by`` each client process's (``[[worker, incarnation, n], ...]``). ``marks``: the snapshot's mark
    token and epoch (a later increment's base), ``generation``: the restore generation it was taken at, ``ready``:
    whether the task was ready then (None: an older task, either)."""

    task: str
    partitions: Sequence[Mapping[str, Any]]
    global_step: int | None
    positions: Mapping[str, str]
    examples: int
    size: int
    sha256: str
    data: np.ndarray | None = None
    pushes_applied: int | None = None
    marks: dict[str, Any] | None = None
    pushes_applied_by: list[list[Any]] | None = None
    generation: int | None = None
    ready: bool | None = None

    def to_frame(self) -> Frame:
        meta: dict[str, Any] = {
            "task": self.task, "partitions": list(self.partitions), "global_step": self.global_step,
            "positions": dict(self.positions), "examples": self.examples, "bytes": self.size, "sha256": self.sha256}
        if self.generation is not None:
            meta["generation"] = self.generation
        if self.ready is not None:
            meta["ready"] = self.ready
        if self.pushes_applied is not None:
            meta["pushes_applied"] = self.pushes_applied
        if self.pushes_applied_by is not None:
            meta["pushes_applied_by"] = self.pushes_applied_by
        if self.marks is not None:
            meta["marks"] = dict(self.marks)
        return Frame(meta, {_SHARD: self.data} if self.data is not None else {})

    @classmethod
    def from_frame(cls, frame: Frame) -> SaveShardReply:
        meta = frame.meta
        parts, sha = meta.get("partitions"), meta.get("sha256")
        if not (isinstance(parts, list) and all(isinstance(p, dict) for p in parts)):
            raise refuse("partitions", "a list of partition records", parts)
        if not isinstance(sha, str):
            raise refuse("sha256", "a hex digest", sha)
        return cls(str(meta.get("task", "")), parts, optional_int(meta, "global_step"),
                   string_map(meta, "positions", "client names to reader position JSON") or {},
                   optional_int(meta, "examples", minimum=0) or 0, optional_int(meta, "bytes", minimum=0) or 0, sha,
                   frame.arrays.get(_SHARD), optional_int(meta, "pushes_applied", minimum=0), _marks(meta, "marks"),
                   applied_by_process(meta.get("pushes_applied_by")), optional_int(meta, "generation", minimum=0),
                   None if meta.get("ready") is None else strict_bool(meta, "ready"))


def applied_by_process(value: object) -> list[list[Any]] | None:
    """A shard's pushes held per client process, ``[[worker: str, incarnation: int, n: int >= 0], ...]``
    (None when absent or null).

    Raises:
        InvalidRequest: any other value (names the field).
    """
    if value is None:
        return None
    if not (isinstance(value, list) and all(
            isinstance(row, list) and len(row) == 3 and isinstance(row[0], str) and type(row[1]) is int
            and type(row[2]) is int and row[2] >= 0 for row in value)):
        raise refuse("pushes_applied_by", "a list of [worker, incarnation, count >= 0]", value)
    return [list(row) for row in value]
