"""A lock file left by an earlier process of this run that had this process's pid (another boot of this host: the
host's pid namespace is the same at every boot; or a pid reused) is that process's, not this one's: this process
takes it over (:attr:`~psflow.checkpoint.lock.DirectoryLock.took`) and releases it at its session's end.

Review of 85b787d (ReleaseLockAtEnd releases only a lock its own acquire took): ``_is_this_process`` judged a lock by
run id, pid, host and pid namespace alone, so a restarted chief (``psflow server``, same run id) given its
predecessor's pid after a reboot found the predecessor's lock 'this process's already', took nothing, and at its end
left the lock (before 85b787d its end removed it), naming a process of another boot. The lock file records
``boot_id`` and ``pid_start``: a lock recording others is another process's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from psflow.checkpoint.lock import CheckpointDirLock
from psflow.train.lock_at_end import ReleaseLockAtEnd

pytestmark = pytest.mark.timeout(60)


def _left_by_an_earlier_process(directory: Path, **changed: Any) -> CheckpointDirLock:
    earlier = CheckpointDirLock(str(directory), "the-run")
    earlier.acquire()  # written with this process's identity, then made an earlier process's
    holder = earlier.holder()
    assert holder is not None
    holder.update(changed)
    Path(earlier.path).write_text(json.dumps(holder))
    return CheckpointDirLock(str(directory), "the-run")


@pytest.mark.parametrize("changed", [{"boot_id": "an-earlier-boot"}, {"pid_start": 1}],
                         ids=["another_boot", "pid_reused"])
def test_a_lock_of_an_earlier_process_under_this_pid_is_taken_over_and_released(tmp_path: Path,
                                                                                 changed: dict[str, Any]) -> None:
    lock = _left_by_an_earlier_process(tmp_path / "ckpt", **changed)
    lock.acquire()  # the restarted chief, before it joins
    assert lock.took, "the earlier process's lock was taken for this one's"
    holder = lock.holder()
    assert holder is not None and {k: holder[k] for k in changed} != changed  # rewritten as this process's
    session = cast(Any, SimpleNamespace(client=SimpleNamespace(client_name="/job:worker/task:0")))
    ReleaseLockAtEnd(lock).end(session)
    assert not os.path.exists(lock.path)


def test_this_process_s_own_lock_is_still_found_its_own(tmp_path: Path) -> None:
    launcher = CheckpointDirLock(str(tmp_path / "ckpt"), "the-run")
    launcher.acquire()
    worker = CheckpointDirLock(str(tmp_path / "ckpt"), "the-run")  # --in-process: the worker's, in the launcher's process
    worker.acquire()
    assert launcher.took and not worker.took
    session = cast(Any, SimpleNamespace(client=SimpleNamespace(client_name="/job:worker/task:0")))
    ReleaseLockAtEnd(worker).end(session)
    assert os.path.exists(launcher.path)  # the launcher's to release
    assert launcher.release() and not os.path.exists(launcher.path)
