"""A restore and an older chief's save of the same checkpoint, on one checkpoint directory (issue F36), without
sockets: ps services in this process, a "restart" is a fresh service behind the same channel.

The old chief's save is made current; before its second fence check a newer chief is elected and restores that
checkpoint (the pointer named it); the old chief's re-check is then refused. Before the fix the old chief put its
previous pointer back and deleted the checkpoint the cluster had just been restored from: the run named a
restored checkpoint that no longer existed, and a second failure would have restored an older one. The same race
at a chief's first restore, when it joins a fresh cluster (join_cluster, not ClusterRecovery): adopted too.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.adopt import adopt_latest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointFencedError, CheckpointManager
from psflow.coord import Lease
from psflow.train.chief import JoinResult, join_cluster
from psflow.train.recovery import ClusterRecovery
from psflow.train.state_loss import ps_states

pytestmark = pytest.mark.timeout(60)

RUN = "run-a"


def _lease(epoch: int, holder: str) -> Lease:
    return Lease("chief", holder, f"{holder}#{epoch}", epoch, 10.0, time.monotonic() + 10.0)


def _pointer(directory: Path) -> dict[str, object]:
    data = json.loads((directory / "checkpoint").read_text())
    assert isinstance(data, dict)
    return data


def test_a_checkpoint_a_newer_chief_restored_is_neither_deleted_nor_unpointed_by_the_fenced_writer(
        tmp_path: Path) -> None:
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    first = CheckpointManager(str(tmp_path), run_id=RUN).save(client, epoch=5, holder="old chief")
    train_a_step(client)
    new_chief = _lease(9, "/job:worker/task:1")
    restored_from: list[str | None] = []

    def newer_chief_restores(phase: str) -> None:
        if phase == "pointer_switched":  # the old chief's save is current; it has not re-checked its fence yet
            restored_from.append(latest_checkpoint(str(tmp_path)))
            for channel in client.channels.values():  # the newer chief's election fences every ps task
                channel.call("Fence", {"token": new_chief.epoch, "holder": new_chief.holder})
            restart_ps(client, services, 1)  # a ps task lost its state: the newer chief restores
            recovery = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=lambda: new_chief,
                                       timeout=30.0, run=RUN)
            recovery.restore(new_chief, ps_states(client))

    old = CheckpointManager(str(tmp_path), run_id=RUN, fault=newer_chief_restores)
    with pytest.raises(CheckpointFencedError, match="epoch 5 refused"):
        old.save(client, epoch=5, holder="old chief")
    (restored,) = restored_from
    assert restored is not None and restored != first.path
    assert os.path.isfile(os.path.join(restored, "manifest.json")), sorted(p.name for p in tmp_path.iterdir())
    assert latest_checkpoint(str(tmp_path)) == restored  # the pointer still names what the cluster continues from
    pointer = _pointer(tmp_path)
    assert (pointer["latest"], pointer["epoch"], pointer["holder"]) == (Path(restored).name, 9, new_chief.holder)
    assert old.failed_in_a_row == 0  # fenced off is not a failed save
    # Rotation still cleans up: the newer chief's next save, keeping one, deletes both older checkpoints.
    train_a_step(client)
    newest = CheckpointManager(str(tmp_path), max_to_keep=1, run_id=RUN).save(client, epoch=9,
                                                                             holder=new_chief.holder)
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == [Path(newest.path).name]


def test_a_fenced_save_nobody_restored_is_still_taken_back_and_removed(tmp_path: Path) -> None:
    """The rule is about what a restore took: an old chief's save fenced off after its switch, with no
    restore in between, puts the previous pointer back and leaves no directory (as before)."""
    client, _ = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    first = CheckpointManager(str(tmp_path), run_id=RUN).save(client, epoch=5, holder="old chief")
    train_a_step(client)

    def newer_chief_elected(phase: str) -> None:
        if phase == "pointer_switched":
            for channel in client.channels.values():
                channel.call("Fence", {"token": 9, "holder": "new chief"})

    old = CheckpointManager(str(tmp_path), run_id=RUN, fault=newer_chief_elected)
    with pytest.raises(CheckpointFencedError):
        old.save(client, epoch=5, holder="old chief")
    assert latest_checkpoint(str(tmp_path)) == first.path
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == [Path(first.path).name]


def test_adopting_takes_the_pointer_over_with_the_restorers_epoch_and_never_from_a_newer_one(tmp_path: Path) -> None:
    client, _ = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    saved = CheckpointManager(str(tmp_path), run_id=RUN).save(client, epoch=5, holder="old chief")
    before = _pointer(tmp_path)
    assert adopt_latest(str(tmp_path), run_id=RUN, epoch=9, holder="new chief") == saved.path
    after = _pointer(tmp_path)
    assert after == dict(before, epoch=9, holder="new chief")
    assert adopt_latest(str(tmp_path), run_id=RUN, epoch=9, holder="new chief") == saved.path  # idempotent
    assert _pointer(tmp_path) == after
    with pytest.raises(CheckpointFencedError, match=r"written at epoch 9 \(by new chief\).*epoch 7 is older"):
        adopt_latest(str(tmp_path), run_id=RUN, epoch=7, holder="stale chief")
    assert _pointer(tmp_path) == after
    # Another run's pointer (a resumed run's restore) is read as it is and never written: no chief of run-b wrote
    # the checkpoint it names, and a fenced save removes only its own. A resumed run that then failed on bad input
    # left the pointer rewritten with its run id (test_bad_model_input.py: nothing stored may change).
    assert adopt_latest(str(tmp_path), run_id="run-b", epoch=1, holder="resumed") == saved.path
    assert _pointer(tmp_path) == after


def test_adopting_a_checkpoint_found_without_a_pointer_writes_one_naming_it(tmp_path: Path) -> None:
    """The old chief's first save, fenced off, removes the pointer it made (there was none before); until its
    directory is gone a reader falls back to it. A restore that takes it writes a pointer, so the old chief's
    cleanup (under the same mutex) leaves it."""
    client, _ = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    saved = CheckpointManager(str(tmp_path), run_id=RUN).save(client, epoch=5, holder="old chief")
    (tmp_path / "checkpoint").unlink()
    assert adopt_latest(str(tmp_path), run_id=RUN, epoch=9, holder="new chief") == saved.path
    pointer = _pointer(tmp_path)
    assert (pointer["latest"], pointer["epoch"], pointer["run_id"]) == (Path(saved.path).name, 9, RUN)
    assert pointer["global_step"] == saved.global_step and pointer["all"] == [Path(saved.path).name]
    assert latest_checkpoint(str(tmp_path)) == saved.path


def test_adopting_an_empty_directory_finds_nothing_and_writes_nothing(tmp_path: Path) -> None:
    assert adopt_latest(str(tmp_path), run_id=RUN, epoch=9, holder="new chief") is None
    assert not (tmp_path / "checkpoint").exists()


def test_a_chiefs_first_restore_of_a_fresh_cluster_takes_over_what_an_older_chiefs_fenced_save_made_current(
        tmp_path: Path) -> None:
    """The same race at a chief's first restore, when it joins a fresh cluster (every ps task came back empty:
    :func:`~psflow.train.chief.join_cluster` restores, not :class:`ClusterRecovery`). With its lease and the run
    id at hand it adopts the checkpoint it reads, as a restore after a ps death does; before, it read the newest
    checkpoint without taking it over, and the fenced writer then put its previous pointer back and deleted the
    checkpoint the fresh cluster had just been restored from."""
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    first = CheckpointManager(str(tmp_path), run_id=RUN).save(client, epoch=5, holder="old chief")
    train_a_step(client)
    new_chief = _lease(9, "/job:worker/task:1")
    joined: list[JoinResult] = []

    def newer_chief_joins_a_fresh_cluster(phase: str) -> None:
        if phase == "pointer_switched":  # the old chief's save is current; it has not re-checked its fence yet
            for index in range(len(services)):  # every ps task came back empty: a fresh cluster
                restart_ps(client, services, index)
            for channel in client.channels.values():  # the newer chief's election fences every ps task
                channel.call("Fence", {"token": new_chief.epoch, "holder": new_chief.holder})
            joined.append(join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path),
                                       leader=lambda: new_chief, run=RUN))

    old = CheckpointManager(str(tmp_path), run_id=RUN, fault=newer_chief_joins_a_fresh_cluster)
    with pytest.raises(CheckpointFencedError, match="epoch 5 refused"):
        old.save(client, epoch=5, holder="old chief")
    (result,) = joined
    assert result.created and result.restored is not None and result.restored != first.path
    assert os.path.isfile(os.path.join(result.restored, "manifest.json")), sorted(p.name for p in tmp_path.iterdir())
    assert latest_checkpoint(str(tmp_path)) == result.restored  # what the cluster continues from
    pointer = _pointer(tmp_path)
    assert (pointer["latest"], pointer["epoch"], pointer["holder"]) == (Path(result.restored).name, 9,
                                                                       new_chief.holder)


def test_a_chiefs_first_restore_without_a_lease_reads_the_newest_checkpoint_as_it_is(tmp_path: Path) -> None:
    """No lease (the run elects no chief, or the configured chief's campaign was not answered) or no run id: the
    restore reads the newest checkpoint and writes nothing (the run's only chief has no older one to fence off)."""
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    saved = CheckpointManager(str(tmp_path), run_id=RUN).save(client, epoch=5, holder="old chief")
    before = _pointer(tmp_path)
    for leader, run in ((lambda: None, RUN), (lambda: _lease(9, "new chief"), None)):
        for index in range(len(services)):
            restart_ps(client, services, index)
        result = join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path), leader=leader, run=run)
        assert result.restored == saved.path
        assert _pointer(tmp_path) == before
