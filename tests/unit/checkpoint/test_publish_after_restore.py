"""A save whose shards were all taken before a restore within the run, published after it (a save given up at
--save-timeout whose thread goes on, the store slow to take its manifest): every SaveShard reply names one generation
and readiness, so build_manifest's checks pass, and the pointer then named a checkpoint of the model the restore
discarded, newer than the restored one, while the cluster trained on from the restored one: a later restore (another
ps death) would load the discarded model. The save asks every ps task where it stands just before it switches the
pointer, under the directory's mutex (:mod:`psflow.checkpoint.publish_checks`), and gives up where a task's generation
moved or a task ready at its snapshot is not ready any more (restarted): its directory removed, logged, counted once.

ps services in this process (tests/two_ps_in_process.py); the restore runs whole at the save's "manifest_written"
phase (its manifest written, the pointer not yet switched).
"""

from __future__ import annotations

import logging
import os
import re
import threading
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.bounded_save import BoundedSaves, SaveAbandonedError
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.publish_checks import check_no_restore_since
from psflow.checkpoint.save import CheckpointManager
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SaveShardReply, SetReadyRequest
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.generation_restore import register_as_chief, restore_at_new_generation

pytestmark = pytest.mark.timeout(60)


def _checkpoints(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("ckpt-"))


def _restore(client: ParameterClient, path: str) -> int:
    """The chief (another thread of it) restores checkpoint ``path`` at a new generation; returns it."""
    states = {t: client.ps_stats(t) for t in client.channels}
    return restore_at_new_generation(client, SGD, path, None, states, run=None, limit=5.0,
                                     step_survived=True).generation


def test_a_save_published_after_a_restore_since_its_shards_fails_and_the_restored_checkpoint_stays_newest(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True)
    older = CheckpointManager(str(tmp_path), transport="rpc").save(client)  # global_step 0, the initial model
    initial = client.pull({"weights": None, "bias": None})
    for _ in range(3):
        train_a_step(client)
    generations: list[int] = []

    def restore_before_publish(phase: str) -> None:
        if phase == "manifest_written":  # every shard taken at generation 0, the pointer not yet switched
            generations.append(_restore(client, older.path))

    manager = CheckpointManager(str(tmp_path), transport="rpc", fault=restore_before_publish)
    with caplog.at_level(logging.ERROR), pytest.raises(
            CheckpointError, match=r"^checkpoint \S+ckpt-000000003 not made current: ps tasks were restored since "
                                   r"its shards were taken \(/job:ps/task:0 at generation (\d+), was 0; "
                                   r"/job:ps/task:1 at generation \1, was 0\): it holds the model the restore "
                                   r"discarded") as refused:
        manager.save(client)
    assert len(generations) == 1 and f"at generation {generations[0]}," in str(refused.value)
    assert (manager.saves_failed, manager.failed_in_a_row) == (1, 1)  # counted once
    assert latest_checkpoint(str(tmp_path)) == older.path
    assert _checkpoints(tmp_path) == [os.path.basename(older.path)]  # the refused save's directory removed
    assert "ckpt-000000003" in caplog.text and "restored since" in caplog.text
    # the cluster trains on from the restored model; the next save is of it, and current
    assert all(np.array_equal(client.pull({"weights": None, "bias": None})[n], initial[n]) for n in initial)
    again = CheckpointManager(str(tmp_path), transport="rpc").save(client)
    assert latest_checkpoint(str(tmp_path)) == again.path


