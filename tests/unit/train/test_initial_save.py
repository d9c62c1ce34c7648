"""The chief's initial checkpoint is written before the ps tasks are made ready (hooks' ``after_initialize``).

Real in-process ps services: the session's order (``after_initialize`` while every task is not ready, only on
a chief that initialized a fresh cluster), a failed initial save (counted once, the cluster made ready all the
same, not tried again at ``after_create_session``) and the elected chief's wrapper (the initial save only while
holding the lease). The end to end check, with real ps processes and a non-chief trying to join during the
save: tests/integration/test_initial_checkpoint.py.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from psflow.checkpoint.ledger import checkpoint_status
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.coord import Lease
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.duties import _FailedSaveTolerant
from psflow.train.hooks import CheckpointSaverHook, SessionRunHook
from psflow.train.recovery import LeaderOnlyHook
from psflow.train.session import MonitoredTrainingSession

pytestmark = pytest.mark.timeout(60)

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
SGD = OptimizerSpec("sgd", {"learning_rate": 0.1})


def _services() -> list[ParameterService]:
    return [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]


def _client(services: list[ParameterService], name: str = "/job:worker/task:0") -> ParameterClient:
    variables = VariableSet(replica_device_setter(cluster=CLUSTER))
    variables.get_variable("w", (4, 2))
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    return ParameterClient(CLUSTER, variables.placements(), client_name=name, channels=dict(channels))


class _Readiness(SessionRunHook):
    """Records, at each of its calls, whether every ps task was ready."""

    def __init__(self, services: list[ParameterService]) -> None:
        self.services, self.seen = services, []  # type: list[tuple[str, bool]]

    def after_initialize(self, session: MonitoredTrainingSession) -> None:
        self.seen.append(("after_initialize", all(s.gate.ready for s in self.services)))

    def after_create_session(self, session: MonitoredTrainingSession) -> None:
        self.seen.append(("after_create_session", all(s.gate.ready for s in self.services)))


def test_the_initial_save_comes_before_ready_only_on_a_chief_that_initialized(tmp_path: Path) -> None:
    services = _services()
    chief_hook, saver = _Readiness(services), CheckpointSaverHook(CheckpointManager(str(tmp_path)), save_steps=100)
    with MonitoredTrainingSession(_client(services), SGD, is_chief=True, checkpoint_dir=str(tmp_path),
                                  hooks=[chief_hook], chief_only_hooks=[saver]):
        other_hook = _Readiness(services)
        with MonitoredTrainingSession(_client(services, "/job:worker/task:1"), SGD, is_chief=False,
                                      hooks=[other_hook]):
            pass
    assert chief_hook.seen == [("after_initialize", False), ("after_create_session", True)]
    assert other_hook.seen == [("after_create_session", True)]  # a non-chief: never after_initialize
    (path, step), = saver.saved  # the initial checkpoint, at step 0; the run's end (no step) marked it final
    assert (Path(path).name, step, read_manifest(path).global_step) == ("ckpt-000000000", 0, 0)

    # A new cluster restoring that directory: no after_initialize, no extra checkpoint.
    services = _services()
    hook, plain = _Readiness(services), CheckpointSaverHook(CheckpointManager(str(tmp_path)), save_steps=100)
    with MonitoredTrainingSession(_client(services), SGD, is_chief=True, checkpoint_dir=str(tmp_path),
                                  hooks=[hook], chief_only_hooks=[plain]) as session:
        assert session.join_result is not None and session.join_result.restored == latest_checkpoint(str(tmp_path))
        assert plain.saved == []
    assert hook.seen == [("after_create_session", True)]


def test_a_failed_initial_save_is_counted_once_and_the_cluster_made_ready(tmp_path: Path) -> None:
    """As any failed save (``--max-failed-saves`` above 1): logged and counted, the run goes on, the next
    period saves; it is not tried again when the session is created."""
    failures = [OSError(28, "No space left on device")]  # the first save's; the disk freed after it

    def full_disk(phase: str) -> None:
        if failures:
            raise failures.pop()

    services = _services()
    manager = CheckpointManager(str(tmp_path), max_failed_saves=3, fault=full_disk)
    saver = CheckpointSaverHook(manager, save_steps=100)
    with MonitoredTrainingSession(_client(services), SGD, is_chief=True, checkpoint_dir=manager.directory,
                                  chief_only_hooks=[_FailedSaveTolerant(saver, "/job:worker/task:0")]) as session:
        assert all(s.gate.ready for s in services)
        assert (manager.saves_failed, saver.saved) == (1, [])
        assert checkpoint_status(session.client)["failed"] == 1  # the ledger the launcher reports
    assert [s for _, s in saver.saved] == [0]  # the final one, at the run's end


class _Lead:
    """A worker's :class:`~psflow.train.recovery.Leadership`, as the hook reads it: held, or not."""

    candidate = "/job:worker/task:0"

    def __init__(self, held: bool) -> None:
        self.held = held

    def lease(self) -> Lease | None:
        return Lease("chief", self.candidate, f"{self.candidate}#1", 1, 10.0, time.monotonic() + 10) if self.held else None


@pytest.mark.parametrize("held", [True, False], ids=["leading", "not-leading"])
def test_an_elected_chief_saves_the_initial_checkpoint_only_while_it_holds_the_lease(tmp_path: Path,
                                                                                     held: bool) -> None:
    """Without the lease when it initializes (its campaign before joining failed), the configured chief
    writes nothing then; the first worker to take the lease saves the directory's first checkpoint."""
    services, lead = _services(), _Lead(held)
    saver = CheckpointSaverHook(CheckpointManager(str(tmp_path)), save_steps=100)
    hook: Any = LeaderOnlyHook(saver, lead)  # type: ignore[arg-type]
    readiness = _Readiness(services)
    saved_when: list[bool] = []
    original = saver.manager.save

    def save(*args: Any, **kw: Any) -> Any:
        saved_when.append(all(s.gate.ready for s in services))
        return original(*args, **kw)

    saver.manager.save = save  # type: ignore[method-assign]
    with MonitoredTrainingSession(_client(services), SGD, is_chief=True, checkpoint_dir=str(tmp_path),
                                  hooks=[readiness, hook]) as session:
        assert saved_when == ([False] if held else [])  # once, before ready; never again at creation
        lead.held = True
        hook.after_create_session(session)  # as on taking the lease later
        assert saved_when == ([False] if held else [True])
