"""A launcher's release of the run's checkpoint lock ends within its bound (psflow.checkpoint.lock_release): a
store that stopped answering kept ``psflow train`` from ever exiting. Here the release is held up for real: another
open file of the directory holds its flock (the mutex every release takes), as a stopped store holds every call."""

from __future__ import annotations

import fcntl
import io
import os
import threading
from pathlib import Path

import pytest
from support import wait_until

from psflow.checkpoint.lock import LOCK_NAME, CheckpointDirLock
from psflow.checkpoint.lock_release import BoundedRelease, LockNotReleasedError


class _Console(io.StringIO):
    """The launcher's console: ``written`` is set at the first thing printed."""

    def __init__(self) -> None:
        super().__init__()
        self.written = threading.Event()

    def write(self, text: str) -> int:
        count = super().write(text)
        self.written.set()
        return count


def test_a_release_in_time_removes_the_lock_and_prints_nothing(tmp_path: Path) -> None:
    lock = CheckpointDirLock(str(tmp_path), "run-a")
    out = _Console()
    with BoundedRelease(lock.__enter__(), timeout=60, out=out, notice_after=60):
        assert (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / LOCK_NAME).exists()
    assert out.getvalue() == ""


def test_a_release_still_waiting_after_a_few_seconds_says_so_and_for_how_long(tmp_path: Path) -> None:
    """A store that stopped answering kept ``psflow train`` silent for up to the whole bound (60 s) at the end of a
    failed run. The release here is held up until the console has a line: it ends only once that line is printed
    (no line: held until the test's safety net, 120 s, past the 60 s bound, and the block raises)."""
    lock = CheckpointDirLock(str(tmp_path), "run-a").__enter__()
    out = _Console()

    def release() -> None:
        out.written.wait(120)  # the store's answer, which comes only once the user was told of the wait
        lock.release()

    with BoundedRelease(lock, out=out, release=release, notice_after=0.2):
        pass
    assert out.getvalue() == f"psflow: releasing the lock {tmp_path / LOCK_NAME}: waiting up to 60 s for the store...\n"
    assert not (tmp_path / LOCK_NAME).exists()


def test_a_release_held_up_past_its_bound_is_named_and_fails_a_run_that_had_succeeded(tmp_path: Path) -> None:
    lock = CheckpointDirLock(str(tmp_path), "run-a").__enter__()
    holder = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)  # the directory's mutex, held: the release waits for it
    try:
        with pytest.raises(LockNotReleasedError, match=f"could not release the lock {tmp_path / LOCK_NAME} of "
                                                       f"checkpoint directory {tmp_path}: no answer within 0.5 s"):
            with BoundedRelease(lock, timeout=0.5):
                pass
    finally:
        os.close(holder)  # the abandoned release then ends on its own
    wait_until(lambda: not (tmp_path / LOCK_NAME).exists(), "the abandoned release's end")


def test_a_failed_run_keeps_its_own_error_and_the_lock_left_behind_is_printed(tmp_path: Path) -> None:
    lock = CheckpointDirLock(str(tmp_path), "run-a").__enter__()
    holder = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    out = io.StringIO()
    try:
        with pytest.raises(RuntimeError, match="the run's own failure"):
            with BoundedRelease(lock, timeout=0.5, out=out):
                raise RuntimeError("the run's own failure")
    finally:
        os.close(holder)
    assert out.getvalue().startswith(f"psflow: could not release the lock {tmp_path / LOCK_NAME} ")
    assert out.getvalue().count("\n") == 1
    wait_until(lambda: not (tmp_path / LOCK_NAME).exists(), "the abandoned release's end")


def test_a_chief_workers_own_release_at_its_sessions_end_is_bounded_too(tmp_path: Path) -> None:
    """``psflow server``'s chief took the lock itself (no launcher) and releases it when its session ends: held up,
    that release kept the process from ever exiting; now its session ends on the one line naming the lock."""
    from psflow.train.lock_at_end import ReleaseLockAtEnd

    lock = CheckpointDirLock(str(tmp_path), "run-a")
    lock.acquire()
    holder = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with pytest.raises(LockNotReleasedError, match=f"could not release the lock {tmp_path / LOCK_NAME} of "
                                                       f"checkpoint directory {tmp_path}: no answer within 0.5 s"):
            ReleaseLockAtEnd(lock, timeout=0.5).end(None)  # type: ignore[arg-type]  # (the session is not used)
    finally:
        os.close(holder)
    wait_until(lambda: not (tmp_path / LOCK_NAME).exists(), "the abandoned release's end")
    ReleaseLockAtEnd(lock).end(None)  # type: ignore[arg-type]  # released already: nothing to do, in time
