"""A restarted chief's join that restores within the run (psflow/train/chief.py, ``_restore_at_join``) leaves the
restore to the lease holder only when the restore fence refused it (ABORTED: ``FencedOffError``, or every load
refused by it: ``RestoreRefusedError``); any other refusal fails the join, as any other failed load does.

Another refusal of its ``BeginRestore``: a replicated shard's member that was deposed (psflow/ps/replication/
member.py: FAILED_PRECONDITION naming the shard's new primary) when the route was not resolved anew. Read as the
fence's, the chief logged "waiting for the lease holder to restore the cluster" with no newer holder: the tasks it
had begun restoring stayed not ready. Real in-process ps services behind in-process channels (the same dispatch as
over a network); ps task 1's ``BeginRestore`` answers as the test says.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.save import CheckpointManager
from psflow.ps.client import ParameterClient
from psflow.ps.replication.deposed import Deposal
from psflow.ps.service import ParameterService
from psflow.rpc.api import FailedPreconditionError, FencedOff, FencedOffError, Handler, PreconditionFailed, Reply
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import join_cluster

pytestmark = pytest.mark.timeout(60)

TASK_1 = "/job:ps/task:1"


def _deposed_member() -> PreconditionFailed:
    """What a replicated shard's deposed member answers a write with (member.py ``_check_primary``)."""
    deposal = Deposal(TASK_1, 1)
    deposal.depose("/job:ps_backup/task:1", 2)
    return PreconditionFailed(deposal.message())


def _newer_holder() -> FencedOff:
    return FencedOff(f"{TASK_1}: write from old chief with epoch 5 refused: 'chief' is fenced at epoch 9 (by new chief)")


def _within_the_run(tmp_path: Path, refusal: Callable[[], Exception]) -> tuple[ParameterClient, list[ParameterService]]:
    """Trained past a checkpoint; the chief and ps task 0 died together (ps task 1 kept its state, so the join
    restores at a new generation), and ps task 1's ``BeginRestore`` raises ``refusal()``."""
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    train_a_step(client)
    CheckpointManager(str(tmp_path)).save(client)
    train_a_step(client)
    restart_ps(client, services, 0)

    def refused(frame: Frame) -> Reply:
        raise refusal()

    table: dict[str, Handler] = {**services[1].handlers(), "BeginRestore": refused}
    client.channels[1] = InProcessChannel(TASK_1, table)
    return client, services


def test_a_restore_refused_by_a_deposed_replica_fails_the_join_not_left_to_a_holder(tmp_path: Path,
                                                                                     caplog: pytest.LogCaptureFixture
                                                                                     ) -> None:
    client, _ = _within_the_run(tmp_path, _deposed_member)
    with pytest.raises(FailedPreconditionError, match=r"deposed: shard 1's primary is") as e:
        join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    assert not isinstance(e.value, FencedOffError)
    assert "waiting for the lease holder" not in caplog.text


def test_a_restore_refused_by_the_fence_is_left_to_the_lease_holder(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    client, services = _within_the_run(tmp_path, _newer_holder)
    joined = join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    assert joined.restore_pending and joined.restored is None
    assert "waiting for the lease holder to restore the cluster" in caplog.text
    assert not services[0].ready  # the restore is left to the holder: nothing opened
