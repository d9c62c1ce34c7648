"""The chief's save waited for at most --save-timeout (psflow.checkpoint.bounded_save): a save stuck in storage is
given up and counted as a failed save, the next one does not begin before the one given up has ended (so that one,
ending late, never writes the pointer after a newer save), and a late failure of the save given up is not counted
twice. A stand-in manager counts; the saves are threads blocked on events, released by the test."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from psflow.checkpoint.bounded_save import BoundedSaves, SaveAbandonedError
from psflow.errors import CheckpointError


class _Manager:
    """Counts failures as CheckpointManager does, and its saves' failures unless ``abandoned``."""

    def __init__(self) -> None:
        self.directory, self.abandoned, self.failed, self.written = "gs://b/ckpt", False, 0, []
        self.lock = threading.Lock()

    def count_failure(self, client: Any, error: BaseException) -> None:
        with self.lock:
            self.failed += 1

    def save(self, name: str, release: threading.Event, fail: bool = False) -> str:
        release.wait(60)
        if fail:
            if not self.abandoned:
                self.count_failure(None, CheckpointError(name))
            raise CheckpointError(f"{name} failed")
        with self.lock:
            self.written.append(name)  # the pointer switched to it
        return name


CLIENT = SimpleNamespace(config=SimpleNamespace(save_timeout=0.3), client_name="/job:worker/task:0")
PATIENT = SimpleNamespace(config=SimpleNamespace(save_timeout=60.0), client_name="/job:worker/task:0")  # never reached


def test_a_stuck_save_is_given_up_counted_and_no_newer_save_begins_before_it_ended() -> None:
    manager = _Manager()
    saves = BoundedSaves(manager)  # type: ignore[arg-type]
    stuck = threading.Event()
    with pytest.raises(SaveAbandonedError, match=r"the checkpoint save into gs://b/ckpt given up: no end within "
                                                 r"--save-timeout \(0.3 s\)"):
        saves.run(CLIENT, "the checkpoint save", lambda _client: manager.save("ckpt-10", stuck))  # type: ignore[arg-type]
    assert manager.failed == 1 and manager.abandoned
    # Still stuck: the next save does not begin (its own call is never made), and is a failed save too.
    began = threading.Event()
    with pytest.raises(SaveAbandonedError, match="not begun: the checkpoint save given up before it has still not"):
        saves.run(CLIENT, "the checkpoint save", lambda _client: began.set())  # type: ignore[arg-type]
    assert manager.failed == 2 and not began.is_set() and manager.written == []
    # The store answers: the save given up ends first, then the newer one; the pointer's last writer is the newer.
    stuck.set()
    assert saves.run(PATIENT, "the checkpoint save", lambda _client: manager.save("ckpt-30", _set())) == "ckpt-30"  # type: ignore[arg-type]
    assert manager.written == ["ckpt-10", "ckpt-30"] and manager.failed == 2 and not manager.abandoned


def test_a_late_failure_of_the_save_given_up_is_not_counted_twice() -> None:
    manager = _Manager()
    saves = BoundedSaves(manager)  # type: ignore[arg-type]
    stuck = threading.Event()
    with pytest.raises(SaveAbandonedError):
        saves.run(CLIENT, "the checkpoint save", lambda _client: manager.save("ckpt-10", stuck, fail=True))  # type: ignore[arg-type]
    stuck.set()  # it fails now, late
    with pytest.raises(CheckpointError, match="ckpt-20 failed"):
        saves.run(PATIENT, "the checkpoint save", lambda _client: manager.save("ckpt-20", _set(), fail=True))  # type: ignore[arg-type]
    assert manager.failed == 2, manager.failed  # the one given up once, the next one once


def _set() -> threading.Event:
    event = threading.Event()
    event.set()
    return event
