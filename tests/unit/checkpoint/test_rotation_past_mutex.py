"""Rotation by a chief past a checkpoint directory mutex kept by a stopped chief, and the ``.creating-*`` leftovers of
chiefs killed past it (:mod:`psflow.checkpoint.rotation`, :mod:`psflow.checkpoint.leftovers`).

Before, a chief with a lease epoch that went past the mutex rotated nothing ('old checkpoints not rotated'): with the
holder stopped for good, every save added a checkpoint. It now deletes, past the mutex, only complete checkpoints of
its own run and lineage written at its epoch or an older one, outside what it keeps and not named by any pointer
file. A ``.creating-*`` directory is removed only when its writer is certainly gone (same host, boot and pid
namespace; its pid gone or reused), or, under the mutex, written by an older epoch of the saving run.

Real in-process ps services (no sockets); a blocked thread holds the real ``flock`` (per open file: a thread of this
process is another holder); dead writers are child processes this test started and ended.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_pointer_epochs import _cluster, _step

from psflow import storage
from psflow.checkpoint import lock, switch
from psflow.checkpoint.holder import boot_id, pid_namespace, pid_start
from psflow.checkpoint.leftovers import remove_creating
from psflow.checkpoint.lock import directory_mutex
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointFencedError, CheckpointManager

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _short_mutex_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock, "MUTEX_TIMEOUT", 0.5)


@pytest.fixture
def held_mutex(tmp_path: Path) -> Iterator[threading.Event]:
    """A thread holds ``tmp_path``'s mutex (a chief stopped inside it) until the event is set."""
    release, taken = threading.Event(), threading.Event()

    def hold() -> None:
        with directory_mutex(str(tmp_path)):
            taken.set()
            release.wait(90)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert taken.wait(30)
    yield release
    release.set()
    thread.join(30)


def _checkpoints(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("ckpt-"))


def _copy(template: str, directory: Path, name: str, **run: Any) -> str:
    """A copy of checkpoint ``template`` named ``name``, its manifest's and writer file's run fields set to ``run``
    (``run_id``, ``epoch``; ``lineage``, ``global_step`` in the manifest)."""
    target = directory / name
    shutil.copytree(template, target)
    manifest = json.loads((target / "manifest.json").read_text())
    writer = json.loads((target / "writer.json").read_text())
    for key in ("run_id", "epoch"):
        if key in run:
            manifest["run"][key] = writer[key] = run[key]
    for key in ("lineage", "global_step"):
        if key in run:
            manifest[key] = run[key]
    if "lineage" in run:
        writer["lineage"] = run["lineage"]
    (target / "manifest.json").write_text(json.dumps(manifest))
    (target / "writer.json").write_text(json.dumps(writer))
    return name


def test_saves_past_a_held_mutex_keep_max_to_keep(tmp_path: Path, held_mutex: threading.Event) -> None:
    """The holder never lets go: 6 saves of an epoch chief with max_to_keep=2 leave 2 checkpoints (before: 6)."""
    client = _cluster()
    manager = CheckpointManager(str(tmp_path), run_id="run-a", max_to_keep=2)
    saved = []
    for _ in range(6):
        saved.append(manager.save(client, epoch=7, holder="new chief"))
        _step(client)
    assert _checkpoints(tmp_path) == sorted(Path(s.path).name for s in saved[-2:])
    assert latest_checkpoint(str(tmp_path)) == saved[-1].path


def test_rotation_past_the_mutex_deletes_only_its_own_runs_older_unnamed_checkpoints(tmp_path: Path) -> None:
    """Past the mutex (max_to_keep=1): this run's and lineage's older checkpoint, written at an older epoch, goes;
    another run's, another lineage's, a newer epoch's, those named by older epochs' pointer files (the first save's
    ``checkpoint.e3``, and ``checkpoint.e5``), one without a writing epoch, and an incomplete one of a live writer
    stay."""
    client = _cluster()
    first = CheckpointManager(str(tmp_path), run_id="run-a").save(client, epoch=3, holder="old chief")
    lineage = json.loads((Path(first.path) / "manifest.json").read_text())["lineage"]
    older = _copy(first.path, tmp_path, "ckpt-000000000-1", run_id="run-a", epoch=3)
    other_run = _copy(first.path, tmp_path, "ckpt-000000000-2", run_id="run-b", epoch=3)
    other_lineage = _copy(first.path, tmp_path, "ckpt-000000000-3", run_id="run-a", epoch=3, lineage="lineage-x")
    newer_epoch = _copy(first.path, tmp_path, "ckpt-000000000-4", run_id="run-a", epoch=9)
    named = _copy(first.path, tmp_path, "ckpt-000000000-5", run_id="run-a", epoch=5)
    unfenced = _copy(first.path, tmp_path, "ckpt-000000000-6", run_id="run-a", epoch=None)
    (tmp_path / "checkpoint.e5").write_text(json.dumps({"latest": named, "all": [named], "run_id": "run-a",
                                                        "epoch": 5, "lineage": lineage}))
    in_progress = tmp_path / "ckpt-000000000-7"
    in_progress.mkdir()
    (in_progress / "writer.json").write_text(json.dumps({"run_id": "run-a", "lineage": lineage, "epoch": 3,
                                                         **_identity(os.getpid())}))
    _step(client)
    stopped, taken = threading.Event(), threading.Event()
    holder = threading.Thread(target=_hold, args=(tmp_path, taken, stopped), daemon=True)
    holder.start()
    assert taken.wait(30)
    try:
        new = CheckpointManager(str(tmp_path), run_id="run-a", max_to_keep=1).save(client, epoch=7, holder="new")
    finally:
        stopped.set()
        holder.join(30)
    left = _checkpoints(tmp_path)
    assert older not in left, left
    assert set(left) == {Path(first.path).name, other_run, other_lineage, newer_epoch, named, unfenced, in_progress.name,
                         Path(new.path).name}, left


