"""The final checkpoint is written or the run fails (issue 28): the chief duties' end, on real in-process ps services.

A periodic save that fails is logged and training goes on (the next period, or the next chief, saves); the
final one has no next: before this, a final save that failed for any reason but a newer chief's fence was only
logged (``LeaderOnlyHook``, ``_FailedSaveTolerant``), and the run exited 0 with an older checkpoint as its newest.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import pytest
from support import HeldLeases

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager, FinalCheckpointError
from psflow.cluster import ClusterSpec
from psflow.coord.api import DEFAULT_ELECTION, Lease
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.duties import _FailedSaveTolerant
from psflow.train.hooks import CheckpointSaverHook, RunContext, RunValues, SessionRunHook
from psflow.train.recovery import LeaderOnlyHook, Leadership
from psflow.train.session import MonitoredTrainingSession

pytestmark = pytest.mark.timeout(60)

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
SGD = OptimizerSpec("sgd", {"learning_rate": 0.1})


class _Held(HeldLeases):
    """A coordination service that grants ``epoch`` and never takes it back (the fence is the ps tasks')."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def campaign(self, candidate: str, *, election: str = DEFAULT_ELECTION, timeout: float | None = None) -> Lease:
        return Lease(election, candidate, f"{candidate}#1", self.epoch, 60.0, time.monotonic() + 60.0)


class _Cluster:
    """Two in-process ps services holding one variable, initialized."""

    def __init__(self) -> None:
        variables = VariableSet(replica_device_setter(cluster=CLUSTER))
        variables.get_variable("w", (4, 2))
        self.services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]
        self.channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(self.services)}
        self.placements = variables.placements()
        self.client("init").register(SGD, chief=True)

    def client(self, name: str) -> ParameterClient:
        return ParameterClient(CLUSTER, self.placements, client_name=name, channels=self.channels)

    def step(self) -> int:
        """global_step + 1, as a push would; the new value."""
        counter = self.services[0].global_step
        assert counter is not None
        return counter.increment()

    def elect(self, epoch: int, holder: str) -> None:
        """A chief elected at ``epoch`` fences every ps task."""
        for channel in self.channels.values():
            channel.call("Fence", {"token": epoch, "holder": holder})


def _chief(cluster: _Cluster, name: str, directory: Path, epoch: int, manager: CheckpointManager | None = None,
           final_must_succeed: bool = True) -> tuple[LeaderOnlyHook, MonitoredTrainingSession]:
    """A worker elected at ``epoch`` with its checkpoint duties (as :func:`psflow.train.duties.make_session` builds
    them), and a session on its own client."""
    leadership = Leadership(_Held(epoch), name)
    assert leadership.campaign(timeout=1.0) is not None
    cluster.elect(epoch, name)

    def fence() -> tuple[int, str] | None:
        lease = leadership.lease()
        return (lease.epoch, lease.holder) if lease is not None else None

    saver = CheckpointSaverHook(manager or CheckpointManager(str(directory), run_id="run-a"), save_steps=100,
                                fence=fence, final_must_succeed=final_must_succeed)
    session = MonitoredTrainingSession(cluster.client(name), SGD, is_chief=True)
    return LeaderOnlyHook(saver, leadership), session


def _unwritable(directory: Path) -> None:
    """The checkpoint directory becomes a file (what a disk that refuses the writes looks like to the chief,
    on any machine, root included)."""
    os.rename(directory, f"{directory}.moved")
    directory.write_text("not a directory\n")


def test_a_final_save_that_cannot_write_fails_naming_the_directory_and_the_cause(tmp_path: Path) -> None:
    cluster, directory = _Cluster(), tmp_path / "ckpt"
    hook, session = _chief(cluster, "/job:worker/task:1", directory, epoch=5)
    hook.after_create_session(session)  # the initial checkpoint
    cluster.step()
    _unwritable(directory)
    with pytest.raises(FinalCheckpointError) as caught:
        hook.end(session)
    message = str(caught.value)
    assert message.startswith("/job:worker/task:1: the final checkpoint (global_step 1) could not be written")
    assert f"into {directory}: " in message and ("Not a directory" in message or "File exists" in message), message


