"""TakeOver (psflow.train.take_over): a lingering worker takes the chief duties only when nobody pushed or held the
lease for a lease ttl, and hands them straight back when a push came as it was elected.

The real processes (the chief killed for good under ``psflow server``) are tests/integration/test_chief_lost_at_end;
these pin the guards that those runs do not reach: a live holder is never displaced, and a worker that still
trains keeps the duties.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from support import HeldLeases, one_ps_chief

from psflow.checkpoint.save import CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.coord.api import DEFAULT_ELECTION, LeaderInfo, Lease
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import FinalEvalReply, FinalEvalRequest, StatsReply
from psflow.ps.service import ParameterService
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.recovery import Leadership
from psflow.train.take_over import TakeOver

pytestmark = pytest.mark.timeout(60)

TTL = 2.0


class _Leases(HeldLeases):
    """Grants every campaign (epoch 9) unless ``holder`` names a live leader; counts campaigns and resigns."""

    campaign_polls = True

    def __init__(self, holder: str | None = None) -> None:
        self.holder = holder
        self.campaigns = 0
        self.resigned: list[int] = []

    def campaign(self, candidate: str, *, election: str = DEFAULT_ELECTION, timeout: float | None = None) -> Lease:
        self.campaigns += 1
        return Lease(election, candidate, f"{candidate}#1", 9, TTL, time.monotonic() + TTL)

    def leader(self, election: str = DEFAULT_ELECTION) -> LeaderInfo | None:
        return None if self.holder is None else LeaderInfo(election, self.holder, 8)

    def resign(self, lease: Lease) -> None:
        self.resigned.append(lease.epoch)


class _Steps:
    """ps task 0's global_step as the take-over reads it after its election; it records no final evaluation."""

    client_name = "/job:worker/task:1"
    step_task = 0

    def __init__(self, step: int) -> None:
        self.step = step

    def ps_stats(self) -> StatsReply:
        return StatsReply("/job:ps/task:0", global_step=self.step, ready=True)

    def call(self, task: int, request: FinalEvalRequest) -> Frame:
        return FinalEvalReply(None, None).to_frame()


def _take_over(backend: _Leases, step: int) -> tuple[TakeOver, Leadership]:
    leadership = Leadership(backend, "/job:worker/task:1")
    return TakeOver(leadership, _Steps(step), 1, lease_ttl=TTL, checkpoint_dir=None), leadership  # type: ignore[arg-type]


def test_nobody_pushing_or_holding_for_a_ttl_is_taken_over() -> None:
    backend = _Leases()
    take_over, leadership = _take_over(backend, 70)
    assert take_over(TTL - 0.1, 70, ("/job:worker/task:1",), 2) is False and backend.campaigns == 0
    assert take_over(TTL, 70, ("/job:worker/task:1",), 2) is True
    lease = leadership.lease()
    assert lease is not None and lease.epoch == 9 and backend.resigned == []


def test_a_live_holder_is_never_displaced() -> None:
    backend = _Leases(holder="/job:worker/task:2")
    take_over, leadership = _take_over(backend, 70)
    assert take_over(10 * TTL, 70, ("/job:worker/task:1",), 3) is False
    assert backend.campaigns == 0 and leadership.lease() is None


def test_a_push_as_it_is_elected_hands_the_duties_back() -> None:
    backend = _Leases()
    take_over, leadership = _take_over(backend, 71)  # a worker that trains pushed step 71 meanwhile
    assert take_over(TTL, 70, ("/job:worker/task:1",), 2) is False
    assert backend.campaigns == 1 and backend.resigned == [9] and leadership.lease() is None


def test_a_final_checkpoint_at_this_step_already_written_is_left_as_it_is(tmp_path: Path) -> None:
    """Two workers linger when the chief dies: the first takes the duties over and writes the final checkpoint;
    the second, finding it at this global_step, leaves without the lease (no second final checkpoint). A real
    CheckpointManager on an in-process ps service."""
    client, service = one_ps_chief("/job:worker/task:2")
    assert service.global_step is not None
    step = [service.global_step.increment() for _ in range(3)][-1]
    CheckpointManager(str(tmp_path), run_id="run-a").save(client, final=True)
    backend = _Leases()
    take_over = TakeOver(Leadership(backend, "/job:worker/task:2"), client, 2, lease_ttl=TTL,
                         checkpoint_dir=str(tmp_path))
    assert take_over(TTL, step, ("/job:worker/task:1", "/job:worker/task:2"), 3) is True and backend.campaigns == 0
    later = service.global_step.increment()  # a step past the final checkpoint: the duties are taken over
    assert take_over(TTL, later, ("/job:worker/task:1", "/job:worker/task:2"), 3) is True and backend.campaigns == 1


class _End(_Steps):
    """ps task 0 once every worker finished: each ``Stats`` takes the next of ``done`` (the workers whose ``Done``
    it received); asked again after the last, it fails the test (the waiting worker did not see the last)."""

    def __init__(self, step: int, done: list[list[str]]) -> None:
        super().__init__(step)
        self.client_name = "/job:worker/task:1"
        self.done = done

    def ps_stats(self) -> StatsReply:
        assert self.done, "asked ps task 0 again after the holder's Done"
        return StatsReply("/job:ps/task:0", global_step=self.step, ready=True,
                          finished=("/job:worker/task:0", "/job:worker/task:1"),
                          counters={"run_end": {"workers_done": self.done.pop(0), "workers_expected": 2,
                                                "run_over": False}})


