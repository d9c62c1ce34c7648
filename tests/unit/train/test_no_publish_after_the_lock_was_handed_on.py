"""A save given up at --save-timeout that goes on after its process released the run's lock at its exit never makes
its checkpoint current: another run may hold the directory by then.

Task D1: :class:`psflow.train.lock_at_end._ReleaseAfterSave` releases the lock as the process exits while the
given-up save's thread still lives (a daemon: it dies only at the interpreter's end). In that window the save could
still switch the pointer after another run took the directory: that run's model replaced by this run's late save.
Now the exit closes the manager's publishing (:class:`psflow.checkpoint.publish_checks.PublishGate`) before the
release, and a save asks it under the directory's mutex, just before its pointer's write.

A fresh interpreter (a subprocess: the exit functions run as a real process's do), in-process ps services
(tests/two_ps_in_process.py), make_session's hooks ended as a session ends them; the final save's real work held
after its manifest (its ``manifest_written`` phase) until the test lets it go. An exit function registered before
the session's (they run last registered first, so after the release) holds the exit: the window between the
release and the interpreter's end, widened. Meanwhile this test's process (another run) takes the lock, then lets
the save go on and reads the pointer.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from psflow.checkpoint.lock import CheckpointDirLock
from psflow.checkpoint.pointer import latest_checkpoint

pytestmark = pytest.mark.timeout(120)

_TESTS = str(Path(__file__).resolve().parents[2])

_WORKER = """
import atexit, dataclasses, os, sys, threading
sys.path.insert(0, sys.argv[2])
from two_ps_in_process import chief_duties, train_a_step
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager, FinalCheckpointError

ckpt = sys.argv[1]
lock_file = os.path.join(ckpt, "checkpoint.lock")
held, let_go, save_ended = threading.Event(), threading.Event(), threading.Event()


def phase(self, name):  # the final save, past its manifest: held until the test lets it go
    if name == "manifest_written" and armed:
        held.set()
        let_go.wait(60)


def save(self, *args, **kwargs):
    try:
        return real_save(self, *args, **kwargs)
    finally:
        if armed:
            save_ended.set()


def at_the_end():  # registered first: runs after the session's exit function released the lock
    print("lock released at exit:", not os.path.exists(lock_file), flush=True)
    print("waiting for the next run", flush=True)
    sys.stdin.readline()  # the test's process took the directory
    let_go.set()
    print("save ended:", save_ended.wait(60), flush=True)


atexit.register(at_the_end)
armed = False
real_save = CheckpointManager.save
CheckpointManager._phase, CheckpointManager.save = phase, save
client, made = chief_duties(ckpt)
print("initial checkpoint:", latest_checkpoint(ckpt), flush=True)
client.config = dataclasses.replace(client.config, save_timeout=0.5)  # (after the initial save)
train_a_step(client)
armed = True
try:
    made.__exit__(None, None, None)
except FinalCheckpointError as e:
    print("final checkpoint failed:", e, flush=True)
print("save held past its manifest:", held.is_set(), flush=True)
print("lock kept while the save runs:", os.path.exists(lock_file), flush=True)
sys.exit(1)  # the worker fails on its final checkpoint
"""


def test_a_given_up_save_does_not_publish_after_the_lock_was_released_at_exit(tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    child = subprocess.Popen([sys.executable, "-c", _WORKER, ckpt, _TESTS], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        assert child.stdout is not None and child.stdin is not None
        seen: list[str] = []
        for line in child.stdout:
            seen.append(line)
            if line.startswith("waiting for the next run"):
                break
        out = "".join(seen)
        assert "waiting for the next run" in out, out + (child.stderr.read() if child.stderr else "")
        assert "final checkpoint failed:" in out and "given up" in out, out
        assert "save held past its manifest: True" in out and "lock kept while the save runs: True" in out, out
        assert "lock released at exit: True" in out, out
        before = latest_checkpoint(ckpt)
        assert before is not None and f"initial checkpoint: {before}" in out, out
        CheckpointDirLock(ckpt, "the-next-run").acquire()  # another run (this process) takes the directory
        child.stdin.write("taken\n")
        child.stdin.flush()
        rest, err = child.communicate(timeout=90)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(timeout=30)
    assert child.returncode == 1, err
    assert "save ended: True" in rest, rest + err
    assert latest_checkpoint(ckpt) == before, err  # before: the late final save's checkpoint made current
    holder = CheckpointDirLock(ckpt, "the-next-run").holder()
    assert holder is not None and holder["run_id"] == "the-next-run", holder
    assert "not made current" in err and "the process exits" in err, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
