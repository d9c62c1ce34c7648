"""Restart policy, chaos specs: pure logic, no processes."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

import pytest

from psflow.cluster import ClusterSpec
from psflow.launch.chaos import ChaosInjector
from psflow.launch.chaos_plan import ChaosError, ChaosPlan, Fault, stop_without_liveness
from psflow.launch.supervisor import RestartConfig, Supervisor, decide, describe_exit

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})


# ---- restart policy -----------------------------------------------------------
def test_never_restarts_nothing() -> None:
    d = decide(RestartConfig("never"), -9, 0)
    assert not d.restart and "never" in d.reason


def test_on_failure_restarts_failures_with_capped_exponential_backoff() -> None:
    config = RestartConfig("on-failure", max_restarts=6, backoff_initial=0.5, backoff_factor=2.0, backoff_max=3.0)
    delays = [decide(config, 1, n).delay for n in range(6)]
    assert delays == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert decide(config, -signal.SIGKILL, 0).restart
    assert not decide(config, 0, 0).restart                      # a clean exit is done
    last = decide(config, 1, 6)
    assert not last.restart and last.reason == "gave up after 6 restart(s) (--max-restarts 6)"


def test_always_restarts_clean_exits_too() -> None:
    assert decide(RestartConfig("always"), 0, 0).restart


@pytest.mark.parametrize("kwargs", [{"policy": "sometimes"}, {"max_restarts": -1}, {"backoff_initial": -1.0},
                                    {"backoff_initial": 5.0, "backoff_max": 1.0}, {"backoff_factor": 0.5}])
def test_bad_restart_config_is_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        RestartConfig(**kwargs)  # type: ignore[arg-type]


def test_describe_exit() -> None:
    assert describe_exit(3) == "exited with code 3"
    assert describe_exit(-signal.SIGKILL) == "was killed by signal SIGKILL"


@dataclass
class FakeTask:
    name: str
    pid: int


def test_supervisor_schedules_restarts_after_the_backoff_and_gives_up_at_the_limit() -> None:
    now = [0.0]
    restarted: list[FakeTask] = []

    def restart(task: FakeTask) -> FakeTask:
        new = FakeTask(task.name, task.pid + 100)
        restarted.append(new)
        return new

    sup = Supervisor(RestartConfig("on-failure", max_restarts=2, backoff_initial=1.0), restart, clock=lambda: now[0])
    task = FakeTask("/job:worker/task:1", 10)
    assert sup.on_exit(task, -9).restart
    assert sup.restart_due() == [] and sup.pending() == 1
    now[0] = 1.0
    (new,) = sup.restart_due()
    assert new.pid == 110 and sup.events[0].new_pid == 110 and sup.events[0].exit == "was killed by signal SIGKILL"
    assert sup.on_exit(new, 1).delay == 2.0
    now[0] = 3.0
    (newer,) = sup.restart_due()
    final = sup.on_exit(newer, 1)
    assert not final.restart and "gave up after 2" in final.reason
    assert [e.restarted for e in sup.events] == [True, True, False]


def test_a_restart_the_launcher_refuses_is_not_scheduled_and_its_reason_recorded() -> None:
    sup = Supervisor(RestartConfig("on-failure"), lambda task: task)
    why = "3 checkpoint saves failed in a row (--max-failed-saves 3): not restarted, the run stops"
    decision = sup.on_exit(FakeTask("/job:worker/task:1", 10), 1, refuse=why)
    assert not decision.restart and decision.reason == why and sup.pending() == 0
    assert (sup.events[0].decision, sup.events[0].restarted) == (why, False)
    never = Supervisor(RestartConfig("never"), lambda task: task).on_exit(FakeTask("/job:worker/task:1", 11), 1,
                                                                          refuse=why)
    assert never.reason == "restart policy is 'never'"  # not restarted anyway: the policy's reason stands


# ---- chaos specs ----------------------------------------------------------------
def test_parse_specs() -> None:
    plan = ChaosPlan.parse(["kill:ps:1@step=200", "kill:chief@step=50", " stop:worker:0@step=3 "])
    assert plan.faults == (
        Fault("kill:ps:1@step=200", "kill", "ps", 1, 200),
        Fault("kill:chief@step=50", "kill", None, None, 50),
        Fault("stop:worker:0@step=3", "stop", "worker", 0, 3),
    )
    assert plan.faults[2].signal == signal.SIGSTOP
    assert not ChaosPlan.parse([])


@pytest.mark.parametrize("spec, message", [
    ("kill:ps:1", "expected ACTION:JOB:INDEX@step=N"),
    ("kill:ps@step=3", "expected ACTION"),
    ("kill:ps:x@step=3", "expected ACTION"),
    ("kill:ps:1@step=-3", "expected ACTION"),
    ("kill:ps:1@step=0", "step must be >= 1"),
    ("pause:ps:1@step=3", "unknown action 'pause' .known: kill, stop"),
    ("", "expected ACTION"),
])
def test_bad_specs_name_the_spec_and_the_problem(spec: str, message: str) -> None:
    with pytest.raises(ChaosError, match=message):
        ChaosPlan.parse(["kill:ps:0@step=1", spec])


def test_specs_naming_missing_tasks_are_refused_against_the_cluster() -> None:
    with pytest.raises(ChaosError, match=r"kill:ps:2@step=5.*no task 2 in job 'ps'"):
        ChaosPlan.parse(["kill:ps:2@step=5"]).resolve(CLUSTER)
    with pytest.raises(ChaosError, match="evaluator"):
        ChaosPlan.parse(["kill:evaluator:0@step=5"]).resolve(CLUSTER)


def test_chief_is_worker_0_without_a_chief_job_and_the_chief_task_with_one() -> None:
    assert ChaosPlan.parse(["kill:chief@step=1"]).resolve(CLUSTER)[0][1:] == ("worker", 0)
    with_chief = ClusterSpec({"chief": ["127.0.0.1:9"], "ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3"]})
    assert ChaosPlan.parse(["kill:chief@step=1"]).resolve(with_chief)[0][1:] == ("chief", 0)


def test_injector_fires_each_fault_once_when_the_step_is_reached() -> None:
    sent: list[tuple[int, int]] = []
    tasks = {("ps", 1): FakeTask("/job:ps/task:1", 41), ("worker", 0): FakeTask("/job:worker/task:0", 42)}
    running = {("ps", 1): True, ("worker", 0): False}

    def find(job: str, index: int) -> FakeTask | None:
        return tasks[(job, index)] if running[(job, index)] else None

    plan = ChaosPlan.parse(["kill:ps:1@step=10", "stop:chief@step=12"])
    injector = ChaosInjector(plan, CLUSTER, find, send=lambda pid, sig: sent.append((pid, sig)))
    assert injector.poll(9) == [] and sent == []
    (fired,) = injector.poll(11)
    assert (fired.task, fired.pid, fired.signal, fired.at_step) == ("/job:ps/task:1", 41, "SIGKILL", 11)
    assert injector.poll(13) == []               # the next round waits for the first fault's recovery
    fired.recovered_at_step = 20                 # (the launcher records it)
    assert injector.due_at() == 22               # the spacing, 12 - 10, counted from the recovery
    assert injector.poll(22) == []               # worker 0 not running: waits for it
    running[("worker", 0)] = True
    assert [f.signal for f in injector.poll(22)] == ["SIGSTOP"]
    assert injector.poll(100) == [] and injector.pending() == 0
    assert sent == [(41, signal.SIGKILL), (42, signal.SIGSTOP)]


def _injector(specs: list[str], sent: list[tuple[int, int]], cluster: ClusterSpec = CLUSTER) -> ChaosInjector:
    pids = {("ps", 0): 40, ("ps", 1): 41, ("worker", 0): 42, ("worker", 1): 43, ("chief", 0): 44}
    names = {key: f"/job:{key[0]}/task:{key[1]}" for key in pids}
    return ChaosInjector(ChaosPlan.parse(specs), cluster, lambda job, i: FakeTask(names[(job, i)], pids[(job, i)]),
                         send=lambda pid, sig: sent.append((pid, sig)))


def test_a_step_jump_after_a_ps_0_restore_does_not_fire_the_later_faults_at_once() -> None:
    """Killing ps 0 at step 100 makes global_step jump (here to 1,100): the worker kill 200 steps
    later fires 200 steps after the recovery, and the chief kill 100 steps after that one's."""
    sent: list[tuple[int, int]] = []
    injector = _injector(["kill:chief@step=400", "kill:ps:0@step=100", "kill:worker:1@step=300"], sent)
    (ps0,) = injector.poll(100)
    assert ps0.task == "/job:ps/task:0" and injector.pending() == 2
    assert injector.poll(1_100) == [] and injector.poll(5_000) == []   # the jump: nothing fires before the recovery
    ps0.recovered_at_step = 1_105
    assert injector.due_at() == 1_305 and injector.poll(1_304) == []
    (w1,) = injector.poll(1_306)
    assert (w1.task, w1.at_step) == ("/job:worker/task:1", 1_306)
    w1.recovered_at_step = 1_350
    assert injector.poll(1_449) == []
    (chief,) = injector.poll(1_450)
    assert chief.task == "/job:worker/task:0" and injector.pending() == 0
    assert sent == [(40, signal.SIGKILL), (43, signal.SIGKILL), (42, signal.SIGKILL)]


