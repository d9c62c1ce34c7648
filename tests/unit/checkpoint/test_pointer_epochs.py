"""A newer epoch's chief goes past the checkpoint directory's mutex kept by a stopped chief, and the stopped chief,
resumed, cannot take the pointer back: per-epoch pointer files ``checkpoint.e<epoch>`` (one writer each), read
before the shared ``checkpoint`` file. Real in-process ps services (no sockets); a blocked thread holds the real
``flock`` (it is per open file, so a thread of this process is another holder).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from two_ps_in_process import SGD, two_ps_cluster

from psflow.checkpoint import lock, pointer, save, switch
from psflow.checkpoint.adopt import adopt_latest
from psflow.checkpoint.lock import directory_mutex
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointFencedError, CheckpointManager
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService

pytestmark = pytest.mark.timeout(120)


def _cluster() -> ParameterClient:
    client, services = two_ps_cluster()
    client.register(SGD, chief=True)
    _STEP_TASK[id(client)] = services[0]
    return client


_STEP_TASK: dict[int, ParameterService] = {}


def _step(client: ParameterClient) -> None:
    """global_step + 1, as a push would."""
    counter = _STEP_TASK[id(client)].global_step
    assert counter is not None
    counter.increment()


@pytest.fixture(autouse=True)
def _short_mutex_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock, "MUTEX_TIMEOUT", 0.5)


def _write(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data))


@pytest.fixture
def held_mutex(tmp_path: Path) -> Iterator[threading.Event]:
    """A thread holds ``tmp_path``'s mutex (a chief stopped inside it) until the event is set."""
    release, taken = threading.Event(), threading.Event()

    def hold() -> None:
        with directory_mutex(str(tmp_path)):
            taken.set()
            release.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(30)
    yield release
    release.set()
    thread.join(30)


def test_the_newest_epoch_file_of_the_pointers_run_decides(tmp_path: Path) -> None:
    client = _cluster()
    manager = CheckpointManager(str(tmp_path), run_id="run-a")
    a = manager.save(client)
    _step(client)
    b = manager.save(client)
    _write(tmp_path / "checkpoint.e7", {"latest": Path(b.path).name, "all": [Path(b.path).name], "run_id": "run-a",
                                        "epoch": 7, "holder": "new chief"})
    _write(tmp_path / "checkpoint", {"latest": Path(a.path).name, "all": [Path(a.path).name], "run_id": "run-a",
                                     "epoch": 5, "holder": "old chief"})
    assert latest_checkpoint(str(tmp_path)) == b.path


def test_epoch_files_of_another_run_damaged_or_misnamed_are_ignored(tmp_path: Path) -> None:
    client = _cluster()
    manager = CheckpointManager(str(tmp_path), run_id="run-a")
    a = manager.save(client)
    _step(client)
    b = manager.save(client)
    assert latest_checkpoint(str(tmp_path)) == b.path  # no epoch file: the pointer, as before
    names = {"latest": Path(a.path).name, "all": [Path(a.path).name]}
    _write(tmp_path / "checkpoint", {"latest": Path(b.path).name, "all": [Path(b.path).name], "run_id": "run-a",
                                     "epoch": 5})
    _write(tmp_path / "checkpoint.e9", {**names, "run_id": "run-other", "epoch": 9})
    _write(tmp_path / "checkpoint.e8", {**names, "run_id": "run-a", "epoch": 3})  # name and content disagree
    (tmp_path / "checkpoint.e10").write_text("{not json")
    _write(tmp_path / "checkpoint.e11.tmp-1", {**names, "run_id": "run-a", "epoch": 11})
    _write(tmp_path / "checkpoint.e4", {**names, "run_id": "run-a", "epoch": 4})  # older than the pointer
    assert latest_checkpoint(str(tmp_path)) == b.path


def test_a_newer_chiefs_final_save_goes_past_a_chief_stopped_inside_the_switch(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = _cluster()
    first = CheckpointManager(str(tmp_path), run_id="run-a").save(client, epoch=5, holder="old chief")
    _step(client)
    stopped, resume = threading.Event(), threading.Event()
    real = pointer.write_pointer
    old_thread: list[threading.Thread] = []

    def stalled(*args: Any, **kwargs: Any) -> None:
        if threading.current_thread() is old_thread[0] and not stopped.is_set():
            stopped.set()  # the old chief stops here, inside the mutex, its pointer about to be written
            resume.wait(60)
        real(*args, **kwargs)

    monkeypatch.setattr(pointer, "write_pointer", stalled)
    monkeypatch.setattr(save, "write_pointer", stalled, raising=False)
    old = CheckpointManager(str(tmp_path), run_id="run-a", max_to_keep=1)
    outcome: list[BaseException | None] = []

    def old_save() -> None:
        try:
            old.save(client, epoch=5, holder="old chief")
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 (the assertion below names it)
            outcome.append(e)

    old_thread.append(threading.Thread(target=old_save, daemon=True))
    old_thread[0].start()
    assert stopped.wait(30)
    for channel in client.channels.values():  # a newer chief was elected: the ps tasks hold its epoch
        channel.call("Fence", {"token": 7, "holder": "new chief"})
    _step(client)
    successor = CheckpointManager(str(tmp_path), run_id="run-a", max_to_keep=1)
    new = successor.save(client, epoch=7, holder="new chief", final=True)
    assert latest_checkpoint(str(tmp_path)) == new.path
    resume.set()
    old_thread[0].join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], CheckpointFencedError), outcome
    assert old.failed_in_a_row == 0
    assert latest_checkpoint(str(tmp_path)) == new.path and read_manifest(new.path).final
    assert json.loads((tmp_path / "checkpoint").read_text()) == json.loads((tmp_path / "checkpoint.e7").read_text())
    names = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(("ckpt-", ".creating")))
    assert Path(new.path).name in names and all(not n.startswith(".creating") for n in names), names
    assert Path(first.path).exists()  # (past the mutex: checkpoint.e5 named it when the successor rotated)
    assert len(names) == 2, names  # the old chief's fenced save is gone


