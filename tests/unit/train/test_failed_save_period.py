"""A periodic checkpoint save that failed because a ps task was unreachable is tried again at the next period.

A chief whose save failed tries again at its next step (the saver's timer moves only on a success: a full disk
stops the run within ``--max-failed-saves`` steps, as docs/checkpoints.md says). A ps task that died is the
cluster restore's to deal with, but a chief with steps in flight (``--steps-in-flight 4``: the results of three
pushes acknowledged before the kill still come back) failed three saves within milliseconds, and the run
stopped with "3 checkpoint saves failed in a row" instead of restoring the killed task. Real in-process ps
services; the unreachable task is one whose calls fail as gRPC's UNAVAILABLE does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from psflow.checkpoint.save import CheckpointFencedError, CheckpointManager, CheckpointSavesFailedError
from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.api import DeadlineExceededError, RpcError, TaskUnavailableError
from psflow.rpc.inprocess import InProcessChannel, _Done
from psflow.train.duties import _FailedSaveTolerant
from psflow.train.hooks import CheckpointSaverHook, RunContext, RunValues
from psflow.train.session import MonitoredTrainingSession

pytestmark = pytest.mark.timeout(60)

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
SGD = OptimizerSpec("sgd", {"learning_rate": 0.1})


class _Killable(InProcessChannel):
    """A channel to an in-process ps task that can be killed: while ``dead``, every call fails as gRPC's
    UNAVAILABLE does for a task whose process is gone (``only``: the calls of that method alone)."""

    dead = False
    only: str | None = None
    error: type[RpcError] = TaskUnavailableError

    def call_async(self, method: str, meta: Any = None, arrays: Any = None, *, timeout: float | None = None) -> Any:
        if self.dead and self.only in (None, method):  # as a gRPC call: the error comes with its result
            return _Done(self.error(f"{self.task}: {method}: failed (dead or silent: {self.error.__name__})"))
        return super().call_async(method, meta, arrays, timeout=timeout)


def _cluster() -> tuple[list[ParameterService], dict[int, _Killable], Any]:
    """Two in-process ps services, each holding a variable, initialized; their channels and placements."""
    variables = VariableSet(replica_device_setter(cluster=CLUSTER))
    variables.get_variable("w", (4, 2))
    variables.get_variable("b", (2,))  # on ps task 1: one holding nothing is asked for no shard (shard_files.py)
    services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]
    channels = {i: _Killable(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    placements = variables.placements()
    ParameterClient(CLUSTER, placements, client_name="init", channels=dict(channels)).register(SGD, chief=True)
    return services, channels, placements


def _chief(manager: CheckpointManager, channels: dict[int, _Killable], placements: Any,
           **saver: Any) -> tuple[CheckpointSaverHook, _FailedSaveTolerant, MonitoredTrainingSession]:
    """worker 0 as the chief: its saver (every 10 steps; ``saver``: more arguments), as its worker wraps it, and
    its session, created (the initial checkpoint saved)."""
    hook = CheckpointSaverHook(manager, save_steps=10, **saver)
    tolerant = _FailedSaveTolerant(hook, "/job:worker/task:0")
    session = MonitoredTrainingSession(
        ParameterClient(CLUSTER, placements, client_name="/job:worker/task:0", channels=dict(channels)), SGD, is_chief=True)
    tolerant.after_create_session(session)
    return hook, tolerant, session


@pytest.mark.parametrize("fenced", [False, True])
def test_a_save_failed_on_a_dead_ps_task_waits_for_the_next_period(tmp_path: Path, fenced: bool) -> None:
    """``fenced``: an elected chief's save, failed at its fence check (the call the task died before)."""
    services, channels, placements = _cluster()
    counter = services[0].global_step
    assert counter is not None
    if fenced:
        for channel in channels.values():
            channel.call("Fence", {"token": 5, "holder": "/job:worker/task:0#1"})
    manager = CheckpointManager(str(tmp_path / "ckpt"), run_id="run-a", max_failed_saves=3)
    saver, hook, session = _chief(manager, channels, placements,
                                  fence=(lambda: (5, "/job:worker/task:0#1")) if fenced else None)
    assert len(saver.saved) == 1 and manager.saves_failed == 0

    def step() -> None:
        value = counter.increment()
        hook.after_run(RunContext(session, value), RunValues(value, 0.5, 8))

    for _ in range(9):
        step()
    channels[1].dead, channels[1].only = True, "Fence" if fenced else None  # ps task 1 is killed
    step()  # step 10: the save is due and fails (logged, counted)
    assert manager.saves_failed == 1
    for _ in range(5):  # the results of steps pushed before the kill come back: no save is due before step 20
        step()
    assert manager.saves_failed == 1 and manager.failed_in_a_row == 1
    channels[1].dead = False  # back (restored)
    for _ in range(4):
        step()
    assert len(saver.saved) == 1  # step 19
    step()
    assert len(saver.saved) == 2 and manager.failed_in_a_row == 0  # step 20: the next period saves


