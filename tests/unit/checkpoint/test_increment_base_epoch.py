"""An increment's base is never a checkpoint of an older lease epoch: a chief that loses the lease and regains it in
the same process (the same :class:`~psflow.checkpoint.save.CheckpointManager`) saves full first.

Before, the manager kept its base across epochs: regained at epoch 3, it wrote an increment of its epoch-1
checkpoint, which the middle chief's (epoch 2) rotation, stopped after its fence re-check and resumed meanwhile,
may delete while the increment is written (it deletes older-epoch checkpoints it does not keep, and never reads
a newer epoch's bases): the increment was published with a broken chain, the pointer naming a checkpoint no
restore can read. Real in-process ps services (no sockets).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from test_pointer_epochs import _cluster, _step

from psflow.checkpoint import lock, rotation, save
from psflow.checkpoint.chain import checkpoint_chain
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def _short_mutex_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lock, "MUTEX_TIMEOUT", 0.5)


def test_a_regained_lease_saves_full_first_so_an_older_chiefs_rotation_breaks_no_chain(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = str(tmp_path)
    client = _cluster()
    stopped: list[tuple[Any, ...]] = []  # the middle chief's rotation, stopped past its fence re-check

    def fault(phase: str) -> None:  # it resumes while the regained chief writes its shards
        if phase == "shards_written" and stopped:
            rotation.delete_old(*stopped.pop())

    chief = CheckpointManager(directory, run_id="run-a", max_to_keep=1, full_every=5, fault=fault)
    first = chief.save(client, epoch=1, holder="worker 0")
    _step(client)
    middle = CheckpointManager(directory, run_id="run-a", max_to_keep=1, full_every=5)
    monkeypatch.setattr(save, "delete_old", lambda *args: stopped.append(args))
    middle.save(client, epoch=2, holder="worker 1")
    monkeypatch.undo()
    _step(client)
    assert stopped and os.path.isdir(first.path)
    regained = chief.save(client, epoch=3, holder="worker 0")
    assert not stopped and not os.path.exists(first.path)  # (the middle chief's rotation ran, deleting it)
    assert latest_checkpoint(directory) == regained.path
    chain = checkpoint_chain(regained.path)  # CheckpointError before: an increment of the deleted epoch-1 checkpoint
    assert [p for p, _ in chain] == [regained.path]
    assert read_manifest(regained.path).kind != "increment"


def test_the_same_epochs_saves_stay_increments(tmp_path: Path) -> None:
    client = _cluster()
    manager = CheckpointManager(str(tmp_path), run_id="run-a", max_to_keep=5, full_every=3)
    saved = []
    for _ in range(3):
        saved.append(manager.save(client, epoch=4, holder="worker 0"))
        _step(client)
    assert [read_manifest(s.path).kind for s in saved] == ["full", "increment", "increment"]
    assert [p for p, _ in checkpoint_chain(saved[-1].path)] == [s.path for s in saved]
