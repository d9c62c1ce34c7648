"""``kill:chief`` hits whoever holds the chief duties when it fires (issue 25, item 9): pure logic, no processes."""

from __future__ import annotations

import signal
from dataclasses import dataclass

import pytest

from psflow.cluster import ClusterError, ClusterSpec, TaskId
from psflow.launch.chaos import ChaosInjector
from psflow.launch.chaos_plan import ChaosPlan, DutyHolder
from psflow.launch.supervisor import RestartConfig, Supervisor
from psflow.train.chief import trainer_task, training_view

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3", "127.0.0.1:4", "127.0.0.1:5"]})
PIDS = {("ps", 0): 40, ("worker", 0): 42, ("worker", 1): 43, ("worker", 2): 44}


@dataclass
class FakeTask:
    name: str
    pid: int
    job: str = "worker"


def _injector(specs: list[str], sent: list[tuple[int, int]], holders: list[DutyHolder | None]) -> ChaosInjector:
    """An injector whose holder() answers from ``holders`` (the last answer repeats)."""
    def holder() -> DutyHolder | None:
        return holders.pop(0) if len(holders) > 1 else holders[0]

    return ChaosInjector(ChaosPlan.parse(specs), CLUSTER,
                         lambda job, i: FakeTask(f"/job:{job}/task:{i}", PIDS[(job, i)]),
                         send=lambda pid, sig: sent.append((pid, sig)), holder=holder)


def test_kill_chief_hits_the_current_holder_not_worker_0() -> None:
    sent: list[tuple[int, int]] = []
    injector = _injector(["kill:chief@step=100"], sent, [DutyHolder("worker", 2, 1234)])
    (fired,) = injector.poll(100)
    assert (fired.task, fired.pid, fired.lease_epoch) == ("/job:worker/task:2", 44, 1234)
    assert sent == [(44, signal.SIGKILL)]


def test_kill_chief_waits_while_nobody_holds_the_duties() -> None:
    sent: list[tuple[int, int]] = []
    injector = _injector(["kill:chief@step=100"], sent, [None, None, DutyHolder("worker", 1, 9)])
    assert injector.poll(100) == [] and injector.poll(101) == [] and injector.pending() == 1
    (fired,) = injector.poll(102)
    assert fired.task == "/job:worker/task:1" and sent == [(43, signal.SIGKILL)]


def test_kill_chief_does_not_hit_a_holder_its_round_already_hit() -> None:
    sent: list[tuple[int, int]] = []
    injector = _injector(["kill:worker:1@step=100", "kill:chief@step=100"], sent,
                         [DutyHolder("worker", 1, 5), DutyHolder("worker", 2, 6)])
    assert [f.task for f in injector.poll(100)] == ["/job:worker/task:1"]   # its holder was just killed: wait
    assert [f.task for f in injector.poll(101)] == ["/job:worker/task:2"]   # the next holder
    assert sent == [(43, signal.SIGKILL), (44, signal.SIGKILL)]


def test_without_a_holder_lookup_kill_chief_is_the_configured_chief() -> None:
    sent: list[tuple[int, int]] = []
    injector = ChaosInjector(ChaosPlan.parse(["kill:chief@step=1"]), CLUSTER,
                             lambda job, i: FakeTask(f"/job:{job}/task:{i}", PIDS[(job, i)]),
                             send=lambda pid, sig: sent.append((pid, sig)))
    assert [f.task for f in injector.poll(1)] == ["/job:worker/task:0"] and sent == [(42, signal.SIGKILL)]


