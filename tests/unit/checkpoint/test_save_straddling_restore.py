"""A checkpoint save that straddles a restore within the run: ps task 0's shard snapshotted before the restore (the
model the restore discards, its higher global_step), ps task 1's after it (the older checkpoint's state).

Each ps task refuses a SaveShard while a restore is in progress there or when one began during its own snapshot
(:meth:`psflow.ps.restore_gate.RestoreGate.check_save`), but a SaveShard that reaches a task only once the whole
restore is over (a save given up at ``--save-timeout`` whose thread goes on, a call queued on a busy task) is
served at the new generation, beside a shard of the old one: the manifest held a model that never existed, dated
by the discarded model's global_step, and became the newest checkpoint. Each shard reply now names its generation
and the save fails where they differ (:func:`psflow.checkpoint.save_manifest.build_manifest`). ps services in this
process (tests/two_ps_in_process.py): task 1's SaveShard runs a whole restore before it is served.

The same for a save that reaches a restarted ps task which the restore registered but sent no BeginRestore yet: not
ready, its initial values, at generation 0 as every task where no restore happened before; the checkpoint held
the trained weights beside the initial bias, dated step 3. Each reply names its readiness too, and the save fails
where ready and not ready tasks mix (the initial save's tasks are all not ready). And where EVERY ps task restarted
and was registered so (all not ready at generation 0, initial values: what the chief's initial save sees), any save
but the initial one (``initial=True``, the saver hook's after_initialize) fails naming the tasks not ready.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.save_manifest import check_one_generation, check_readiness
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SaveShardReply, SaveShardRequest
from psflow.ps.service import ParameterService
from psflow.rpc.api import InvalidRequest, Reply
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.generation_restore import register_as_chief, restore_at_new_generation

pytestmark = pytest.mark.timeout(60)


def _restore_before_task_1_saves(client: ParameterClient, service: ParameterService,
                                 restore: Callable[[], None]) -> list[int]:
    """ps task 1's next SaveShard first runs ``restore`` (the whole of it), then is served; returns the list its
    SaveShard calls are counted in."""
    handlers = dict(service.handlers())
    save_shard, served = handlers["SaveShard"], list[int]()

    def held(frame: Frame) -> Reply:
        if not served:
            restore()
        served.append(1)
        return save_shard(frame)

    handlers["SaveShard"] = held
    client.channels[1] = InProcessChannel("/job:ps/task:1", handlers)
    return served


def _checkpoints(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("ckpt-"))


def test_a_save_whose_shards_straddle_a_restore_fails_and_the_older_checkpoint_stays_newest(tmp_path: Path) -> None:
    client, services = two_ps_cluster()
    client.register(SGD, chief=True)
    manager = CheckpointManager(str(tmp_path), transport="rpc")
    older = manager.save(client)  # global_step 0, the initial model
    initial = client.pull({"weights": None, "bias": None})
    for _ in range(3):
        train_a_step(client)
    generations: list[int] = []

    def restore() -> None:  # the chief (another thread of it) restores the older checkpoint meanwhile
        states = {t: client.ps_stats(t) for t in client.channels}
        generations.append(restore_at_new_generation(client, SGD, older.path, None, states, run=None, limit=5.0,
                                                     step_survived=True).generation)

    served = _restore_before_task_1_saves(client, services[1], restore)
    with pytest.raises(CheckpointError, match=r"^the checkpoint's shards were snapshotted on both sides of a restore "
                                              r"within the run \(/job:ps/task:0 at generation 0, /job:ps/task:1 at "
                                              r"generation (\d+)\): they would hold a model that never existed") as failed:
        manager.save(client)
    assert served == [1] and len(generations) == 1 and f"generation {generations[0]})" in str(failed.value)
    assert (manager.saves_failed, manager.failed_in_a_row) == (1, 1)
    assert latest_checkpoint(str(tmp_path)) == older.path
    assert _checkpoints(tmp_path) == [os.path.basename(older.path)]  # the straddling save's directory removed
    # the cluster holds the older checkpoint's model (global_step went on from 3); the next save is of it whole
    restored = client.pull({"weights": None, "bias": None})
    assert all(np.array_equal(restored[name], initial[name]) for name in initial)
    again = manager.save(client)
    assert again.global_step == 3 and latest_checkpoint(str(tmp_path)) == again.path and manager.failed_in_a_row == 0


def test_each_shard_reply_names_its_generation_and_an_older_tasks_is_not_compared(tmp_path: Path) -> None:
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True)
    saved = CheckpointManager(str(tmp_path), transport="rpc").save(client)
    states = {t: client.ps_stats(t) for t in client.channels}
    generation = restore_at_new_generation(client, SGD, saved.path, None, states, run=None, limit=5.0,
                                           step_survived=True).generation
    frame = client.call(1, SaveShardRequest(None, 1, 2))
    reply = SaveShardReply.from_frame(frame)
    assert reply.generation == generation == frame.meta["generation"]
    older = replace(reply, generation=None, data=None)  # a task of an older version names none
    assert "generation" not in older.to_frame().meta and SaveShardReply.from_frame(older.to_frame()).generation is None
    with pytest.raises(InvalidRequest, match="'generation' must be a non-negative integer"):
        SaveShardReply.from_frame(Frame({**older.to_frame().meta, "generation": -1}))
    task_0 = replace(reply, task="/job:ps/task:0")
    check_one_generation({0: ("shard-0", task_0), 1: ("shard-1", older)})
    check_one_generation({0: ("shard-0", task_0), 1: ("shard-1", reply)})
    with pytest.raises(CheckpointError, match=rf"\(/job:ps/task:0 at generation {generation}, /job:ps/task:1 at "
                                              rf"generation {generation + 1}\)"):
        check_one_generation({0: ("shard-0", task_0), 1: ("shard-1", replace(reply, generation=generation + 1))})


def test_a_save_reaching_a_restarted_task_before_its_restore_began_fails(tmp_path: Path) -> None:
    """ps task 1 died and came back empty; the restorer's Register (step 1 of restore_at_new_generation) created its
    variables, not ready, but sent no BeginRestore yet: every task is at generation 0 (no earlier restore), so the
    generations agree, but task 1 holds its initial values beside task 0's trained ones. The save fails on the
    readiness the replies name (the initial save, every task not ready, is test_initial_save's)."""
    client, services = two_ps_cluster()
    client.register(SGD, chief=True)
    manager = CheckpointManager(str(tmp_path), transport="rpc")
    older = manager.save(client)
    for _ in range(3):
        train_a_step(client)
    restart_ps(client, services, 1)
    register_as_chief(client, SGD, None, limit=5.0)
    assert [s.gate.ready for s in services] == [True, False]
    assert [s.gate.generation for s in services] == [0, 0]
    with pytest.raises(CheckpointError, match=r"^the checkpoint's shards were snapshotted by ready and not ready ps "
                                              r"tasks \(/job:ps/task:0 ready, /job:ps/task:1 not ready\)"):
        manager.save(client)
    assert (manager.saves_failed, latest_checkpoint(str(tmp_path))) == (1, older.path)
    assert _checkpoints(tmp_path) == [os.path.basename(older.path)]


def test_each_shard_reply_names_its_readiness_and_an_older_tasks_is_not_compared(tmp_path: Path) -> None:
    client, services = two_ps_cluster()
    client.register(SGD, chief=True, defer_ready=True)  # the initial save's cluster: every task not ready
    frame = client.call(1, SaveShardRequest(None, 1, 2))
    reply = SaveShardReply.from_frame(frame)
    assert reply.ready is False and frame.meta["ready"] is False
    task_0 = replace(reply, task="/job:ps/task:0")
    check_readiness({0: ("shard-0", task_0), 1: ("shard-1", reply)}, initial=True)
    older = replace(reply, ready=None, data=None)  # a task of an older version names none
    assert "ready" not in older.to_frame().meta and SaveShardReply.from_frame(older.to_frame()).ready is None
    with pytest.raises(InvalidRequest, match="'ready' must be true or false, got 1"):
        SaveShardReply.from_frame(Frame({**older.to_frame().meta, "ready": 1}))
    check_readiness({0: ("shard-0", replace(task_0, ready=True)), 1: ("shard-1", older)}, initial=False)
    with pytest.raises(CheckpointError, match=r"\(/job:ps/task:0 ready, /job:ps/task:1 not ready\)"):
        check_readiness({0: ("shard-0", replace(task_0, ready=True)), 1: ("shard-1", reply)}, initial=True)


def test_a_save_reaching_every_ps_task_restarted_before_its_restore_began_fails(tmp_path: Path) -> None:
    """Every ps task died and came back empty; the restorer's Register created their variables, not ready, at
    generation 0, initial values: the replies agree on generation and readiness, as the initial save's do (before
    SetReady). A save that is not the initial one (a periodic one given up at --save-timeout whose thread wakes
    now, the final one) took them for a model: initial values, the newest checkpoint. It fails, naming the tasks."""
    client, services = two_ps_cluster()
    client.register(SGD, chief=True)
    manager = CheckpointManager(str(tmp_path), transport="rpc")
    older = manager.save(client)
    for _ in range(3):
        train_a_step(client)
    restart_ps(client, services, 0)
    restart_ps(client, services, 1)
    register_as_chief(client, SGD, None, limit=5.0)
    assert [(s.gate.ready, s.gate.generation) for s in services] == [(False, 0), (False, 0)]
    with pytest.raises(CheckpointError, match=r"^the checkpoint's shards were snapshotted by ps tasks not ready "
                                              r"\(restarted, not yet restored\): /job:ps/task:0, /job:ps/task:1: the "
                                              r"save is not a model of the run"):
        manager.save(client)
    assert (manager.saves_failed, manager.failed_in_a_row, latest_checkpoint(str(tmp_path))) == (1, 1, older.path)
    assert _checkpoints(tmp_path) == [os.path.basename(older.path)]  # its directory removed


def test_only_the_initial_save_takes_ps_tasks_not_ready(tmp_path: Path) -> None:
    """The chief that initialized a fresh cluster saves before it makes the tasks ready (``initial=True``: the
    CheckpointSaverHook's after_initialize); the same cluster saved as any other save is refused."""
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True, defer_ready=True)  # the initial save's cluster: every task not ready
    manager = CheckpointManager(str(tmp_path), transport="rpc")
    with pytest.raises(CheckpointError, match=r"not ready \(restarted, not yet restored\): /job:ps/task:0, "
                                              r"/job:ps/task:1: the save is not a model of the run"):
        manager.save(client)
    assert (manager.saves_failed, _checkpoints(tmp_path)) == (1, [])
    saved = manager.save(client, initial=True)
    assert (saved.global_step, latest_checkpoint(str(tmp_path)), manager.failed_in_a_row) == (0, saved.path, 0)


def test_a_task_not_ready_is_named_and_an_older_tasks_reply_is_not_compared(tmp_path: Path) -> None:
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True, defer_ready=True)
    reply = SaveShardReply.from_frame(client.call(1, SaveShardRequest(None, 1, 2)))
    task_0 = replace(reply, task="/job:ps/task:0", ready=True)
    older = replace(reply, ready=None, data=None)  # a task of an older version names none
    check_readiness({0: ("shard-0", task_0), 1: ("shard-1", older)}, initial=False)
    with pytest.raises(CheckpointError, match=r"not ready \(restarted, not yet restored\): /job:ps/task:1: "):
        check_readiness({0: ("shard-0", replace(task_0, ready=None)), 1: ("shard-1", reply)}, initial=False)
    check_readiness({0: ("shard-0", replace(task_0, ready=False)), 1: ("shard-1", reply)}, initial=True)