def test_faults_of_one_step_fire_together_and_the_next_round_waits_for_all_of_them() -> None:
    sent: list[tuple[int, int]] = []
    injector = _injector(["kill:ps:1@step=50", "stop:worker:1@step=50", "kill:ps:1@step=60"], sent)
    first = injector.poll(50)
    assert [f.task for f in first] == ["/job:ps/task:1", "/job:worker/task:1"]
    first[0].recovered_at_step = 70
    assert injector.due_at() is None and injector.poll(1_000) == []   # worker 1 has not recovered yet
    first[1].recovered_at_step = 90
    assert injector.due_at() == 100   # the later of the two recoveries, plus 60 - 50
    (again,) = injector.poll(100)
    assert again.spec == "kill:ps:1@step=60"   # the same task in a later round: allowed, hits its replacement
    assert sent == [(41, signal.SIGKILL), (43, signal.SIGSTOP), (41, signal.SIGKILL)]


@pytest.mark.parametrize(("specs", "named"), [
    (["kill:worker:0@step=100", "kill:chief@step=100"], "both name /job:worker/task:0 at step 100 (the chief is worker 0"),
    (["stop:ps:1@step=7", "kill:ps:1@step=7"], "both name /job:ps/task:1 at step 7: one process"),
    (["kill:ps:0@step=5", "kill:ps:0@step=5"], "both name /job:ps/task:0"),
])
def test_two_faults_naming_one_process_in_one_round_are_refused_naming_both_specs(specs: list[str], named: str) -> None:
    with pytest.raises(ChaosError) as e:
        _injector(specs, [])
    message = str(e.value)
    assert named in message and all(repr(s) in message for s in specs), message


