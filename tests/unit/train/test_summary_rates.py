"""The chief's per-second summaries (SummarySaverHook) over a ps task's restart: no negative rate, none made up.

Real ps services in this process (tests/two_ps_in_process.py); a "restart" is a fresh service behind the same
channel, whose counters start again from zero, as a restarted ps process's do.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.save import CheckpointManager
from psflow.coord import Lease
from psflow.train.chief import join_cluster
from psflow.train.hook_api import RunContext, RunValues
from psflow.train.hooks import SummarySaverHook
from psflow.train.recovery import ClusterRecovery
from psflow.train.summary import SummaryWriter, read_scalars

_RATES = ("pulls", "pushes", "bytes_in", "bytes_out")
_LEASE = Lease("chief", "/job:worker/task:0", "/job:worker/task:0#1", 7, 10.0, float("inf"))


@pytest.mark.parametrize("restarted", [0, 1])
def test_a_restarted_ps_task_gets_no_rate_for_the_interval_of_its_restart(tmp_path: Path, restarted: int) -> None:
    """Summaries at steps 2, 4, 6 and 8, with rates from the session's start on (the first had none); ps task
    ``restarted`` came back between 4 and 6. It wrote ps/1/pushes_per_sec -227 at the step after a real run's
    ps task 1 was killed and restarted (its counters against the dead process's). The interval of the restart
    has no rate for that task, and the restore that followed (every ps task, from the checkpoint at step 2)
    none for examples and global_step, which it set back; the next interval has them again."""
    client, services = two_ps_cluster()
    ckpt = str(tmp_path / "ckpt")
    join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt)
    writer = SummaryWriter(str(tmp_path / "summaries"))
    hook = SummarySaverHook(writer, save_steps=2)
    session = SimpleNamespace(client=client, global_step=0, join_result=None)  # a fresh cluster: nothing restored
    hook.after_create_session(session)  # type: ignore[arg-type]

    def train_to(step: int) -> None:
        for _ in range(2):
            train_a_step(client)
        hook.after_run(RunContext(session, 0), RunValues(step=step, loss=0.5, examples=1))  # type: ignore[arg-type]

    train_to(2)
    CheckpointManager(ckpt).save(client)
    train_to(4)
    restart_ps(client, services, restarted)
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=ckpt, leader=lambda: _LEASE, timeout=60.0)
    assert recovery.wait()[0]  # the chief restored every ps task from the checkpoint at step 2: a new generation
    train_to(6)
    train_to(8)
    writer.close()
    scalars = {tag: dict(points) for tag, points in read_scalars(str(tmp_path / "summaries")).items()}
    assert all(v >= 0 for tag, points in scalars.items() if tag.endswith("_per_sec") for v in points.values()), scalars
    for task in (0, 1):
        for key in _RATES:
            assert set(scalars[f"ps/{task}/{key}_per_sec"]) == ({2, 4, 8} if task == restarted else {2, 4, 6, 8}), task
    head = {2, 4, 8}  # the restore set examples and global_step back, on ps task 0 (restarted or not)
    assert set(scalars["train/examples_per_sec"]) == head and set(scalars["train/global_step_per_sec"]) == head
    assert set(scalars["train/loss"]) == {2, 4, 6, 8}


def test_the_learning_rate_is_labelled_with_the_step_it_belongs_to(tmp_path: Path) -> None:
    """The chief's push got step 2, then other workers' pushes took global_step to 6 before its summary read ps task
    0's Stats (backup workers: the Inception set-up's summary at step 25 showed step 29's rate). The rate read is
    the schedule's at step 6, so it is written at step 6, not at the chief's step 2."""
    from psflow.optim import OptimizerSpec
    from psflow.optim.schedules import ScheduleSpec

    schedule = ScheduleSpec("exponential_decay", {"learning_rate": 0.5, "decay_steps": 1, "decay_rate": 0.5})
    client, _ = two_ps_cluster()
    join_cluster(client, OptimizerSpec("sgd", {"learning_rate": schedule}), chief=True)
    writer = SummaryWriter(str(tmp_path / "summaries"))
    hook = SummarySaverHook(writer, save_steps=2)
    session = SimpleNamespace(client=client, global_step=0, join_result=None)  # a fresh cluster: nothing restored
    hook.after_create_session(session)  # type: ignore[arg-type]
    for _ in range(6):  # the chief's push got step 2; the other workers' 4 more came before its summary
        train_a_step(client)
    hook.after_run(RunContext(session, 0), RunValues(step=2, loss=0.5, examples=1))  # type: ignore[arg-type]
    writer.close()
    scalars = read_scalars(str(tmp_path / "summaries"))
    assert [step for step, _ in scalars["train/loss"]] == [2]
    ((step, rate),) = scalars["learning_rate"]
    assert (step, np.float32(rate)) == (6, schedule.value(6))


def test_a_ps_task_restarted_in_an_interval_that_began_with_low_counts_gets_no_rate_for_it(tmp_path: Path) -> None:
    """ps task 1 restarted in the first interval, when the session's start had counted nothing yet: its counters
    since the restart were above the dead process's, so going down did not show the restart, and the summary
    at step 4 made up ps/1 rates over the whole interval from a new process's counts (the last interval's
    'never made up' broken). Its uptime, shorter than the interval, shows it; the next interval has rates."""
    client, services = two_ps_cluster()
    ckpt = str(tmp_path / "ckpt")
    join_cluster(client, SGD, chief=True, checkpoint_dir=ckpt)
    CheckpointManager(ckpt).save(client)
    writer = SummaryWriter(str(tmp_path / "summaries"))
    hook = SummarySaverHook(writer, save_steps=4)
    session = SimpleNamespace(client=client, global_step=0, join_result=None)
    hook.after_create_session(session)  # type: ignore[arg-type]
    restart_ps(client, services, 1)
    recovery = ClusterRecovery(client, SGD, checkpoint_dir=ckpt, leader=lambda: _LEASE, timeout=60.0)
    assert recovery.wait()[0]
    for step in (4, 8):
        for _ in range(4):
            train_a_step(client)
        hook.after_run(RunContext(session, 0), RunValues(step=step, loss=0.5, examples=1))  # type: ignore[arg-type]
    writer.close()
    scalars = {tag: dict(points) for tag, points in read_scalars(str(tmp_path / "summaries")).items()}
    for key in _RATES:
        assert set(scalars[f"ps/1/{key}_per_sec"]) == {8}, (key, scalars[f"ps/1/{key}_per_sec"])
        assert set(scalars[f"ps/0/{key}_per_sec"]) == {4, 8}, key
