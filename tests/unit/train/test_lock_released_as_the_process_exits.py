"""A process that exits while the checkpoint save it gave up at --save-timeout still runs releases the run's
checkpoint-directory lock as it exits: the save ends with it, and nothing is left for a later run to wait on.

Review of fcba9d6 (the release of the lock waits, in a daemon thread, for a save given up at --save-timeout): a
worker without a launcher (``psflow server``; the lock is its own) whose final save was given up (a store that
stopped answering) fails with FinalCheckpointError and exits; the daemon thread died with the process, before the
save ended, and the lock stayed naming a process gone. A later run on this host took it over with a WARNING ('taking
over the stale lock ... whose process is gone'); one on another host or container (a rerun's new pods) was refused
until the file was deleted by hand, the case 3f97d23 fixed. The save, a daemon thread too, ends with the process:
the lock is now released as it exits (one WARNING), unless the save ended first (then released then).

Review of 85b787d: its exit function started a thread for the bounded release; Python 3.12 refuses to start one
during interpreter shutdown (RuntimeError "can't create new thread at interpreter shutdown", from the exit
function), and the lock stayed. The release now runs on a thread started as the save was given up, which the exit
function wakes and waits for. ``refused``: Python 3.12's refusal, made here by an exit function that runs first
(they run last registered first) and makes every thread's start raise it (a real 3.12 refuses by itself).

A fresh interpreter (a subprocess: multiprocessing's children skip the exit functions), in-process ps services
(tests/two_ps_in_process.py), make_session's hooks ended as a session ends them, the manager's save held (never let
go, but in ``ended_first``: let go before the exit, the lock released then, nothing left for the exit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from psflow.checkpoint.lock import CheckpointDirLock

pytestmark = pytest.mark.timeout(120)

_TESTS = str(Path(__file__).resolve().parents[2])

_WORKER = """
import atexit, dataclasses, os, sys, threading, time
sys.path.insert(0, sys.argv[2])
from two_ps_in_process import chief_duties, train_a_step
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager, FinalCheckpointError

ckpt = sys.argv[1]
client, made = chief_duties(ckpt)
print("initial checkpoint written:", latest_checkpoint(ckpt) is not None, flush=True)
client.config = dataclasses.replace(client.config, save_timeout=0.5)  # (after the initial save: under load it took
# over 0.5 s, was given up too, and the lock was held for it, not for the final save)
train_a_step(client)
let_go = threading.Event()
CheckpointManager.save = lambda *args, **kwargs: let_go.wait()  # a store that stopped answering
try:
    made.__exit__(None, None, None)
except FinalCheckpointError as e:
    print("final checkpoint failed:", e, flush=True)
print("lock kept while the save runs:", os.path.exists(os.path.join(ckpt, "checkpoint.lock")), flush=True)
if sys.argv[3] == "refused":
    def refuse(*args, **kwargs):
        raise RuntimeError("can't create new thread at interpreter shutdown")

    atexit.register(lambda: setattr(threading.Thread, "start", refuse))  # (runs before the hooks' exit function)
elif sys.argv[3] == "ended_first":
    let_go.set()
    deadline = time.monotonic() + 30
    while os.path.exists(os.path.join(ckpt, "checkpoint.lock")):
        assert time.monotonic() < deadline, "the lock not released after the given-up save ended"
        time.sleep(0.02)
    print("released once the save ended", flush=True)
sys.exit(1)  # the worker fails on its final checkpoint
"""


@pytest.mark.parametrize("case", ["as_is", "refused", "ended_first"])
def test_the_lock_is_released_as_the_process_exits_with_the_given_up_save(tmp_path: Path, case: str) -> None:
    ckpt = str(tmp_path / "ckpt")
    done = subprocess.run([sys.executable, "-c", _WORKER, ckpt, _TESTS, case], capture_output=True, text=True,
                          timeout=100, cwd=str(tmp_path))
    assert done.returncode == 1, done.stderr
    assert "initial checkpoint written: True" in done.stdout, done.stdout + done.stderr  # (only the final save given up)
    assert "final checkpoint failed:" in done.stdout and "given up" in done.stdout, done.stdout
    assert "lock kept while the save runs: True" in done.stdout, done.stdout
    assert not os.path.exists(os.path.join(ckpt, "checkpoint.lock")), done.stderr  # before: left, naming a pid gone
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    at_exit = "the process exits while a checkpoint save given up"
    if case == "ended_first":
        assert "released once the save ended" in done.stdout, done.stdout + done.stderr
        assert at_exit not in done.stderr, done.stderr  # (its exit function unregistered, or it did nothing)
    else:
        assert at_exit in done.stderr and "checkpoint.lock" in done.stderr, done.stderr
    CheckpointDirLock(ckpt, "the-next-run").acquire()