def test_the_limit_still_counts_saves_failed_on_a_dead_ps_task(tmp_path: Path) -> None:
    """--max-failed-saves 3: the third failed period in a row still ends the session."""
    services, channels, placements = _cluster()
    counter = services[0].global_step
    assert counter is not None
    manager = CheckpointManager(str(tmp_path / "ckpt"), run_id="run-a", max_failed_saves=3)
    _, hook, session = _chief(manager, channels, placements)
    channels[1].dead = True
    for value in range(1, 30):
        counter.increment()
        hook.after_run(RunContext(session, value), RunValues(value, 0.5, 8))
    assert manager.saves_failed == 2  # steps 10 and 20
    counter.increment()
    with pytest.raises(CheckpointSavesFailedError):
        hook.after_run(RunContext(session, 30), RunValues(30, 0.5, 8))


def test_a_save_that_cannot_write_is_tried_again_at_the_next_step(tmp_path: Path) -> None:
    """Any other failure (here the directory is a file, as a disk that refuses writes): the next step tries
    again, and the third failure in a row ends the session."""
    services, channels, placements = _cluster()
    counter = services[0].global_step
    assert counter is not None
    directory = tmp_path / "ckpt"
    manager = CheckpointManager(str(directory), run_id="run-a", max_failed_saves=3)
    _, hook, session = _chief(manager, channels, placements)
    directory.rename(tmp_path / "ckpt.moved")
    directory.write_text("not a directory\n")
    for value in range(1, 12):
        counter.increment()
        hook.after_run(RunContext(session, value), RunValues(value, 0.5, 8))
    assert manager.saves_failed == 2  # steps 10 and 11
    counter.increment()
    with pytest.raises(CheckpointSavesFailedError):
        hook.after_run(RunContext(session, 12), RunValues(12, 0.5, 8))


def test_a_fence_refused_by_one_task_while_another_is_dead_is_not_a_failed_save(tmp_path: Path) -> None:
    """Between the shards and the pointer a newer chief's epoch reaches ps task 0 and ps task 1 dies: task 0's
    refusal proves this chief deposed, whatever task 1 says; the save is fenced off, not counted as failed (it
    was counted, and with task 0's refusal as its cause it was tried again at every step)."""
    services, channels, placements = _cluster()
    for channel in channels.values():
        channel.call("Fence", {"token": 5, "holder": "/job:worker/task:0#1"})

    def depose(phase: str) -> None:
        if phase == "manifest_written":
            channels[0].call("Fence", {"token": 6, "holder": "/job:worker/task:1#1"})
            channels[1].dead = True

    manager = CheckpointManager(str(tmp_path / "ckpt"), run_id="run-a", max_failed_saves=3, fault=depose)
    client = ParameterClient(CLUSTER, placements, client_name="/job:worker/task:0", channels=dict(channels))
    with pytest.raises(CheckpointFencedError, match=r"task:0 refused.*task:1 could not be asked"):
        manager.save(client, epoch=5, holder="/job:worker/task:0#1")
    assert manager.saves_failed == 0 and manager.latest() is None


def test_a_save_whose_ps_task_does_not_answer_in_time_waits_for_the_next_period(tmp_path: Path) -> None:
    """A ps host gone silent (its calls end with DeadlineExceeded, not a refused connection) is a ps task that
    could not be reached, as a dead one: the save waits for the next period instead of every step."""
    services, channels, placements = _cluster()
    counter = services[0].global_step
    assert counter is not None
    manager = CheckpointManager(str(tmp_path / "ckpt"), run_id="run-a", max_failed_saves=3)
    _, hook, session = _chief(manager, channels, placements)
    channels[1].dead, channels[1].error = True, DeadlineExceededError
    for value in range(1, 20):
        counter.increment()
        hook.after_run(RunContext(session, value), RunValues(value, 0.5, 8))
    assert manager.saves_failed == 1 and manager.failed_in_a_row == 1  # step 10 only


def test_a_save_reported_while_the_ledger_was_down_is_counted_with_the_next(tmp_path: Path) -> None:
    """ps task 0 (the ledger) dies between a save's pointer switch and its report: the save is complete, and its
    report goes with the next one (a9a, ps task 0 killed at step 300: the chief logged 37 saves, metrics.json
    counted 36)."""
    services, channels, placements = _cluster()

    deaths = [1]

    def ledger_dies(phase: str) -> None:
        if phase == "manifest_written" and deaths:
            deaths.pop()
            channels[0].dead, channels[0].only = True, "CheckpointStatus"

    manager = CheckpointManager(str(tmp_path / "ckpt"), run_id="run-a", fault=ledger_dies)
    client = ParameterClient(CLUSTER, placements, client_name="/job:worker/task:0", channels=dict(channels))
    manager.save(client)
    assert services[0].saves.status().saved == 0
    channels[0].dead = False  # back
    manager.save(client)
    status = services[0].saves.status()
    assert (status.saved, status.last_saved_step) == (2, 0)
    manager.save(client)
    assert services[0].saves.status().saved == 3  # each counted once
