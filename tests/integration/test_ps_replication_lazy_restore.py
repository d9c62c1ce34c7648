"""A lazy table restored from its built rows onto a replicated shard, with real server processes (issue 29).

A ``LoadShard`` is replicated whole (a full entry: :mod:`psflow.ps.replication.member`), and a lazy partition's
load of its saved rows only (:mod:`psflow.ps.built_rows`) leaves it lazy, its rows built since the checkpoint
but not saved in it unbuilt again. The backup must end bit-equal to the primary (its built rows too), and once
promoted serve the checkpoint's rows and the initial content of every other row, as the primary would.

The shard's two members are :class:`test_ps_replication._Shard`'s processes (its ``shard`` fixture); the client is a
plain channel.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import test_ps_replication
from support import wait_until
from test_ps_replication import BACKUP, PRIMARY, WORKER, _Shard, _tensors

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.built_rows import built_rows_name, initial_slot_name
from psflow.ps.initializers import initial_rows
from psflow.ps.protocol import (
    LoadShardRequest,
    PromoteRequest,
    PullReply,
    PullRequest,
    PushReply,
    PushRequest,
    RegisterRequest,
    ReplicaStatusReply,
    WorkerTag,
)
from psflow.ps.sync import SyncConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

shard = test_ps_replication.shard  # the fixture: a _Shard whose processes are killed after the test

KEY = "emb/part_0"
SHAPE = (1 << 16, 4)  # 1 MiB of float32: lazy (psflow.ps.lazy_rows.LAZY_MIN_BYTES)
SPEC: dict[str, Any] = {"name": "random_normal", "stddev": 0.1, "seed": 7}
SAVED, LATER = np.arange(0, 40, 2, dtype=np.int64), np.arange(1000, 1040, dtype=np.int64)


def _register(shard: _Shard) -> None:
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": shard.cluster.job_tasks("ps")})))
    vs.get_variable("emb", SHAPE, initializer=SPEC)
    request = RegisterRequest(tuple(vs.placements()), OptimizerSpec("adagrad", {"learning_rate": 0.1}), SyncConfig(),
                              WORKER, chief=True)
    frame = request.to_frame()
    shard.channels[PRIMARY].call(RegisterRequest.METHOD, frame.meta, timeout=30)


def _push(shard: _Shard, task: str, i: int, rows: np.ndarray) -> PushReply:
    grad = np.random.default_rng(i).normal(size=(rows.size, SHAPE[1])).astype(np.float32)
    frame = PushRequest([(KEY, grad, rows)], WorkerTag(WORKER, 1, push_id=i), step=True, examples=8).to_frame()
    return PushReply.from_frame(shard.channels[task].call(PushRequest.METHOD, frame.meta, frame.arrays, timeout=30))


def _pull(shard: _Shard, task: str, rows: np.ndarray) -> np.ndarray:
    frame = PullRequest([(KEY, rows)]).to_frame()
    return PullReply.from_frame(shard.channels[task].call(PullRequest.METHOD, frame.meta, frame.arrays,
                                                          timeout=30)).values[KEY]


def _caught_up(shard: _Shard) -> None:
    def same() -> bool:
        p, b = shard.status(PRIMARY), shard.status(BACKUP)
        return p is not None and b is not None and p.applied_seq == b.applied_seq
    wait_until(same, "the backup acknowledged the primary's newest entry", limit=60)


def test_a_backup_of_a_lazy_tables_restore_is_bit_equal_and_serves_it_once_promoted(shard: _Shard) -> None:
    shard.start(PRIMARY)
    shard.start(BACKUP)
    shard.wait_view(PRIMARY, BACKUP)
    _register(shard)
    assert [_push(shard, PRIMARY, i, SAVED).step for i in (1, 2, 3)] == [1, 2, 3]
    step, saved = _tensors(shard, PRIMARY)  # a full shard of a lazy partition: its built rows only
    assert step == 3 and saved[built_rows_name(KEY)].tolist() == SAVED.tolist(), sorted(saved)
    assert [_push(shard, PRIMARY, i, LATER).step for i in (4, 5)] == [4, 5]  # rows built after the save

    built = {KEY: (saved[built_rows_name(KEY)], {"initializer": SPEC, "shape": list(SHAPE)},
                   {"accumulator": saved[initial_slot_name(KEY, "accumulator")]})}
    load = LoadShardRequest.build({KEY: saved[KEY]}, {KEY: {"accumulator": saved[f"{KEY}:accumulator"]}}, {}, [KEY], built,
                                  global_step=3, restored_step=3).to_frame()
    shard.channels[PRIMARY].call(LoadShardRequest.METHOD, load.meta, load.arrays, timeout=60)
    _caught_up(shard)
    for task in (PRIMARY, BACKUP):  # each member holds the checkpoint's rows, the later ones unbuilt again
        step, now = _tensors(shard, task)
        assert step == 3 and sorted(now) == sorted(saved), (task, sorted(now))
        for name in saved:
            assert now[name].tobytes() == saved[name].tobytes(), (task, name)

    shard.procs[PRIMARY].kill()  # SIGKILL, by pid
    shard.procs[PRIMARY].wait(timeout=30)
    promote = PromoteRequest(0, 1, WORKER).to_frame()
    promoted = ReplicaStatusReply.from_frame(shard.channels[BACKUP].call(PromoteRequest.METHOD, promote.meta,
                                                                         timeout=30))
    assert promoted.role == "primary"
    assert _pull(shard, BACKUP, SAVED).tobytes() == saved[KEY].tobytes()
    # the rows built after the checkpoint: their initial content again, not what pushes 4 and 5 made of them
    assert _pull(shard, BACKUP, LATER).tobytes() == initial_rows(SPEC, SHAPE, LATER).tobytes()
    assert _push(shard, BACKUP, 6, LATER).step == 4  # the restored step goes on
    _, after = _tensors(shard, BACKUP)
    assert after[built_rows_name(KEY)].tolist() == sorted(SAVED.tolist() + LATER.tolist())
    want = np.full((LATER.size, SHAPE[1]), saved[initial_slot_name(KEY, "accumulator")][0], np.float32)
    assert after[f"{KEY}:accumulator"][SAVED.size:].tobytes() != want.tobytes()  # updated from the initial accumulator
