"""What a finished run's end says of a ps task gone after its watch returned: when it exited, and what became
of its restart (psflow.launch.final_model.gone_after_training, Supervisor.cancel_pending).

Found checking final_model.py (task H4): a ps task that died before training ended, its restart still in its
backoff when the last worker finished, was said to have exited "after training and was not restarted", while
status.json and the page kept it "restarting" and metrics.json's restart event said "restart 1 of 3 in 2.0 s",
restarted: true, a restart never made. And with --ps-replicas, "every member of shard K exited after training"
covered a member that died DURING training while its shard went on with its backup. Exit codes and the
supervisor's own events only (no process, no call).
"""

from __future__ import annotations

import signal
from types import SimpleNamespace
from typing import Any

from psflow.cluster.spec import ClusterSpec
from psflow.launch.final_model import gone_after_training
from psflow.launch.supervisor import RestartConfig, Supervisor

KILLED = -int(signal.SIGKILL)


def _task(job: str, index: int, code: int | None, pid: int) -> Any:
    return SimpleNamespace(name=f"/job:{job}/task:{index}", job=job, index=index, pid=pid,
                           exit_code=code, popen=SimpleNamespace(poll=lambda: code))


def _lc(tasks: list[Any], supervisor: Supervisor, backups: int = 0) -> Any:
    spec = {"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3"]}
    if backups:
        spec["ps_backup"] = [f"127.0.0.1:{10 + i}" for i in range(backups)]
    return SimpleNamespace(cluster=ClusterSpec(spec), tasks=tasks, resilience=SimpleNamespace(supervisor=supervisor))


def test_a_restart_still_in_its_backoff_when_training_ended_is_said_not_made() -> None:
    supervisor = Supervisor(RestartConfig("on-failure", max_restarts=3), restart=lambda t: t, clock=lambda: 0.0)
    dead = _task("ps", 1, KILLED, pid=41)
    assert supervisor.on_exit(dead, KILLED).restart      # scheduled, in its backoff
    gone = gone_after_training(_lc([_task("ps", 0, None, 40), dead, _task("worker", 0, 0, 42)], supervisor))
    assert gone["/job:ps/task:1"]["error"] == (
        "/job:ps/task:1 was killed by signal SIGKILL before training ended; its restart (restart 1 of 3 in 0.5 s) was "
        "still in its backoff when training ended and was not made")
    # nothing restarts it now, and what the end reports of it says so: not 'restarting', not 'restarted'
    assert not supervisor.scheduled("/job:ps/task:1") and supervisor.pending() == 0
    event = supervisor.events[0].to_json()
    assert event["restarted"] is False and event["new_pid"] is None
    assert event["decision"] == "restart 1 of 3 in 0.5 s; not made: training ended first"
    assert supervisor.restart_due() == []


def test_a_task_that_exited_after_the_watch_returned_is_said_after_training() -> None:
    supervisor = Supervisor(RestartConfig("on-failure"), restart=lambda t: t)
    gone = gone_after_training(_lc([_task("ps", 0, None, 40), _task("ps", 1, KILLED, 41)], supervisor))
    assert gone["/job:ps/task:1"]["error"] == "/job:ps/task:1 was killed by signal SIGKILL after training and was not restarted"


def test_a_shard_member_dead_during_training_is_said_apart_from_one_dead_after() -> None:
    supervisor = Supervisor(RestartConfig("never"), restart=lambda t: t)
    primary = _task("ps", 1, KILLED, pid=41)
    decision = supervisor.on_exit(primary, KILLED, shard_live=lambda: (1, ["/job:ps_backup/task:1"]))
    assert decision.goes_on
    tasks = [_task("ps", 0, None, 40), primary, _task("ps_backup", 0, None, 50), _task("ps_backup", 1, 1, 51)]
    gone = gone_after_training(_lc(tasks, supervisor, backups=2))
    assert gone["/job:ps/task:1"]["error"] == (
        "every member of shard 1 exited, none restarted: /job:ps/task:1 was killed by signal SIGKILL during training "
        "(its shard went on without it); /job:ps_backup/task:1 exited with code 1 after training")


def test_every_member_dead_after_training_keeps_the_one_clause() -> None:
    supervisor = Supervisor(RestartConfig("never"), restart=lambda t: t)
    tasks = [_task("ps", 0, None, 40), _task("ps", 1, KILLED, 41), _task("ps_backup", 0, None, 50),
             _task("ps_backup", 1, 1, 51)]
    gone = gone_after_training(_lc(tasks, supervisor, backups=2))
    assert gone["/job:ps/task:1"]["error"] == (
        "every member of shard 1 exited after training, none restarted (/job:ps/task:1 was killed by signal SIGKILL, "
        "/job:ps_backup/task:1 exited with code 1)")


def test_a_restart_in_its_backoff_when_the_run_stops_is_not_reported_under_way() -> None:
    """A failed or interrupted run stops its tasks (LocalCluster.stop_all closes the Resilience): a restart then in
    its backoff is never made, and status.json's task state reads the supervisor (run_status: ``restarting`` while
    one is scheduled): it must read ``dead``."""
    from launched_tasks import FakeCluster, FakeTask

    from psflow.launch.resilience import Resilience, ResilienceConfig
    cluster = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3"]})
    dead = FakeTask("ps", 0, 1 << 30, exit_code=KILLED)
    resilience = Resilience(FakeCluster(cluster, [dead]), ResilienceConfig(restart=RestartConfig("on-failure"), health=None))
    assert resilience.on_exit(dead) and resilience.supervisor.scheduled("/job:ps/task:0")
    resilience.close()
    assert not resilience.supervisor.scheduled("/job:ps/task:0")
    assert resilience.metrics()["restarts"][0]["decision"].endswith("; not made: the run's tasks were stopped first")


def test_a_restart_not_made_is_not_counted_in_the_tasks_restarts() -> None:
    """status.json's task row (and metrics.prom's psflow_task_restarts_total) count the restarts of a task's process
    (run_status: Supervisor.restarts, counted where a restart is scheduled): one dropped in its backoff was never
    made, so the task reads dead with 0 restarts, not dead with 1 and no restart in its history."""
    from launched_tasks import FakeCluster, FakeTask

    from psflow.launch.resilience import Resilience, ResilienceConfig
    from psflow.launch.run_status import LauncherStatus
    cluster = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3"]})
    dead = FakeTask("ps", 0, 1 << 30, exit_code=KILLED)
    lc = FakeCluster(cluster, [dead])
    lc.resilience = Resilience(lc, ResilienceConfig(restart=RestartConfig("on-failure"), health=None))
    assert lc.resilience.on_exit(dead)
    lc.resilience.close()
    row = LauncherStatus._processes(SimpleNamespace(_lc=lc))
    assert (row["/job:ps/task:0"].state, row["/job:ps/task:0"].restarts) == ("dead", 0), row
