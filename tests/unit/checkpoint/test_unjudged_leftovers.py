"""A crashed save's ``ckpt-*`` whose writer nothing here can judge (another host, another boot id, a writer file of
an older psflow without a field) goes once the run is past it: :data:`~psflow.checkpoint.leftovers.BEHIND_BY`
complete checkpoints of its lineage hold a global_step above the step it was named at, if it is another run's or an
older epoch's (:func:`~psflow.checkpoint.leftovers.left_behind`). Before, a save past the directory's mutex (its holder stopped
for good) removed only a leftover whose writer is certainly gone, so such a one stayed for ever. Under the mutex a
leftover of the run or lineage goes whoever wrote it (unchanged). Real in-process ps services, as
test_rotation_past_mutex."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from test_pointer_epochs import _cluster, _step
from test_rotation_past_mutex import _checkpoints, _dead_process, _identity, _short_mutex_wait, held_mutex

from psflow.checkpoint.leftovers import BEHIND_BY
from psflow.checkpoint.save import CheckpointManager

pytestmark = pytest.mark.timeout(120)

__all__ = ["_short_mutex_wait", "held_mutex"]  # fixtures, used by name


def _leftover(directory: Path, name: str, **writer: Any) -> str:
    (directory / name).mkdir()
    (directory / name / "writer.json").write_text(json.dumps({"run_id": "run-a", "lineage": "run-a", "epoch": 5,
                                                               **writer}))
    return name


def test_an_unjudged_writers_leftover_goes_past_the_mutex_once_the_run_is_past_it(
        tmp_path: Path, held_mutex: threading.Event) -> None:
    dead = _dead_process()
    unjudged = {
        _leftover(tmp_path, "ckpt-000000000-1", **dict(dead, boot_id="another-boot")),
        _leftover(tmp_path, "ckpt-000000000-2", **dict(dead, host="node-x")),
        _leftover(tmp_path, "ckpt-000000000-3", **dict(dead, pid_start=None)),  # an older psflow's writer file
        _leftover(tmp_path, "ckpt-000000000-8", **dict(dead, host="node-x", run_id="run-0", epoch=12)),  # another run
    }
    kept = {
        _leftover(tmp_path, "ckpt-000000002-4", **dict(dead, boot_id="another-boot")),  # named at step 2
        _leftover(tmp_path, "ckpt-000000000-5", **dict(dead, host="node-x", epoch=7)),  # the saver's epoch
        _leftover(tmp_path, "ckpt-000000000-6", **dict(dead, host="node-x", epoch=9)),  # a newer epoch's
        _leftover(tmp_path, "ckpt-000000000-7", **dict(_identity(os.getpid()), epoch=5)),  # a live writer
    }
    client = _cluster()
    manager = CheckpointManager(str(tmp_path), run_id="run-a", max_to_keep=10)
    saved = []
    for _ in range(BEHIND_BY + 1):  # steps 0 .. BEHIND_BY; each save's removal sees those before it
        saved.append(Path(manager.save(client, epoch=7, holder="new chief").path).name)
        _step(client)
        assert unjudged | kept <= set(_checkpoints(tmp_path))
    saved.append(Path(manager.save(client, epoch=7, holder="new chief").path).name)  # BEHIND_BY above step 0 before it
    assert _checkpoints(tmp_path) == sorted([*saved, *kept])
