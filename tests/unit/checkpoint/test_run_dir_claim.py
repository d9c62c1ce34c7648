"""One run per run directory (``--output``; issue 25, item 3): the run lock of a checkpoint directory, reused.

tests/integration/test_run_dir_lock.py runs two ``psflow train`` on one ``--output``.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from psflow.checkpoint.lock import (
    LOCK_NAME,
    RUN_LOCK_NAME,
    CheckpointDirLock,
    CheckpointLockedError,
    DirectoryLockError,
    RunDirLock,
    RunDirLockedError,
)
from psflow.train.config import TrainConfig
from psflow.train.duties import claim_run

pytestmark = pytest.mark.timeout(60)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: the pid names no process now
    return proc.pid


def test_a_second_live_run_on_one_run_directory_is_refused_naming_the_first(tmp_path: Path) -> None:
    out = tmp_path / "run"
    with RunDirLock(str(out), "run-a"):
        holder = json.loads((out / RUN_LOCK_NAME).read_text())
        assert (holder["run_id"], holder["pid"], holder["host"]) == ("run-a", os.getpid(), socket.gethostname())
        before = sorted(os.listdir(out))
        with pytest.raises(RunDirLockedError) as refused:
            RunDirLock(str(out), "run-b").acquire()
        message = str(refused.value)
        assert (f"run directory {out} is in use by run run-a (pid {os.getpid()} on {socket.gethostname()}, since "
                in message), message
        assert "this run (run-b) may not write there" in message and "give this run another --output" in message
        assert "\n" not in message
        assert isinstance(refused.value, DirectoryLockError) and not isinstance(refused.value, CheckpointLockedError)
        assert sorted(os.listdir(out)) == before  # the refused run wrote nothing
        assert json.loads((out / RUN_LOCK_NAME).read_text()) == holder
    assert not (out / RUN_LOCK_NAME).exists()  # released on leaving
    with RunDirLock(str(out), "run-b"):  # free again: a directory is reused once its run is over
        assert json.loads((out / RUN_LOCK_NAME).read_text())["run_id"] == "run-b"


def test_a_dead_runs_run_directory_is_taken_over_saying_so(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "run"
    RunDirLock(str(out), "run-a").acquire()
    stale = json.loads((out / RUN_LOCK_NAME).read_text())
    (out / RUN_LOCK_NAME).write_text(json.dumps(dict(stale, pid=_dead_pid())))
    with caplog.at_level(logging.WARNING, logger="psflow.checkpoint"):
        with RunDirLock(str(out), "run-b"):
            assert json.loads((out / RUN_LOCK_NAME).read_text())["run_id"] == "run-b"
    assert "run directory" in caplog.text and "taking over the stale lock of run run-a" in caplog.text
    assert not (out / RUN_LOCK_NAME).exists()


def test_a_nested_claim_of_the_same_run_leaves_the_release_to_the_outer_one(tmp_path: Path) -> None:
    """psflow train takes its run directory, then run_local takes it again (a no-op): leaving run_local
    must not free the directory while the command still writes there."""
    out = tmp_path / "run"
    with RunDirLock(str(out), "run-a"):
        with RunDirLock(str(out), "run-a"):
            pass
        assert json.loads((out / RUN_LOCK_NAME).read_text())["run_id"] == "run-a"
    assert not (out / RUN_LOCK_NAME).exists()


def test_claim_run_takes_both_directories_and_lets_go_of_both(tmp_path: Path) -> None:
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    config, held = claim_run(TrainConfig.flat(checkpoint_dir=str(ckpt)), str(out))
    assert config.run_id
    with held:
        for lock in (out / RUN_LOCK_NAME, ckpt / LOCK_NAME):
            assert json.loads(lock.read_text())["run_id"] == config.run_id
    assert not (out / RUN_LOCK_NAME).exists() and not (ckpt / LOCK_NAME).exists()


def test_claim_run_refused_its_checkpoint_directory_lets_go_of_its_run_directory(tmp_path: Path) -> None:
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    with CheckpointDirLock(str(ckpt), "run-a"):
        with pytest.raises(CheckpointLockedError, match="in use by run run-a"):
            claim_run(TrainConfig.flat(checkpoint_dir=str(ckpt), run_id="run-b"), str(out))
        assert not (out / RUN_LOCK_NAME).exists()
    # and a refused run directory takes no checkpoint directory
    with RunDirLock(str(out), "run-a"):
        with pytest.raises(RunDirLockedError, match="in use by run run-a"):
            claim_run(TrainConfig.flat(checkpoint_dir=str(ckpt), run_id="run-b"), str(out))
    assert not (ckpt / LOCK_NAME).exists()