def test_a_lease_holders_training_index_names_its_task() -> None:
    assert trainer_task(CLUSTER, 2) == TaskId("worker", 2)
    with_chief = ClusterSpec({"chief": ["127.0.0.1:9"], "ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
    view, _ = training_view(with_chief, "chief", 0)
    assert [trainer_task(with_chief, i) for i in range(view.num_tasks("worker"))] == \
        [TaskId("chief", 0), TaskId("worker", 0), TaskId("worker", 1)]
    for i in range(view.num_tasks("worker")):  # the inverse of training_view
        task = trainer_task(with_chief, i)
        assert training_view(with_chief, task.job, task.index)[1] == i
    with pytest.raises(ClusterError):
        trainer_task(with_chief, 3)


def test_a_ps_task_that_is_not_restarted_says_its_variables_are_lost() -> None:
    supervisor = Supervisor(RestartConfig("never"), restart=lambda task: task)
    ps = supervisor.on_exit(FakeTask("/job:ps/task:1", 41, job="ps"), -signal.SIGKILL)
    assert ps.reason == ("restart policy is 'never'; the variables it held are lost, so the run stops "
                         "(--restart-policy on-failure restores them from a checkpoint)")
    assert supervisor.on_exit(FakeTask("/job:worker/task:1", 43), 1).reason == "restart policy is 'never'"
    spent = Supervisor(RestartConfig("on-failure", max_restarts=0), restart=lambda task: task)
    assert spent.on_exit(FakeTask("/job:ps/task:0", 40, job="ps"), 1).reason == \
        "gave up after 0 restart(s) (--max-restarts 0); the variables it held are lost, so the run stops"


def test_an_idle_ps_task_not_restarted_says_it_held_nothing() -> None:
    """A ps task holding none of the variables (idle) lost none: the run stops all the same (a task of the cluster
    is gone), saying so, not 'the variables it held are lost' (the review of 12ab6bf)."""
    supervisor = Supervisor(RestartConfig("never"), restart=lambda task: task)
    idle = supervisor.on_exit(FakeTask("/job:ps/task:3", 44, job="ps"), -signal.SIGKILL, holds_nothing=True)
    assert idle.reason == ("restart policy is 'never'; it held none of the variables (idle), but a ps task of the "
                           "cluster is gone, so the run stops (--restart-policy on-failure restarts it; nothing is "
                           "restored)")
    assert not idle.restart and not idle.goes_on


def test_a_replicated_shard_member_not_restarted_goes_on_while_its_shard_has_a_live_member() -> None:
    supervisor = Supervisor(RestartConfig("never"), restart=lambda task: task)
    primary = supervisor.on_exit(FakeTask("/job:ps/task:0", 40, job="ps"), -signal.SIGKILL,
                                 shard_live=lambda: (0, ["/job:ps_backup/task:0", "/job:ps_backup/task:2"]))
    assert (primary.restart, primary.goes_on) == (False, True) and supervisor.pending() == 0
    assert primary.reason == ("restart policy is 'never'; ps shard 0 goes on with /job:ps_backup/task:0, "
                              "/job:ps_backup/task:2 (not restarted: --restart-policy on-failure restarts it as a backup)")
    last = supervisor.on_exit(FakeTask("/job:ps_backup/task:0", 45, job="ps_backup"), 1, shard_live=lambda: (0, []))
    assert (last.restart, last.goes_on) == (False, False)  # the shard's last member: lost, as an unreplicated ps task
    assert last.reason == ("restart policy is 'never'; the variables it held are lost, so the run stops "
                           "(--restart-policy on-failure restores them from a checkpoint)")
    spent = Supervisor(RestartConfig("on-failure", max_restarts=0), restart=lambda task: task)
    assert spent.on_exit(FakeTask("/job:ps_backup/task:1", 46, job="ps_backup"), 1,
                         shard_live=lambda: (1, ["/job:ps/task:1"])).reason == \
        "gave up after 0 restart(s) (--max-restarts 0); ps shard 1 goes on with /job:ps/task:1 (not restarted)"
    def not_asked() -> tuple[int, list[str]]:
        raise AssertionError("a member restarted needs no live members (reading them waits 0.2 s)")
    restarted = Supervisor(RestartConfig("on-failure"), restart=lambda task: task).on_exit(
        FakeTask("/job:ps/task:0", 47, job="ps"), 1, shard_live=not_asked)
    assert (restarted.restart, restarted.goes_on) == (True, False)  # a policy that restarts it still does
