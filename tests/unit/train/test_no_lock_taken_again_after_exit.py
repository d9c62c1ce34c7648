"""A save given up at --save-timeout before it took the run's lock never takes it again after its process released
it at its exit: the lock file it wrote would name a process gone a moment later, refused to a run on another host
until deleted by hand.

Review of e89a7a5 (R_D): :class:`psflow.train.lock_at_end._ReleaseAfterSave` closes the manager's publishing, then
releases the lock as the process exits, while the given-up save's thread (a daemon) lives on until the interpreter's
end. A save held before its first step (:meth:`CheckpointManager._save` acquires the lock first: "may be called
before every write") went on after the release, found no lock and wrote one for this process; its pointer switch was
refused (the gate), but the lock file stayed, naming the exited process. Now the acquisition asks the manager's
:class:`~psflow.checkpoint.publish_checks.PublishGate` under the directory's mutex (the release takes it too): a
save not begun when the lock was released at exit is refused before it writes anything.

The set-up of test_no_publish_after_the_lock_was_handed_on.py: a fresh interpreter (exit functions run as a real
process's do), in-process ps services, make_session's hooks; here the final save is held at its very start, and the
exit function registered first (run last, after the release) lets it go and waits for its end.
"""

from __future__ import annotations

import os
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
real_save = CheckpointManager._save


def save(self, *args, **kwargs):  # the final save, held before its first step (its lock's acquisition)
    if not armed:
        return real_save(self, *args, **kwargs)
    held.set()
    let_go.wait(60)
    try:
        return real_save(self, *args, **kwargs)
    finally:
        save_ended.set()


def at_the_end():  # registered first: runs after the session's exit function released the lock
    print("lock released at exit:", not os.path.exists(lock_file), flush=True)
    let_go.set()
    print("save ended:", save_ended.wait(60), flush=True)
    print("lock file after the save:", os.path.exists(lock_file), flush=True)


atexit.register(at_the_end)
armed = False
CheckpointManager._save = save
client, made = chief_duties(ckpt)
print("initial checkpoint:", latest_checkpoint(ckpt), flush=True)
client.config = dataclasses.replace(client.config, save_timeout=0.5)  # (after the initial save)
train_a_step(client)
armed = True
try:
    made.__exit__(None, None, None)
except FinalCheckpointError as e:
    print("final checkpoint failed:", e, flush=True)
print("save held before its first step:", held.is_set(), flush=True)
print("lock kept while the save runs:", os.path.exists(lock_file), flush=True)
sys.exit(1)  # the worker fails on its final checkpoint
"""


def test_a_given_up_save_does_not_take_the_lock_again_after_it_was_released_at_exit(tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    child = subprocess.run([sys.executable, "-c", _WORKER, ckpt, _TESTS], capture_output=True, text=True,
                           cwd=str(tmp_path), timeout=90)
    out, err = child.stdout, child.stderr
    assert child.returncode == 1, out + err
    assert "final checkpoint failed:" in out and "given up" in out, out + err
    assert "save held before its first step: True" in out and "lock kept while the save runs: True" in out, out
    assert "lock released at exit: True" in out and "save ended: True" in out, out + err
    before = out.split("initial checkpoint: ", 1)[1].splitlines()[0]
    assert latest_checkpoint(ckpt) == before, err  # (the gate: nothing made current after the release)
    # before: the save wrote a lock file naming the child, gone now (another host's run is refused until deleted)
    assert "lock file after the save: False" in out, out + err
    assert CheckpointDirLock(ckpt, "the-next-run").holder() is None, err
    assert not [n for n in os.listdir(ckpt) if n.startswith("ckpt-") and os.path.join(ckpt, n) != before], \
        os.listdir(ckpt)  # nothing begun: no directory of the refused save left behind
    assert "failed late: checkpoint" in err and "save not begun: the process exits" in err, err
    assert "Traceback" not in err and "Exception ignored" not in err, err
