"""A restore within the run (a ps task died and came back empty; ``ClusterRecovery.wait``: the chief restores the
newest checkpoint at a new generation, the workers wait for it) gives the chief's summaries a SessionLog START at the
checkpoint's step, as a chief whose join restored writes one (SummarySaverHook): TensorBoard then drops the points
the lost steps wrote past the checkpoint. global_step is not set back (ps task 0, which holds it, kept its state), so
without a START nothing drops them: the curves showed the discarded model's points between the checkpoint's step and
the restore beside the restored model's. Also with the hook as every run with a chief election wraps it
(LeaderOnlyHook). Real ps services in this process (tests/two_ps_in_process.py), a real session and SummaryWriter,
read back with TensorBoard's own EventAccumulator (purge of orphaned data on, its default)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from two_ps_in_process import CLUSTER, SGD, restart_ps, two_ps_cluster

from psflow.checkpoint.save import CheckpointManager
from psflow.coord import Lease
from psflow.gradients import DenseGradient
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.global_step import StepJournal
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.hooks import SessionRunHook, SummarySaverHook
from psflow.train.leader_hooks import LeaderOnlyHook
from psflow.train.recovery import ClusterRecovery
from psflow.train.session import MonitoredTrainingSession
from psflow.train.summary import SummaryWriter

pytestmark = pytest.mark.timeout(60)

_LEASE = Lease("chief", "/job:worker/task:0", "/job:worker/task:0#1", 7, 10.0, float("inf"))


class _Leadership:
    """The chief lease as LeaderOnlyHook asks it: held."""

    candidate = "/job:worker/task:0"

    def lease(self) -> Lease | None:
        return _LEASE


@dataclass
class _Step:
    """A step's result as the session reads it (psflow.train.session.StepReport)."""

    step: int
    loss: float
    examples: int = 1
    metrics: dict[str, float] = field(default_factory=dict)
    completed: bool = True
    min_clock: int | None = None


def _step(client: ParameterClient, loss: float) -> _Step:
    generation = client.ps_stats().generation
    step = client.push_detailed({"weights": DenseGradient(np.ones((8, 2), np.float32)),
                                 "bias": DenseGradient(np.ones(2, np.float32))}, generation=generation).step
    return _Step(step, loss)


def _loss_curve(logdir: Path) -> list[tuple[int, float]]:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(logdir))
    acc.Reload()
    return [(e.step, round(e.value, 3)) for e in acc.Scalars("train/loss")]


def _starts(logdir: Path) -> list[tuple[int, str]]:
    loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")
    events: list[Any] = [e for p in sorted(logdir.iterdir()) for e in loader.EventFileLoader(str(p)).Load()]
    return [(e.step, e.session_log.checkpoint_path) for e in events if e.HasField("session_log")]


@pytest.mark.parametrize("election", [False, True], ids=["bare", "leader_only"])
def test_a_restore_within_the_run_writes_a_start_at_the_checkpoint_s_step(tmp_path: Path, election: bool) -> None:
    client, services = two_ps_cluster()
    ckpt, logdir = str(tmp_path / "ckpt"), tmp_path / "summaries"
    writer = SummaryWriter(str(logdir))
    summaries = SummarySaverHook(writer, save_steps=1)
    hook: SessionRunHook = LeaderOnlyHook(summaries, _Leadership()) if election else summaries  # type: ignore[arg-type]
    with MonitoredTrainingSession(client, SGD, is_chief=True, checkpoint_dir=ckpt, chief_only_hooks=[hook]) as session:
        for _ in range(3):
            session.run(lambda: _step(client, 0.5))
        saved = CheckpointManager(ckpt).save(client)  # the newest checkpoint: global_step 3
        for _ in range(2):
            session.run(lambda: _step(client, 0.1))  # steps 4 and 5: lost with ps task 1's state
        restart_ps(client, services, 1)
        recovery = ClusterRecovery(client, SGD, checkpoint_dir=ckpt, leader=lambda: _LEASE, timeout=60.0,
                                   generation=session.join_result.generation if session.join_result else 0,
                                   on_restored=session.restored)
        restored, _ = recovery.wait()  # this worker holds the lease: it restores
        assert restored and client.global_step() == 5  # ps task 0 kept global_step: not set back
        for _ in range(2):
            session.run(lambda: _step(client, 0.4))  # the restored model (step 3's) trains on: steps 6 and 7
    writer.close()

    assert _starts(logdir) == [(4, saved.path)]  # at step + 1: the checkpoint's own step stays
    assert _loss_curve(logdir) == [(1, 0.5), (2, 0.5), (3, 0.5), (6, 0.4), (7, 0.4)]


def _cluster_with_journal(journal: Path) -> ParameterClient:
    """Both ps tasks as new processes (ps task 0 reading its global_step journal ``journal``) and a client."""
    services = [ParameterService(0, holds_global_step=True, step_journal=StepJournal(str(journal), block=10)),
                ParameterService(1, holds_global_step=False)]
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("weights", (8, 2))  # ps task 0
    vs.get_variable("bias", (2,))       # ps task 1
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    return ParameterClient(CLUSTER, vs.placements(), client_name="/job:worker/task:0", channels=channels)


def test_a_chief_restarted_within_the_run_writes_its_start_at_the_checkpoint_s_step(tmp_path: Path) -> None:
    """The chief died with every ps task; restarted, its join restores within the run and global_step goes on past
    every value handed out (the journal's): its START is at the checkpoint's step, not at the step it goes on from
    (which dropped nothing: the lost steps 4-7 stayed in the curve)."""
    ckpt, logdir, journal = str(tmp_path / "ckpt"), tmp_path / "summaries", tmp_path / "state" / "global_step.json"
    client = _cluster_with_journal(journal)
    writer = SummaryWriter(str(logdir))
    with MonitoredTrainingSession(client, SGD, is_chief=True, checkpoint_dir=ckpt, run="run-a",
                                  chief_only_hooks=[SummarySaverHook(writer, save_steps=1)]) as session:
        for _ in range(3):
            session.run(lambda: _step(client, 0.5))
        saved = CheckpointManager(ckpt, run_id="run-a").save(client)
        for _ in range(4):
            session.run(lambda: _step(client, 0.1))  # steps 4-7: lost with every ps task (and the chief)
        client = _cluster_with_journal(journal)
    writer = SummaryWriter(str(logdir))  # the restarted chief's
    with MonitoredTrainingSession(client, SGD, is_chief=True, checkpoint_dir=ckpt, run="run-a",
                                  chief_only_hooks=[SummarySaverHook(writer, save_steps=1)]) as session:
        assert session.join_result is not None and session.join_result.restored == saved.path
        assert session.global_step == 7
        for _ in range(2):
            session.run(lambda: _step(client, 0.4))  # steps 8 and 9
    writer.close()

    assert _starts(logdir) == [(4, saved.path)]
    assert _loss_curve(logdir) == [(1, 0.5), (2, 0.5), (3, 0.5), (8, 0.4), (9, 0.4)]