def _await(backend: _Leases, done: list[list[str]], ttl: float) -> Leadership:
    leadership = Leadership(backend, "/job:worker/task:1")
    take_over = TakeOver(leadership, _End(70, done), 1, lease_ttl=ttl, checkpoint_dir=None)  # type: ignore[arg-type]
    take_over.await_holder(2, poll=0.0)
    return leadership


def test_a_worker_that_handed_the_duties_on_waits_for_the_holders_done_and_takes_nothing() -> None:
    """Every worker finished; worker 0, the holder, writes the final checkpoint and sends Done: worker 1 ends its
    wait on that Done, without a campaign (the lease is free, its ttl not passed)."""
    backend = _Leases()
    leadership = _await(backend, [[], [], ["/job:worker/task:0"]], ttl=3600.0)
    assert backend.campaigns == 0 and leadership.lease() is None


def test_a_live_holder_at_the_end_is_waited_for_and_never_displaced() -> None:
    backend = _Leases(holder="/job:worker/task:0")
    leadership = _await(backend, [[], [], [], ["/job:worker/task:0"]], ttl=0.0)
    assert backend.campaigns == 0 and leadership.lease() is None


def test_a_worker_that_handed_the_duties_on_takes_them_when_the_holder_never_ends() -> None:
    """Every worker finished and the holder neither sends Done (killed in its final save) nor holds the lease:
    worker 1 takes the duties over and returns holding the lease (its session's end writes the final checkpoint)."""
    backend = _Leases()
    leadership = _await(backend, [[], []], ttl=0.0)  # the second: global_step read again once elected
    lease = leadership.lease()
    assert backend.campaigns == 1 and lease is not None and lease.epoch == 9


def _two_workers() -> tuple[ParameterClient, ParameterClient, int]:
    """An in-process ps task 0 of a 2-worker run (it keeps the run's ledger, as under ``psflow server``), both
    workers' clients, registered and finished (``Leave``); the global_step they ended at."""
    workers = ["/job:worker/task:0", "/job:worker/task:1"]
    cluster = ClusterSpec({"ps": ["127.0.0.1:1"]})
    variables = VariableSet(replica_device_setter(cluster=cluster))
    variables.get_variable("w", (4, 2))
    service = ParameterService(0, holds_global_step=True, training_workers=workers)
    holder, waiter = (ParameterClient(cluster, variables.placements(), client_name=name,
                                      channels={0: InProcessChannel("/job:ps/task:0", service.handlers())})
                      for name in workers)
    holder.register(OptimizerSpec("sgd", {"learning_rate": 0.1}), chief=True)
    waiter.register(OptimizerSpec("sgd", {"learning_rate": 0.1}))
    assert service.global_step is not None
    step = [service.global_step.increment() for _ in range(3)][-1]
    holder.leave()
    waiter.leave()
    return holder, waiter, step


def test_without_a_checkpoint_dir_a_holder_that_evaluated_the_final_model_is_not_taken_over(
        caplog: pytest.LogCaptureFixture) -> None:
    """``--eval`` without ``--checkpoint-dir``: the last to finish evaluated the final model (recorded on ps task 0)
    and resigned its lease before its ``Done``; its end took more than the lease's ttl. The waiting worker used to
    take the duties over with a WARNING that the holder's session never ended and that it was 'writing the final
    checkpoint' (there is none to write); nothing was wrong. Now it sees the record and leaves, with no campaign and
    no WARNING."""
    holder, waiter, step = _two_workers()
    holder.call(holder.step_task, FinalEvalRequest(holder.client_name, step, evaluated=True))
    backend = _Leases()
    take_over = TakeOver(Leadership(backend, waiter.client_name), waiter, 1, lease_ttl=0.0, checkpoint_dir=None)
    with caplog.at_level(logging.INFO, logger="psflow.worker"):
        take_over.await_holder(2, poll=0.0)
    assert backend.campaigns == 0
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert any(f"final model (global_step {step}) was evaluated by /job:worker/task:0" in r.getMessage()
               for r in caplog.records), caplog.text


def test_without_a_checkpoint_dir_a_holder_that_never_evaluated_is_taken_over_without_a_checkpoint_named(
        caplog: pytest.LogCaptureFixture) -> None:
    """The same without the holder's record (killed before its evaluation): taken over, and the WARNING says what
    this worker will do, not that it writes a checkpoint."""
    _, waiter, step = _two_workers()
    backend = _Leases()
    take_over = TakeOver(Leadership(backend, waiter.client_name), waiter, 1, lease_ttl=0.0, checkpoint_dir=None)
    with caplog.at_level(logging.INFO, logger="psflow.worker"):
        take_over.await_holder(2, poll=0.0)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert backend.campaigns == 1 and len(warnings) == 1, caplog.text
    assert "writing the final checkpoint" not in warnings[0], warnings
    assert f"ending the run (no --checkpoint-dir) at global_step {step}" in warnings[0], warnings
