"""A failed save's directory name is never taken again by a later save of the process.

A ps task slower than ``--save-timeout`` fails the chief's save (its SaveShard's deadline passes) while the task
still writes its shard; the chief's cleanup (:meth:`CheckpointManager._remove_current`) removes the save's
directory. The next save at the same global_step (the final save right after a failed periodic one) took the same
name, ``ckpt-<step>``, and the ps task's late write landed in it: the new checkpoint's shard then held the failed
save's snapshot, whose sha256 is not the manifest's, and the checkpoint could not be restored. Saves without a
lease epoch (no chief election): a ps task holds its fence for a fenced save's write, so a fenced save's next
SaveShard waits for the late one there. Real in-process ps services write both shards (their ``SaveShard``);
only the deadline is a stand-in, as a gRPC channel's would be.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_pointer_epochs import _cluster

from psflow import storage
from psflow.checkpoint import lock, naming
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.restore import restore
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.shards import ShardFiles
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient
from psflow.rpc.api import DeadlineExceededError
from psflow.rpc.inprocess import InProcessChannel, _Done

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _short_mutex_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock, "MUTEX_TIMEOUT", 0.5)


class _LateChannel:
    """ps task 1's channel whose first SaveShard passes its deadline: the task goes on in a thread of its own (as
    a real ps task does once the chief's call gave up) and its write is held until ``release``."""

    def __init__(self, inner: InProcessChannel) -> None:
        self.inner, self.task, self.address = inner, inner.task, inner.address
        self.release, self.wrote = threading.Event(), threading.Event()
        self.late: threading.Thread | None = None

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Any:
        if method != "SaveShard" or self.late is not None:
            return self.inner.call_async(method, meta, arrays, timeout=timeout)
        self.late = threading.Thread(target=self._late_write, args=(meta, arrays), name="late-shard", daemon=True)
        self.late.start()
        return _Done(DeadlineExceededError(f"{self.task}: SaveShard: deadline exceeded"))

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Any:
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def _late_write(self, meta: Mapping[str, Any] | None, arrays: Mapping[str, np.ndarray] | None) -> None:
        try:
            self.inner.call_async("SaveShard", meta, arrays)  # (its error, the directory gone, is the task's log line)
        finally:
            self.wrote.set()

    def wait_ready(self, timeout: float | None = None) -> None:
        pass

    def close(self) -> None:
        pass


def _ckpts(directory: str) -> list[str]:
    try:
        names = storage.listdir(directory)
    except FileNotFoundError:  # (an object store: no object under the prefix)
        return []
    return sorted(n.rstrip("/").rsplit("/", 1)[-1] for n in names if "ckpt-" in n)


def _late_write_lands_nowhere(directory: str, monkeypatch: pytest.MonkeyPatch, *, restarted: bool = False) -> None:
    client: ParameterClient = _cluster()
    late = _LateChannel(client.channels[1])
    client.channels[1] = late  # type: ignore[assignment]
    write, late_paths = storage.write_atomically, []

    def held_write(path: str, data: bytes | memoryview, **kw: Any) -> None:
        if threading.current_thread() is late.late:  # the snapshot is taken; its write waits
            assert late.release.wait(60)
            late_paths.append(path)
        write(path, data, **kw)

    monkeypatch.setattr(storage, "write_atomically", held_write)  # (the ps task's SaveShard writes through it)
    manager = CheckpointManager(directory, run_id="run-a", max_to_keep=3)
    with pytest.raises(CheckpointError, match="shard-00001-of-00002.safetensors failed"):
        manager.save(client)  # the periodic save: ps task 1 too slow
    assert _ckpts(directory) == [], "the failed save's directory is removed"
    if restarted:  # the chief's process restarted (crashed, or its lease moved): its memory is gone, the run's lock kept
        monkeypatch.setattr(naming, "_RETIRED", {})
        manager = CheckpointManager(directory, run_id="run-a", max_to_keep=3)
    try:
        final = manager.save(client, final=True)  # the same global_step
    finally:
        late.release.set()
        assert late.wrote.wait(60)
    assert latest_checkpoint(directory) == final.path
    assert late_paths and not any(p.startswith(f"{final.path}/") for p in late_paths), late_paths
    manifest = read_manifest(final.path)
    shards = ShardFiles(final.path, manifest)
    for shard in manifest.shards:  # each shard's sha256 the manifest's: the late write landed nowhere in it
        shards.get(shard["file"])
    restore(_cluster(), final.path)
    name = final.path.rstrip("/").rsplit("/", 1)[-1]
    assert name.startswith("ckpt-000000000-")  # the failed save's name, suffixed
    if storage.is_remote(directory):  # the late put made the old prefix again: shard files alone (rotation.py)
        assert _ckpts(directory) == ["ckpt-000000000", name]
    else:  # the late write found no directory
        assert _ckpts(directory) == [name]


def test_the_next_save_of_the_step_never_takes_the_failed_saves_name(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _late_write_lands_nowhere(str(tmp_path), monkeypatch)


def test_on_an_object_store_too(object_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _late_write_lands_nowhere(f"{object_store}/ckpt", monkeypatch)


def test_nor_does_the_save_of_a_restarted_chief_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The save after the failed one is the chief's next process's (the first crashed, or its lease moved to another
    worker's process): what the first process removed is recorded in the checkpoint directory, not in its memory."""
    _late_write_lands_nowhere(str(tmp_path), monkeypatch, restarted=True)


def test_nor_on_an_object_store(object_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _late_write_lands_nowhere(f"{object_store}/ckpt", monkeypatch, restarted=True)


def test_a_save_whose_writer_file_cannot_be_written_leaves_no_directory(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk: the save's directory is made, its writer file is not (no shard asked for yet). Before, the
    directory stayed (the save's cleanup knows only a directory made whole) and the run's last failed save left it."""
    write = storage.write_atomically

    def full_disk(path: str, data: bytes | memoryview, **kw: Any) -> None:
        if path.endswith("writer.json"):
            raise OSError(28, "No space left on device", path)
        write(path, data, **kw)

    monkeypatch.setattr(storage, "write_atomically", full_disk)
    with pytest.raises(CheckpointError, match="No space left on device"):
        CheckpointManager(str(tmp_path), run_id="run-a").save(_cluster())
    assert _ckpts(str(tmp_path)) == []