def _hold(directory: Path, taken: threading.Event, stop: threading.Event) -> None:
    with directory_mutex(str(directory)):
        taken.set()
        stop.wait(90)


def test_past_the_mutex_a_kept_increments_bases_stay(tmp_path: Path, held_mutex: threading.Event) -> None:
    client = _cluster()
    manager = CheckpointManager(str(tmp_path), run_id="run-a", max_to_keep=1, full_every=3)
    chain = []
    for _ in range(3):  # a full checkpoint and two increments: the newest keeps the two before it
        chain.append(Path(manager.save(client, epoch=7, holder="new chief").path).name)
        _step(client)
    assert _checkpoints(tmp_path) == sorted(chain)
    full = Path(manager.save(client, epoch=7, holder="new chief").path).name
    assert _checkpoints(tmp_path) == [full]


def _identity(pid: int, **changes: Any) -> dict[str, Any]:
    """What a writer file records of process ``pid`` on this host."""
    return {"host": socket.gethostname(), "pid": pid, "pid_start": pid_start(pid), "boot_id": boot_id(),
            "pid_ns": pid_namespace(), **changes}


def _dead_process() -> dict[str, Any]:
    """The identity of a child process that was started, recorded, and ended."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = _identity(child.pid)
    finally:
        child.kill()
        child.wait(30)
    return identity


def _creating(directory: Path, name: str, **writer: Any) -> str:
    path = directory / f".creating-{name}"
    path.mkdir()
    if writer:
        (path / "writer.json").write_text(json.dumps(writer))
    return path.name


def _leftovers(directory: Path) -> set[str]:
    return {p.name for p in directory.iterdir() if p.name.startswith(".creating-")}


@pytest.fixture
def creating(tmp_path: Path) -> dict[str, str]:
    """``.creating-*`` directories of writers of run-a (epoch 5 unless said) and their names by case."""
    dead, live = _dead_process(), _identity(os.getpid())
    base = {"run_id": "run-a", "lineage": "run-a", "epoch": 5}
    return {
        "dead": _creating(tmp_path, "dead", **base, **dead),
        "dead_newer": _creating(tmp_path, "dead-newer", **dict(base, epoch=9), **dead),
        "dead_other_run": _creating(tmp_path, "dead-other-run", **dict(base, run_id="run-b"), **dead),
        "live": _creating(tmp_path, "live", **base, **live),
        "live_newer": _creating(tmp_path, "live-newer", **dict(base, epoch=9), **live),
        "elsewhere_newer": _creating(tmp_path, "elsewhere-newer", **dict(base, epoch=9), **dict(dead, host="node-x")),
        "elsewhere_other_run": _creating(tmp_path, "elsewhere-other-run", **dict(base, run_id="run-b"),
                                         **dict(dead, host="node-x")),
        "elsewhere": _creating(tmp_path, "elsewhere", **base, **dict(dead, host="node-x")),
        "other_boot": _creating(tmp_path, "other-boot", **base, **dict(dead, boot_id="another-boot")),
        "no_start": _creating(tmp_path, "no-start", **base, **dict(dead, pid_start=None)),
        "empty": _creating(tmp_path, "empty"),
    }


def test_creating_leftovers_past_the_mutex_go_only_when_their_writer_is_certainly_gone(
        tmp_path: Path, creating: dict[str, str], held_mutex: threading.Event) -> None:
    client = _cluster()
    CheckpointManager(str(tmp_path), run_id="run-a").save(client, epoch=7, holder="new chief")
    gone = {creating[k] for k in ("dead", "dead_newer", "dead_other_run")}
    assert _leftovers(tmp_path) == set(creating.values()) - gone


def test_creating_leftovers_under_the_mutex_go_when_gone_or_of_an_older_epoch_of_the_run(
        tmp_path: Path, creating: dict[str, str]) -> None:
    client = _cluster()
    CheckpointManager(str(tmp_path), run_id="run-a").save(client, epoch=7, holder="chief")
    gone = {creating[k] for k in ("dead", "dead_newer", "dead_other_run", "live", "elsewhere", "other_boot",
                                  "no_start")}
    assert _leftovers(tmp_path) == set(creating.values()) - gone


def test_an_unfenced_save_under_the_mutex_removes_only_leftovers_of_gone_writers(
        tmp_path: Path, creating: dict[str, str]) -> None:
    client = _cluster()
    CheckpointManager(str(tmp_path), run_id="run-a").save(client)
    gone = {creating[k] for k in ("dead", "dead_newer", "dead_other_run")}
    assert _leftovers(tmp_path) == set(creating.values()) - gone


def test_an_incomplete_checkpoint_of_a_gone_writer_goes_past_the_mutex(
        tmp_path: Path, held_mutex: threading.Event) -> None:
    client = _cluster()
    base = {"run_id": "run-a", "lineage": "run-a", "epoch": 5}
    dead = tmp_path / "ckpt-000000000-1"
    live = tmp_path / "ckpt-000000000-2"
    for path, who in ((dead, _dead_process()), (live, _identity(os.getpid()))):
        path.mkdir()
        (path / "writer.json").write_text(json.dumps({**base, **who}))
    saved = CheckpointManager(str(tmp_path), run_id="run-a").save(client, epoch=7, holder="new chief")
    assert _checkpoints(tmp_path) == sorted([live.name, Path(saved.path).name])


def test_a_checkpoint_rotated_away_before_its_older_chiefs_switch_is_reported_fenced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The old chief (epoch 5) stops inside its switch, after its fence check, its checkpoint complete but not yet
    current; a newer chief (epoch 7, max_to_keep=1) saves past the mutex and rotates that checkpoint away. The old
    chief, resumed, finds it gone: fenced off by the newer epoch's pointer, not a failed save."""
    client = _cluster()
    stopped, resume = threading.Event(), threading.Event()
    old_thread: list[threading.Thread] = []
    real = switch.is_complete

    def stalled(path: str) -> bool:
        if old_thread and threading.current_thread() is old_thread[0] and not stopped.is_set():
            stopped.set()
            resume.wait(60)
        return real(path)

    monkeypatch.setattr(switch, "is_complete", stalled)
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
    try:
        for channel in client.channels.values():  # a newer chief was elected: the ps tasks hold its epoch
            channel.call("Fence", {"token": 7, "holder": "new chief"})
        _step(client)
        new = CheckpointManager(str(tmp_path), run_id="run-a", max_to_keep=1).save(client, epoch=7, holder="new chief")
        assert _checkpoints(tmp_path) == [Path(new.path).name]  # the old chief's checkpoint rotated away
    finally:
        resume.set()
        old_thread[0].join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], CheckpointFencedError), outcome
    assert old.failed_in_a_row == 0
    assert latest_checkpoint(str(tmp_path)) == new.path