def test_a_save_given_up_at_save_timeout_and_published_after_a_restore_fails_counted_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The case of the review: BoundedSaves gave the save up (counted), the chief went on and restored after a ps
    death, then the save's thread woke: it does not make the discarded model current, nor count itself again."""
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True)
    older = CheckpointManager(str(tmp_path), transport="rpc").save(client)
    for _ in range(3):
        train_a_step(client)
    wake, woke = threading.Event(), threading.Event()

    def slow_store(phase: str) -> None:
        if phase == "manifest_written":
            woke.set()
            wake.wait(30)

    manager = CheckpointManager(str(tmp_path), transport="rpc", fault=slow_store)
    saves = BoundedSaves(manager)
    client.config = replace(client.config, save_timeout=0.2)
    with pytest.raises(SaveAbandonedError, match="given up: no end within --save-timeout"):
        saves.run(client, "the checkpoint save", manager.save)
    assert woke.wait(30) and manager.abandoned and manager.saves_failed == 1
    _restore(client, older.path)
    with caplog.at_level(logging.ERROR):
        wake.set()
        stuck = saves._stuck
        assert stuck is not None and stuck[0].wait(30)  # the thread given up ended
    assert re.search(r"given up at --save-timeout \(counted then\), failed late: checkpoint \S+ckpt-000000003 not made "
                     r"current: ps tasks were restored since its shards were taken", caplog.text), caplog.text
    assert (manager.saves_failed, manager.failed_in_a_row) == (1, 1)  # not counted twice
    assert latest_checkpoint(str(tmp_path)) == older.path
    assert _checkpoints(tmp_path) == [os.path.basename(older.path)]


def test_a_save_published_after_a_ps_task_restarted_since_its_shards_fails(tmp_path: Path) -> None:
    """No restore yet (every task still at generation 0), but ps task 1 died and came back empty after its shard was
    taken: a restore is coming, and may have read the pointer already; the save is not made current."""
    client, services = two_ps_cluster()
    client.register(SGD, chief=True)
    older = CheckpointManager(str(tmp_path), transport="rpc").save(client)
    train_a_step(client)

    def restart_before_publish(phase: str) -> None:
        if phase == "manifest_written":
            restart_ps(client, services, 1)
            register_as_chief(client, SGD, None, limit=5.0)

    manager = CheckpointManager(str(tmp_path), transport="rpc", fault=restart_before_publish)
    with pytest.raises(CheckpointError, match=r"not made current: ps tasks were restarted since its shards were taken "
                                              r"\(/job:ps/task:1 not ready at generation 0, was ready\)"):
        manager.save(client)
    assert (manager.saves_failed, latest_checkpoint(str(tmp_path))) == (1, older.path)
    assert _checkpoints(tmp_path) == [os.path.basename(older.path)]


def test_the_initial_save_is_published_after_its_tasks_were_made_ready(tmp_path: Path) -> None:
    """The chief's initial save snapshots tasks not ready; a SetReady with no restore (the chief going on while the
    save given up still runs) moves neither generation: the initial checkpoint is still made current."""
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True, defer_ready=True)

    def ready_before_publish(phase: str) -> None:
        if phase == "manifest_written":
            for task in client.channels:
                client.call(task, SetReadyRequest(client.client_name))

    saved = CheckpointManager(str(tmp_path), transport="rpc", fault=ready_before_publish).save(client, initial=True)
    assert latest_checkpoint(str(tmp_path)) == saved.path and saved.global_step == 0


def test_an_older_tasks_reply_is_not_compared_and_a_task_not_asked_refuses(tmp_path: Path) -> None:
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True)
    CheckpointManager(str(tmp_path), transport="rpc").save(client)
    _restore(client, latest_checkpoint(str(tmp_path)) or "")
    reply = SaveShardReply("/job:ps/task:1", [], None, {}, 0, 0, "", generation=None, ready=None)  # an older task names neither
    check_no_restore_since(client, {1: ("shard-1", reply)}, "ckpt-x")
    with pytest.raises(CheckpointError, match=r"restored since its shards were taken \(/job:ps/task:1 at generation"):
        check_no_restore_since(client, {1: ("shard-1", replace(reply, generation=0, ready=True))}, "ckpt-x")
    client.channels[1] = InProcessChannel("/job:ps/task:1", {})  # serves no call at all
    with pytest.raises(CheckpointError, match=r"^checkpoint ckpt-x not made current: /job:ps/task:1 could not be "
                                              r"asked whether it was restored since the save's shards were taken"):
        check_no_restore_since(client, {1: ("shard-1", replace(reply, generation=0, ready=True))}, "ckpt-x")