def test_without_election_the_final_save_that_fails_fails_the_session_too(tmp_path: Path) -> None:
    cluster, directory = _Cluster(), tmp_path / "ckpt"
    saver = CheckpointSaverHook(CheckpointManager(str(directory), run_id="run-a"), save_steps=100)
    hook: SessionRunHook = _FailedSaveTolerant(saver, "/job:worker/task:0")
    session = MonitoredTrainingSession(cluster.client("/job:worker/task:0"), SGD, is_chief=True)
    hook.after_create_session(session)
    cluster.step()
    _unwritable(directory)
    with pytest.raises(FinalCheckpointError, match=rf"could not be written into {directory}: .*(Not a directory|File exists)"):
        hook.end(session)


def test_with_max_failed_saves_0_a_final_save_that_fails_is_logged_and_the_run_goes_on_to_its_end(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``--max-failed-saves 0`` (make_session passes final_must_succeed=False): the user asked that no failed save
    fail the run; each is still reported."""
    cluster, directory = _Cluster(), tmp_path / "ckpt"
    hook, session = _chief(cluster, "/job:worker/task:1", directory, epoch=5, final_must_succeed=False)
    hook.after_create_session(session)
    cluster.step()
    _unwritable(directory)
    caplog.set_level(logging.ERROR)
    hook.end(session)
    assert "the final checkpoint (global_step 1) could not be written" in caplog.text
    assert "--max-failed-saves 0: the run does not fail for it" in caplog.text


def test_a_periodic_save_that_fails_is_logged_and_training_goes_on(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    cluster, directory = _Cluster(), tmp_path / "ckpt"
    hook, session = _chief(cluster, "/job:worker/task:1", directory, epoch=5)
    hook.after_create_session(session)
    _unwritable(directory)
    for _ in range(100):
        step = cluster.step()
    caplog.set_level(logging.ERROR)
    hook.after_run(RunContext(session, 0), RunValues(step, 0.5, 1))  # step 100: a periodic save is due, and fails
    assert "chief duty checkpoint save skipped after step 100" in caplog.text and str(directory) in caplog.text


def test_a_final_save_fenced_off_by_a_newer_chief_is_left_to_it(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    cluster, directory = _Cluster(), tmp_path / "ckpt"
    hook, session = _chief(cluster, "/job:worker/task:1", directory, epoch=5)
    hook.after_create_session(session)
    cluster.step()
    cluster.elect(9, "/job:worker/task:2")  # the successor writes the final checkpoint
    caplog.set_level(logging.ERROR)
    hook.end(session)  # no error: this worker exits 0
    assert "chief duty checkpoint save skipped at the end" in caplog.text and "epoch 5 refused" in caplog.text


def test_a_final_checkpoint_another_chief_made_current_survives_that_chief_being_fenced(tmp_path: Path) -> None:
    """The narrow window of issue 28: the old chief's final-step checkpoint is complete and current when its
    successor, elected meanwhile, finds it at the run's last step and marks it final instead of saving again;
    then the old chief's fence re-check fails, and it put the previous pointer back and removed its checkpoint:
    the run ended with an older checkpoint, not final, as its newest."""
    cluster, directory = _Cluster(), tmp_path / "ckpt"
    CheckpointManager(str(directory), run_id="run-a").save(cluster.client("init"), epoch=4, holder="first chief")
    last = cluster.step()
    successor: list[tuple[LeaderOnlyHook, MonitoredTrainingSession]] = []

    def successor_ends_here(phase: str) -> None:
        if phase == "pointer_switched":  # a successor is elected and ends its session before the old chief re-checks
            successor.append(_chief(cluster, "/job:worker/task:2", directory, epoch=9))
            hook, session = successor[0]
            hook.after_create_session(session)
            hook.end(session)

    old = CheckpointManager(str(directory), run_id="run-a", fault=successor_ends_here)
    old_hook, old_session = _chief(cluster, "/job:worker/task:1", directory, epoch=5, manager=old)
    old_hook.end(old_session)  # its final save: fenced on the re-check (logged), left to the successor
    latest = latest_checkpoint(str(directory))
    assert latest is not None, os.listdir(directory)
    manifest = read_manifest(latest)
    assert (manifest.global_step, manifest.final) == (last, True), (latest, manifest.global_step, manifest.final)
    assert json.loads((directory / "checkpoint").read_text())["latest"] == os.path.basename(latest)
