"""A deposed restorer's late LoadShard, and a checkpoint save overlapping a restore, over real gRPC: two real ps
processes.

A restorer whose lease lapsed (stopped past ``--lease-ttl``) may still send the LoadShard calls of its restore
after a newer lease's holder began its own (BeginRestore at a newer generation, fenced by the lease's epoch): they
overwrote the newer restore's values, and its SetReady then made the cluster ready holding the older checkpoint's.
LoadShard now carries its restore's generation and is refused, nothing changed, where the task holds another
(:meth:`psflow.ps.restore_gate.RestoreGate.check_load`). A SaveShard between a restore's BeginRestore and its
SetReady snapshotted a shard holding part of the restore, beside the other tasks' shards holding none of it: it
is refused (:meth:`~psflow.ps.restore_gate.RestoreGate.check_save`), the chief's save fails as one counted,
logged failure, and the next save, after the restore, is written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from two_ps_client import emb_bias_client

from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointFencedError, CheckpointManager, CheckpointSavesFailedError
from psflow.errors import CheckpointError
from psflow.optim import OptimizerSpec
from psflow.ps.protocol import BeginRestoreRequest, FenceRequest, LoadShardRequest, SetReadyRequest
from psflow.rpc.api import FailedPreconditionError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

OPTIMIZER = OptimizerSpec("sgd", {"learning_rate": 1.0})
OLD_EMB = np.full((6, 2), -1.0, np.float32)   # the deposed restorer's (older) checkpoint
EMB = np.arange(12, dtype=np.float32).reshape(6, 2) + 1   # the newer restore's
BIAS = np.array([7.0, -7.0], np.float32)


def _loads(emb: np.ndarray, bias: np.ndarray, generation: int) -> dict[int, LoadShardRequest]:
    """The LoadShard calls of a restore at ``generation`` (``emb`` on ps task 0 with global_step 40, ``bias``)."""
    return {0: LoadShardRequest.build({"emb/part_0": emb}, {}, {}, ["emb/part_0"], global_step=40, restored_step=40,
                                      generation=generation),
            1: LoadShardRequest.build({"bias/part_0": bias}, {}, {}, ["bias/part_0"], restored_step=40,
                                      generation=generation)}


def test_a_deposed_restorers_late_load_shard_changes_nothing(local_cluster) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(2)
    a = emb_bias_client(handle, "/job:worker/task:1")   # restorer A: its lease lapsed while it was stopped
    a.register(OPTIMIZER, chief=True)
    b = emb_bias_client(handle, "/job:worker/task:2")   # restorer B, the newer lease's holder
    for task in (0, 1):
        a.call(task, BeginRestoreRequest(10))
    for task in (0, 1):
        b.call(task, BeginRestoreRequest(20))
    for task, load in _loads(EMB, BIAS, 20).items():
        b.call(task, load)
    for task, load in _loads(OLD_EMB, -BIAS, 10).items():  # A resumes: its loads arrive after B's
        with pytest.raises(FailedPreconditionError, match=rf"^/job:ps/task:{task}: LoadShard: LoadShard of generation "
                                                          rf"10 refused: /job:ps/task:{task} is at generation 20 "
                                                          r"\(another restore began here since\); nothing loaded"):
            a.call(task, load)
    for task in (1, 0):
        b.call(task, SetReadyRequest("/job:worker/task:2", 20, 40))
    assert [(b.ps_stats(t).ready, b.ps_stats(t).generation) for t in (0, 1)] == [(True, 20), (True, 20)]
    values = b.pull({"emb": None, "bias": None})
    assert np.array_equal(values["emb"], EMB) and np.array_equal(values["bias"], BIAS), values
    assert b.global_step() == 40


def test_a_save_during_a_restore_fails_as_one_counted_failure_and_the_next_one_is_written(
        local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(2)
    chief = emb_bias_client(handle, "/job:worker/task:0")
    chief.register(OPTIMIZER, chief=True)
    manager = CheckpointManager(str(tmp_path / "ckpt"), transport="rpc", max_failed_saves=2)
    first = manager.save(chief)
    chief.call(1, BeginRestoreRequest(5))  # a restore begins (ps task 1 first; task 0 not yet)
    with pytest.raises(CheckpointError, match=r"saving shard .*shard-00001-of-00002.safetensors failed: /job:ps/task:1: "
                                              r"SaveShard: /job:ps/task:1: refused to save a checkpoint shard: a "
                                              r"restore \(generation 5\) is in progress here") as refused:
        manager.save(chief)
    assert not isinstance(refused.value, CheckpointSavesFailedError)  # counted, the run goes on
    assert (manager.failed_in_a_row, manager.saves_failed) == (1, 1)
    assert latest_checkpoint(str(tmp_path / "ckpt")) == first.path  # no checkpoint mixing restored shards
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith("ckpt-")) == \
        [Path(first.path).name]
    chief.call(0, BeginRestoreRequest(5))
    for task, load in _loads(EMB, BIAS, 5).items():
        chief.call(task, load)
    for task in (1, 0):
        chief.call(task, SetReadyRequest(chief.client_name, 5, 40))
    again = manager.save(chief)
    assert again.global_step == 40 and latest_checkpoint(str(tmp_path / "ckpt")) == again.path
    assert manager.failed_in_a_row == 0


@pytest.mark.parametrize("transport", ["grpc", "tcp"])
def test_under_an_election_a_save_during_a_restore_is_a_failed_save_not_one_fenced_off(
        local_cluster, tmp_path: Path, transport: str) -> None:  # type: ignore[no-untyped-def]
    """A chief with a lease (its saves carry its epoch) meets a restore in progress on ps task 1: the refusal is not a
    newer chief's fence, so the save is an ordinary failure (counted, the next save retries; a final one would fail
    the run), not "not made current ... left to that chief", a chief that does not exist. A newer chief's epoch,
    seen by the tasks afterwards, still fences the old chief's save off (not counted)."""
    handle = local_cluster(2)
    chief = emb_bias_client(handle, "/job:worker/task:0", transport)
    chief.register(OPTIMIZER, chief=True)
    manager = CheckpointManager(str(tmp_path / "ckpt"), transport="rpc", max_failed_saves=3, run_id="run-a")
    first = manager.save(chief, epoch=3, holder="chief 3")
    chief.call(1, BeginRestoreRequest(5))
    with pytest.raises(CheckpointError, match=r"shard-00001-of-00002.safetensors failed: /job:ps/task:1: SaveShard: "
                                              r"/job:ps/task:1: refused to save a checkpoint shard: a restore "
                                              r"\(generation 5\) is in progress here") as refused:
        manager.save(chief, epoch=3, holder="chief 3")
    assert not isinstance(refused.value, CheckpointFencedError), refused.value
    assert (manager.failed_in_a_row, manager.saves_failed) == (1, 1)
    assert latest_checkpoint(str(tmp_path / "ckpt")) == first.path
    chief.call(0, BeginRestoreRequest(5))
    for task, load in _loads(EMB, BIAS, 5).items():
        chief.call(task, load)
    for task in (1, 0):
        chief.call(task, SetReadyRequest(chief.client_name, 5, 40))
    assert manager.save(chief, epoch=3, holder="chief 3").global_step == 40 and manager.failed_in_a_row == 0
    for task in (0, 1):  # a newer chief is elected
        chief.call(task, FenceRequest(4, holder="chief 4"))
    with pytest.raises(CheckpointFencedError, match=r"epoch 3 refused: 'chief' is fenced at epoch 4 \(by chief 4\)"):
        manager.save(chief, epoch=3, holder="chief 3")
    assert manager.failed_in_a_row == 0  # fenced off is not a failed save
