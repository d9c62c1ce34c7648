"""A ps task's shard written after its save's directory was removed, and checkpoint listings that fail.

A save's directory can be removed while a ps task still writes its shard into it: the chief's own failed save
(a ps task slower than ``--save-timeout``: the save fails and :meth:`CheckpointManager._remove_current` removes the
directory), or a deposed chief's save whose directory a newer chief's rotation removed. On an object store the late
put makes the "directory" (a prefix) again; locally a file the ps task creates while ``rmtree`` runs keeps the
directory. Either way a ``ckpt-*`` holding shard files but no writer file and no manifest was left for ever: no
rotation listed it (no writer file to judge), and every listing reported it as an incomplete checkpoint. A save
under the directory's mutex now removes it (no save's own directory is ever without its writer file under the
mutex); past the mutex it is kept. Real in-process ps services write the shard (their ``SaveShard``).

Also: :func:`latest_checkpoint` raises a :class:`CheckpointError` naming the directory when it cannot be listed,
never a bare ``OSError``.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
from test_pointer_epochs import _cluster, _step

from psflow import storage
from psflow.checkpoint import lock
from psflow.checkpoint.lock import directory_mutex
from psflow.checkpoint.pointer import incomplete_checkpoints, latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.errors import CheckpointError
from psflow.launch.console import expected_in_task
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SaveShardRequest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _short_mutex_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock, "MUTEX_TIMEOUT", 0.5)


def _late_shard(client: ParameterClient, directory: str, name: str) -> str:
    """ps task 1 writes its shard of a save whose directory ``name`` is gone (a late SaveShard); returns the path."""
    path = f"{directory.rstrip('/')}/{name}"
    if not storage.is_remote(path):
        os.makedirs(path)  # the directory rmtree could not remove: the file appeared while it ran
    client.call(1, SaveShardRequest(f"{path}/shard-00001-of-00002.safetensors", 1, 2, 3, "chief"))
    return path


def _names(paths: list[str]) -> list[str]:
    return [os.path.basename(p.rstrip("/")) for p in paths]


def _removed_at_the_next_save(directory: str) -> None:
    client = _cluster()
    manager = CheckpointManager(directory, run_id="run-a", max_to_keep=2)
    first = manager.save(client, epoch=3, holder="chief")
    late = _late_shard(client, directory, "ckpt-000000000-late")
    assert _names(incomplete_checkpoints(directory)) == ["ckpt-000000000-late"]
    _step(client)
    second = manager.save(client, epoch=3, holder="chief")
    assert incomplete_checkpoints(directory) == [], "the late shard's directory is left behind"
    assert not storage.exists(late)
    assert latest_checkpoint(directory) == second.path and storage.exists(first.path)


def test_a_shard_written_after_its_save_was_removed_goes_at_the_next_save(tmp_path: Path) -> None:
    _removed_at_the_next_save(str(tmp_path))


def test_on_an_object_store_too(object_store: str) -> None:
    """The late put makes the prefix again: the window is the ps task's whole save there."""
    _removed_at_the_next_save(f"{object_store}/ckpt")


def test_kept_past_the_mutex_and_when_it_holds_anything_else(tmp_path: Path) -> None:
    """Past the mutex (held by a stopped chief) nothing tells it from a save being made: kept. Under it, a directory
    holding anything but shard files (a file a person put there) and one with a writer file of a newer epoch (that
    chief's save in progress) are kept too."""
    client = _cluster()
    manager = CheckpointManager(str(tmp_path), run_id="run-a", max_to_keep=2)
    manager.save(client, epoch=3, holder="chief")
    late = _late_shard(client, str(tmp_path), "ckpt-000000000-late")
    other = _late_shard(client, str(tmp_path), "ckpt-000000000-notes")
    Path(other, "notes.txt").write_text("mine")
    newer = _late_shard(client, str(tmp_path), "ckpt-000000000-newer")
    Path(newer, "writer.json").write_text('{"run_id": "run-a", "lineage": "x", "epoch": 9}')
    release, taken = threading.Event(), threading.Event()

    def hold() -> None:
        with directory_mutex(str(tmp_path)):
            taken.set()
            release.wait(90)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert taken.wait(30)
    try:
        _step(client)
        manager.save(client, epoch=4, holder="chief")
    finally:
        release.set()
        holder.join(30)
    assert os.path.isdir(late)
    _step(client)
    manager.save(client, epoch=4, holder="chief")
    assert not os.path.exists(late)
    assert sorted(_names(incomplete_checkpoints(str(tmp_path)))) == ["ckpt-000000000-newer", "ckpt-000000000-notes"]


def test_a_directory_that_cannot_be_listed_is_named_in_a_checkpoint_error(tmp_path: Path) -> None:
    """(As root no permission can be taken away: a file where the directory should be fails the listing alike.)"""
    directory = tmp_path / "ckpt"
    directory.write_text("not a directory")
    with pytest.raises(CheckpointError, match=f"checkpoint directory {directory} cannot be listed") as raised:
        latest_checkpoint(str(directory))
    assert isinstance(raised.value, OSError)  # as before, for the callers that cope with an outage
    assert expected_in_task(raised.value)  # the chief ends with one line (a bare OSError: a traceback)
    with pytest.raises(CheckpointError, match=f"checkpoint directory {directory} cannot be listed"):
        incomplete_checkpoints(str(directory))


def test_a_listing_that_lags_the_writer_file_keeps_a_save_in_progress(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A store whose listing lags a just-written object (list-after-write not guaranteed by every S3-compatible
    store) may list a save's shard files without its writer file: the writer file is asked for itself (a read of
    a written object) before the directory is taken for a late shard's. Here a newer epoch's save in progress,
    whose directory taken would make its manifest, written later, a checkpoint missing shards on a store."""
    from psflow.checkpoint.rotation import deletable

    live = tmp_path / "ckpt-000000005"
    live.mkdir()
    (live / "writer.json").write_text('{"run_id": "run-a", "lineage": "lin", "epoch": 9}')
    (live / "shard-00000-of-00002.safetensors").write_bytes(b"x")
    listdir = storage.listdir

    def lagging(path: str) -> list[str]:
        return [n for n in listdir(path) if n != "writer.json"]

    monkeypatch.setattr(storage, "listdir", lagging)
    assert deletable(str(tmp_path), "run-a", "lin", 4, keep=()) == []
