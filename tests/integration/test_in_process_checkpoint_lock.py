"""``psflow train --in-process`` holds its checkpoint directory until the launcher's end, not its worker's.

The in-process launcher takes the run's checkpoint-directory lock (``claim_run``) and runs the worker's session
in its own process. The session's release at its end (:class:`~psflow.train.lock_at_end.ReleaseLockAtEnd`) removed
every lock naming this process and run, so the launcher's own lock went with it, before the launcher's end (the
final evaluation, the run's snapshot, metrics.json): another run was let into the directory while this one had
not ended. Now the session releases only a lock its own duties took (``psflow server``, the Python API without a
launcher); a launcher's is the launcher's to release, when it ends.

A fresh process (:func:`support.in_fresh_process`): the run forks its reader.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from support import A9A, in_fresh_process

from psflow.checkpoint.lock import LOCK_NAME, CheckpointDirLock, CheckpointLockedError
from psflow.cluster import ClusterSpec
from psflow.train.config import TrainConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _run_seen_at_its_end(tmp: str) -> dict[str, Any]:
    """In a fresh process: a short in-process run; what its end (on_end, the launcher's last step) saw of the lock,
    and whether the lock is there once the run returned."""
    from psflow.launch.in_process import run_in_process

    ckpt = os.path.join(tmp, "ckpt")
    seen: dict[str, Any] = {}

    def on_end(final: dict[str, Any], cluster: ClusterSpec) -> None:
        seen["phase"] = final["phase"]
        seen["lock_there"] = os.path.exists(os.path.join(ckpt, LOCK_NAME))
        try:  # another run asking for the directory now
            CheckpointDirLock(ckpt, "another-run").acquire()
            seen["another_run"] = "admitted"
        except CheckpointLockedError as e:
            seen["another_run"] = f"refused: {e}"

    config = TrainConfig.flat(train=(str(A9A),), num_features=124, num_ps=1, num_workers=1, max_steps=5,
                              checkpoint_dir=ckpt)
    run_in_process(config, os.path.join(tmp, "run"), on_end=on_end)
    seen["lock_after"] = os.path.exists(os.path.join(ckpt, LOCK_NAME))
    return seen


def test_the_checkpoint_directory_stays_the_runs_until_the_launcher_ends(tmp_path: Path) -> None:
    seen = in_fresh_process(_run_seen_at_its_end, str(tmp_path), limit=100.0)
    assert seen["phase"] == "finished", seen
    assert seen["lock_there"], seen  # the worker's session ended; the launcher had not
    assert seen["another_run"].startswith("refused: checkpoint directory"), seen
    assert not seen["lock_after"], seen  # released by the launcher as it ended
