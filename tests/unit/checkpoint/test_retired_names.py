"""A name removed as a save's is recorded in the checkpoint directory (``.retired/<name>``), so no later process
takes it (psflow.checkpoint.naming): a restarted chief after a crashed save's leftover was removed, and a marker
that cannot be written (a full disk) does not keep the leftover."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from psflow import storage
from psflow.checkpoint import naming
from psflow.checkpoint.leftovers import left_behind
from psflow.checkpoint.manifest import WRITER_NAME
from psflow.checkpoint.naming import RETIRED_DIR, checkpoint_name, free_name, retire
from psflow.checkpoint.pointer import checkpoint_dirs, incomplete_checkpoints, latest_checkpoint, pointer_files
from psflow.checkpoint.rotation import delete_old, remove_leftovers


def _restart(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new process: nothing of the old one's memory."""
    monkeypatch.setattr(naming, "_RETIRED", {})


def _leftover(directory: Path, step: int) -> Path:
    """A crashed save's directory of run ``run-a``: its writer file, one shard, no manifest."""
    path = directory / checkpoint_name(step)
    path.mkdir()
    (path / WRITER_NAME).write_text(json.dumps({"run_id": "run-a", "lineage": "run-a", "epoch": None}))
    (path / "shard-00000-of-00002.safetensors").write_bytes(b"x")
    return path


def test_a_leftover_removed_by_one_process_is_never_named_again_by_the_next(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _leftover(tmp_path, 7)
    assert remove_leftovers(str(tmp_path), "run-a", "run-a", None) == {checkpoint_name(7)}
    assert not (tmp_path / checkpoint_name(7)).exists()
    _restart(monkeypatch)
    assert free_name(str(tmp_path), 7, ()).startswith(f"{checkpoint_name(7)}-")
    assert free_name(str(tmp_path), 8, ()) == checkpoint_name(8)  # only that name


def test_a_suffixed_name_needs_no_marker(tmp_path: Path) -> None:
    retire(str(tmp_path), [f"{checkpoint_name(3)}-1234"])
    assert not (tmp_path / RETIRED_DIR).exists()


def test_on_an_object_store_too(object_store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = f"{object_store}/ckpt"
    retire(directory, [checkpoint_name(4)])
    assert storage.exists(os.path.join(directory, RETIRED_DIR, checkpoint_name(4)))
    _restart(monkeypatch)
    assert free_name(directory, 4, ()).startswith(f"{checkpoint_name(4)}-")


def test_a_marker_not_written_does_not_keep_the_leftover(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A full disk: the leftover's space is what it needs back. The process still avoids the name; the ERROR says a
    later one may not."""
    _leftover(tmp_path, 9)
    (tmp_path / RETIRED_DIR).write_text("a file where the markers' folder goes")  # its markers cannot be written
    assert remove_leftovers(str(tmp_path), "run-a", "run-a", None) == {checkpoint_name(9)}
    assert not (tmp_path / checkpoint_name(9)).exists()
    assert free_name(str(tmp_path), 9, ()).startswith(f"{checkpoint_name(9)}-")
    assert f"could not record its name in {RETIRED_DIR}" in caplog.text


def test_a_step_of_ten_digits_is_retired_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """global_step counts every push (README, Steps): a long run of many workers passes 999,999,999, and
    checkpoint_name gives ten digits then. Its removed name is marked, and a leftover of it can be left behind."""
    step = 1_000_000_000
    _leftover(tmp_path, step)
    assert remove_leftovers(str(tmp_path), "run-a", "run-a", None) == {checkpoint_name(step)}
    assert (tmp_path / RETIRED_DIR / checkpoint_name(step)).exists()
    _restart(monkeypatch)
    assert free_name(str(tmp_path), step, ()).startswith(f"{checkpoint_name(step)}-")
    writer = {"run_id": "run-0", "lineage": "run-a", "epoch": 3, "host": "node-x", "pid": 1, "pid_start": 1,
              "boot_id": "b", "pid_ns": "n"}
    assert left_behind(writer, f"{checkpoint_name(step)}-123", "run-a", 7, [step + 1, step + 2, step + 3])
    assert not left_behind(writer, f"{checkpoint_name(step)}-123", "run-a", 7, [step + 1, step + 2, step])


def _no_checkpoint_in(directory: str) -> None:
    retire(directory, [checkpoint_name(5)])
    assert checkpoint_dirs(directory) == [] and incomplete_checkpoints(directory) == []
    assert latest_checkpoint(directory) is None and pointer_files(directory) == []


def test_markers_are_no_checkpoints(tmp_path: Path) -> None:
    """``.retired/ckpt-*`` is never listed as a checkpoint, complete or not: a run whose only save failed starts as
    from a fresh directory."""
    _no_checkpoint_in(str(tmp_path))


def test_markers_are_no_checkpoints_on_an_object_store(object_store: str) -> None:
    _no_checkpoint_in(f"{object_store}/ckpt")


def test_a_marker_not_written_is_written_at_the_names_next_removal_in_the_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """retire() took a name into the process's memory before its marker: a marker write that failed (a full disk)
    left the name there, and the same name removed again later in the process (a late shard's directory, removed
    by the next save) skipped the marker for good: a restarted chief took the name while that late write still came."""
    (tmp_path / RETIRED_DIR).write_text("a file where the markers' folder goes")  # the disk full
    with pytest.raises(OSError):
        retire(str(tmp_path), [checkpoint_name(5)])
    assert free_name(str(tmp_path), 5, ()).startswith(f"{checkpoint_name(5)}-")  # this process avoids it all the same
    (tmp_path / RETIRED_DIR).unlink()  # space again
    retire(str(tmp_path), [checkpoint_name(5)])
    assert (tmp_path / RETIRED_DIR / checkpoint_name(5)).exists()
    _restart(monkeypatch)
    assert free_name(str(tmp_path), 5, ()).startswith(f"{checkpoint_name(5)}-")


def test_rotation_retires_the_incomplete_directories_it_removes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """delete_old (under the mutex) removes the lineage's incomplete directories beside the old checkpoints: one
    that appeared during the save (an older epoch's save still writing, a crashed save's) whose ps tasks may still
    write their shards there. Its name is retired as remove_leftovers' are: a restarted chief never takes it."""
    _leftover(tmp_path, 11)
    delete_old(str(tmp_path), "run-a", [], "run-a", None)
    assert not (tmp_path / checkpoint_name(11)).exists()
    assert (tmp_path / RETIRED_DIR / checkpoint_name(11)).exists()
    _restart(monkeypatch)
    assert free_name(str(tmp_path), 11, ()).startswith(f"{checkpoint_name(11)}-")