def test_mark_final_and_adopt_go_past_a_held_mutex(tmp_path: Path, held_mutex: threading.Event) -> None:
    client = _cluster()
    manager = CheckpointManager(str(tmp_path), run_id="run-a")
    with pytest.raises(CheckpointError):  # (a save without an epoch never goes past it)
        manager.save(client)
    held_mutex.set()
    saved = manager.save(client, epoch=5, holder="old chief")
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with directory_mutex(str(tmp_path)):
            held.set()
            release.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(30)
    try:
        manager.mark_final(saved.path, epoch=7, holder="new chief")
        assert read_manifest(saved.path).final
        assert json.loads((tmp_path / "checkpoint.e7").read_text())["latest"] == Path(saved.path).name
        assert adopt_latest(str(tmp_path), run_id="run-a", epoch=8, holder="restorer") == saved.path
        assert json.loads((tmp_path / "checkpoint").read_text())["epoch"] == 8
        assert latest_checkpoint(str(tmp_path)) == saved.path
    finally:
        release.set()
        thread.join(30)


def test_a_save_without_an_epoch_still_fails_behind_a_held_mutex(tmp_path: Path, held_mutex: threading.Event) -> None:
    client = _cluster()
    with pytest.raises(CheckpointError, match="held its lock for"):
        CheckpointManager(str(tmp_path), run_id="run-a").save(client)


def test_a_resumed_runs_fenced_first_save_leaves_the_pointer_to_its_own_run(tmp_path: Path) -> None:
    client = _cluster()
    previous = CheckpointManager(str(tmp_path), run_id="run-a").save(client, epoch=3, holder="run-a chief")
    _step(client)

    def successor_elected(phase: str) -> None:
        if phase == "pointer_switched":
            for channel in client.channels.values():
                channel.call("Fence", {"token": 9, "holder": "new chief"})

    resumed = CheckpointManager(str(tmp_path), run_id="run-b", fault=successor_elected)
    with pytest.raises(CheckpointFencedError):
        resumed.save(client, epoch=5, holder="run-b chief")
    assert json.loads((tmp_path / "checkpoint").read_text())["run_id"] == "run-b"
    assert latest_checkpoint(str(tmp_path)) == previous.path


def test_an_older_chiefs_mark_final_after_a_newer_epoch_file_is_fenced(tmp_path: Path) -> None:
    client = _cluster()
    manager = CheckpointManager(str(tmp_path), run_id="run-a")
    older = manager.save(client, epoch=5, holder="old chief")
    _step(client)
    newer = CheckpointManager(str(tmp_path), run_id="run-a").save(client, epoch=7, holder="new chief")
    (tmp_path / "checkpoint").write_text(json.dumps({"latest": Path(older.path).name, "all": [Path(older.path).name],
                                                     "run_id": "run-a", "epoch": 5}))  # a stale chief's late write
    with pytest.raises(CheckpointError):
        manager.mark_final(older.path, epoch=6, holder="old chief")
    assert not read_manifest(older.path).final
    assert latest_checkpoint(str(tmp_path)) == newer.path


def test_a_chief_stopped_inside_its_first_saves_undo_leaves_the_newer_chiefs_pointer(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old chief's first save (no pointer before it) is fenced off after its switch; it stops inside the undo,
    past its check that the pointer names its checkpoint, and a newer chief's final save goes past the mutex. The
    old chief, resumed, removes its epoch file and ``checkpoint``: the newer chief's ``checkpoint`` must come back
    (a missing ``checkpoint`` hides every epoch file: readers warned 'is missing' and guessed from the directory)."""
    client = _cluster()
    armed: list[bool] = []
    successor_saved: list[Any] = []

    def successor_elected(phase: str) -> None:
        if phase == "pointer_switched":
            for channel in client.channels.values():
                channel.call("Fence", {"token": 7, "holder": "new chief"})
            armed.append(True)

    real, old_thread = switch.effective_pointer, threading.current_thread()

    def stopped_after_the_check(directory: str) -> Any:
        seen = real(directory)
        # the undo's check: the old chief stops here, holding the mutex
        if armed and not successor_saved and threading.current_thread() is old_thread:
            _step(client)

            def successor() -> None:
                successor_saved.append(CheckpointManager(str(tmp_path), run_id="run-a").save(
                    client, epoch=7, holder="new chief", final=True))

            thread = threading.Thread(target=successor, daemon=True)
            thread.start()
            thread.join(60)
            assert successor_saved
        return seen

    monkeypatch.setattr(switch, "effective_pointer", stopped_after_the_check)
    old = CheckpointManager(str(tmp_path), run_id="run-a", fault=successor_elected)
    with pytest.raises(CheckpointFencedError):
        old.save(client, epoch=5, holder="old chief")
    new = successor_saved[0]
    assert json.loads((tmp_path / "checkpoint").read_text()) == json.loads((tmp_path / "checkpoint.e7").read_text())
    assert latest_checkpoint(str(tmp_path)) == new.path and read_manifest(new.path).final
