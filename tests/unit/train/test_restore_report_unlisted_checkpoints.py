"""A worker that waited for another worker's restore within the run reports it to its hooks (ClusterRecovery's
on_restored: the chief's summaries write a SessionLog START there) with the newest checkpoint and its step, which it
reads from the checkpoint directory. That read is for the report alone: the cluster is restored and the worker goes
on. A directory that could not be listed then (latest_checkpoint raises CheckpointListingError: an object store's
outage, an NFS error) failed the worker, after the restore it waited for had succeeded (27a9824 read it outside its
try). Real ps services in this process; the listing's failure is latest_checkpoint's documented one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.pointer import CheckpointListingError
from psflow.checkpoint.save import CheckpointManager
from psflow.coord import Lease
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import StatsReply
from psflow.train import recovery as recovery_module
from psflow.train.recovery import ClusterRecovery
from psflow.train.session import MonitoredTrainingSession
from psflow.train.state_loss import ps_states

pytestmark = pytest.mark.timeout(60)

_LEASE = Lease("chief", "/job:worker/task:1", "/job:worker/task:1#1", 7, 10.0, float("inf"))


@pytest.mark.parametrize("ps_names_it", [True, False], ids=["ps_tasks_name_it", "ps_tasks_too_old_to_name_it"])
def test_a_waiting_worker_whose_checkpoint_listing_fails_goes_on_after_the_restore(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ps_names_it: bool) -> None:
    """The ps tasks' Stats name the checkpoint their restore loaded (psflow/ps/restore_gate.py): the report needs no
    listing then. Where they are too old to say, the newest checkpoint is listed, and its failure is not the worker's."""
    client, services = two_ps_cluster()
    ckpt = str(tmp_path / "ckpt")
    with MonitoredTrainingSession(client, SGD, is_chief=True, checkpoint_dir=ckpt) as session:
        generation = session.join_result.generation if session.join_result else 0
        for _ in range(3):
            train_a_step(client)
        CheckpointManager(ckpt).save(client)
        train_a_step(client)
        restart_ps(client, services, 1)
        holder = ClusterRecovery(client, SGD, checkpoint_dir=ckpt, leader=lambda: _LEASE, timeout=60.0,
                                 generation=generation)
        assert holder.wait()[0]  # the lease holder restored the cluster

        def unlisted(directory: str) -> str | None:
            raise CheckpointListingError(f"checkpoint directory {directory} cannot be listed: [Errno 5] EIO")

        monkeypatch.setattr(recovery_module, "latest_checkpoint", unlisted)
        if not ps_names_it:
            def older(client: ParameterClient) -> dict[int, StatsReply | None]:
                return {t: s if s is None else dataclasses.replace(s, restored_from=None, restored_from_step=None)
                        for t, s in ps_states(client).items()}

            monkeypatch.setattr(recovery_module, "ps_states", older)
        reported: list[tuple[str | None, int | None]] = []
        waiter = ClusterRecovery(client, SGD, checkpoint_dir=ckpt, leader=lambda: None, timeout=60.0,
                                 generation=generation, on_restored=lambda c, s: reported.append((c, s)))
        restored, _ = waiter.wait()

    assert restored and waiter.generation == holder.generation
    if ps_names_it:
        assert reported == [(str(tmp_path / "ckpt" / "ckpt-000000003"), 3)]
    else:
        assert reported == [(None, None)]  # not known: the hooks take the step the restore left
