"""``--in-process`` (and :func:`psflow.launch.in_process.run_in_process`, the Python API): a final save given up at
--save-timeout never makes its checkpoint current after the launcher released the run's lock.

Review of e89a7a5 (R_D): the publish gate closed as a ``psflow server`` process exits (:mod:`psflow.train.
lock_at_end`) is never closed in an in-process run: there the launcher holds the lock (``claim_run``), the worker's
session leaves its release to it, and the launcher released it at its end with the given-up save's thread still
running in the same process. The save then switched the pointer whenever it ended: the next run's directory (an
API caller's next run in the same process, or another process's once ``psflow train`` exited) got this run's late
checkpoint as its newest. Now a release of the run's lock (:class:`psflow.checkpoint.lock_release.BoundedRelease`)
first closes the publishing of this process's saves still running into its directory (:func:`psflow.checkpoint.
bounded_save.close_given_up`): one past its gate holds the directory's mutex, which the release waits for; any
other is refused.

A fresh process (:func:`support.in_fresh_process`: the run forks its reader); the final save is held past its
manifest until the case lets it go, after another run took the directory.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from support import A9A, in_fresh_process

from psflow.checkpoint.lock import CheckpointDirLock
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.train.config import TrainConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def _late_final_save(tmp: str) -> dict[str, Any]:
    import psflow.launch.in_process as in_process
    from psflow.checkpoint.save import CheckpointManager

    ckpt = os.path.join(tmp, "ckpt")
    held, let_go, ended = threading.Event(), threading.Event(), threading.Event()
    final_thread: list[int] = []
    real_save, real_phase = CheckpointManager.save, CheckpointManager._phase

    def save(self: CheckpointManager, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("final"):
            final_thread.append(threading.get_ident())
        try:
            return real_save(self, *args, **kwargs)
        finally:
            if kwargs.get("final"):
                ended.set()

    def phase(self: CheckpointManager, name: str) -> None:
        if name == "manifest_written" and threading.get_ident() in final_thread:
            held.set()
            let_go.wait(60)
        real_phase(self, name)

    CheckpointManager.save, CheckpointManager._phase = save, phase  # type: ignore[method-assign]
    seen: dict[str, Any] = {}
    config = TrainConfig.flat(train=(str(A9A),), num_features=124, num_ps=1, num_workers=1, max_steps=5,
                              checkpoint_dir=ckpt, save_timeout=5.0)
    try:
        in_process.run_in_process(config, os.path.join(tmp, "run"))
        seen["run"] = "finished"
    except Exception as e:  # noqa: BLE001 - the final checkpoint given up fails the run
        seen["run"] = f"{type(e).__name__}: {e}"
    seen["held"], seen["before"] = held.is_set(), latest_checkpoint(ckpt)
    CheckpointDirLock(ckpt, "the-next-run").acquire()  # another run takes the directory
    let_go.set()
    seen["ended"] = ended.wait(60)
    seen["after"] = latest_checkpoint(ckpt)
    seen["holder"] = (CheckpointDirLock(ckpt, "the-next-run").holder() or {}).get("run_id")
    return seen


def test_a_given_up_final_save_does_not_publish_after_the_launcher_released_the_lock(tmp_path: Path) -> None:
    seen = in_fresh_process(_late_final_save, str(tmp_path), limit=140.0)
    assert seen["held"] and seen["ended"], seen
    assert "given up" in seen["run"], seen
    assert seen["before"] is not None, seen
    assert seen["after"] == seen["before"], seen  # before: the late final save made current in the next run's dir
    assert seen["holder"] == "the-next-run", seen