def test_a_deposed_chief_whose_creating_directory_a_newer_chief_takes_is_fenced_not_failed(
        tmp_path: Path, held_mutex: threading.Event, monkeypatch: pytest.MonkeyPatch) -> None:
    """The deposed chief (epoch 5, alive) went past the mutex and wrote its ``.creating-*`` writer file; before its
    rename, a save of the newer chief (epoch 7) under the mutex takes the directory away (an older epoch's). The
    deposed chief's save is fenced off (CheckpointFencedError, not counted): before, its rename's OSError was a
    failed save, counted (at --max-failed-saves, or its final save, the deposed worker failed the run)."""
    client = _cluster()
    real, taken = storage.rename_dir, []

    def newer_chief_first(path: str, target: str) -> None:
        if not taken:  # the deposed chief's rename: the newer chief's save (under the mutex) takes it first
            taken.append(path)
            assert remove_creating(str(tmp_path), "run-a", 7, held=True) == {os.path.basename(path)}
        real(path, target)

    monkeypatch.setattr(storage, "rename_dir", newer_chief_first)
    deposed = CheckpointManager(str(tmp_path), run_id="run-a")
    with pytest.raises(CheckpointFencedError, match="newer epoch"):
        deposed.save(client, epoch=5, holder="deposed chief")
    assert (deposed.saves_failed, deposed.failed_in_a_row) == (0, 0)
    assert _leftovers(tmp_path) == set() and _checkpoints(tmp_path) == []