def test_the_chief_job_is_not_worker_0_where_there_is_one() -> None:
    with_chief = ClusterSpec({"chief": ["127.0.0.1:9"], "ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3"]})
    injector = _injector(["kill:worker:0@step=100", "kill:chief@step=100"], sent := [], with_chief)
    assert [f.task for f in injector.poll(100)] == ["/job:worker/task:0", "/job:chief/task:0"]
    assert sent == [(42, signal.SIGKILL), (44, signal.SIGKILL)]


@pytest.mark.parametrize("spec", ["stop:worker:0@step=30:10s", "stop:worker:0@step=30,5", "kill:ps:1@step=7s"])
def test_a_spec_with_a_duration_is_refused_saying_a_fault_takes_none(spec: str) -> None:
    with pytest.raises(ChaosError, match=rf"bad --chaos '{re.escape(spec)}': nothing may follow @step=\d+ .*"
                                         r"a fault takes no duration"):
        ChaosPlan.parse([spec])


def test_a_stop_without_hang_detection_is_said_at_the_start() -> None:
    plan = ChaosPlan.parse(["kill:ps:1@step=10", "stop:worker:0@step=30"])
    assert stop_without_liveness(plan, hang_detection=True) is None
    assert stop_without_liveness(ChaosPlan.parse(["kill:ps:1@step=10"]), hang_detection=False) is None
    line = stop_without_liveness(plan, hang_detection=False)
    assert line is not None and line.startswith("psflow: --chaos stop:worker:0@step=30 with --liveness-timeout 0: ")
    assert "the run waits until it is resumed (kill -CONT PID)" in line
