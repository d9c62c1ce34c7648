"""The chief's restore after a ps death stays within the workers' wait (ClusterRecovery.wait's ``timeout``).

Since 8f9f8e1 a chief's Register asks an unreachable ps task again, for ``--connect-timeout`` s by default; the
restore's Register (psflow.train.recovery.ClusterRecovery.restore) did so too, inside wait()'s own deadline: a ps
task that died again as the restore registered held the chief's wait for its timeout plus --connect-timeout, and the
RecoveryError then said "not restored after <timeout> s". Its Register now asks for the time left, no more, and
the error gives the limit and the time it waited ("not restored within 1 s (waited 1.0 s; ...").
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from dead_task import DyingChannel
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.save import CheckpointManager
from psflow.coord import Lease
from psflow.rpc.api import ConnectConfig
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import join_cluster
from psflow.train.recovery import ClusterRecovery, RecoveryError

pytestmark = pytest.mark.timeout(60)


class _DiesAtRegister(DyingChannel):
    """A channel whose task dies for good at the first Register call: every call from then on is unreachable."""

    def __init__(self, channel: InProcessChannel) -> None:
        super().__init__(channel)
        self.dead = False

    def dies(self, method: str) -> bool:
        self.dead = self.dead or method == "Register"
        return self.dead


def _lease() -> Lease:
    return Lease("chief", "/job:worker/task:0", "/job:worker/task:0#1", 7, 10.0, time.monotonic() + 10.0)


def test_a_ps_task_dying_again_during_the_restore_fails_the_wait_at_its_timeout(tmp_path: Path) -> None:
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    CheckpointManager(str(tmp_path)).save(client)
    train_a_step(client)
    restart_ps(client, services, 1)  # came back empty: the chief restores
    # --connect-timeout far beyond the test's limit: the old restore's Register waited that long for ps task 1.
    client.config = ConnectConfig(connect_timeout=600.0, backoff_initial=0.01, backoff_max=0.05)
    dying = client.channels[1] = _DiesAtRegister(client.channels[1])  # type: ignore[assignment]
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=_lease, timeout=1.0)
    with pytest.raises(RecoveryError, match=r"^/job:worker/task:0: cluster not restored within 1 s \(waited \d+\.\d s; "
                                            r"not ready: /job:ps/task:1\)$"):
        recovery.wait()
    assert dying.dead  # the restore's Register met the task's death
