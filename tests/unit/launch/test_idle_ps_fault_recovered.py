"""A chaos kill of an idle ps task (one holding no variables: psflow.train.idle_tasks) recovered when its replacement
is ready again at the cluster's generation (readmitted, nothing restored), not "the cluster was not restored".

Seen after 7870699: ``psflow train ... --ps 4 --model logistic --chaos kill:ps:3@step=30`` trained on with ps task 3
readmitted at the cluster's generation, and the chaos summary said ``not recovered: the cluster was not restored
after /job:ps/task:3's replacement started``: a restore was taken as owed while the step task stayed at the
generation read before the fault, and no restore ever comes for an idle task.
"""

from __future__ import annotations

from typing import Any

from psflow.launch.chaos import InjectedFault
from psflow.launch.fault_recovery import RecoveryWatch, Replacement, StepReading, final_reading, poll_reading
from psflow.rpc.api import RpcError
from psflow.rpc.framing import Frame

PS0, PS1, PS3 = "/job:ps/task:0", "/job:ps/task:1", "/job:ps/task:3"


def _fault(task: str, pid: int, at_step: int) -> InjectedFault:
    return InjectedFault(f"kill:{task}", task, pid, "SIGKILL", at_step)


class _Tasks:
    def __init__(self) -> None:
        self.state: dict[str, Replacement] = {}

    def __call__(self, task: str, killed_pid: int) -> Replacement:
        return self.state.get(task, Replacement.NONE)


def _at5(step: int, *ready: str) -> StepReading:
    return StepReading(step, ready=True, generation=5, ready_members=frozenset((t, 5) for t in ready))


def test_an_idle_task_readmitted_at_the_clusters_generation_recovered() -> None:
    ps3, worker1 = _fault(PS3, 31, 30), _fault("/job:worker/task:1", 32, 30)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    watch.fired(ps3, now=100.0, reading=_at5(30, PS0))
    watch.fired(worker1, now=100.0, reading=_at5(30, PS0))
    assert watch.ps_tasks() == frozenset()  # no replacement runs yet: nothing to ask
    tasks.state[PS3] = tasks.state[worker1.task] = Replacement.RUNNING
    assert watch.ps_tasks() == frozenset({PS3})  # the chaos thread asks its Stats too
    assert watch.observe(_at5(31, PS0), 101.0) == []  # ps 3 restarted, not ready: training goes on at generation 5
    assert watch.observe(_at5(33, PS0), 101.5) == []
    assert watch.observe(_at5(35, PS0, PS3), 102.0) == [ps3]  # readmitted at generation 5: recovered; the baseline
    assert (ps3.recovered_at_step, ps3.recovery_seconds, ps3.how) == (35, 2.0, "readmitted, nothing restored")
    assert watch.observe(_at5(36, PS0, PS3), 102.2) == [worker1]  # the restore no longer owed: trains again
    assert worker1.how is None and watch.watching() == 0


def test_ready_at_another_generation_is_a_restore_not_a_readmission() -> None:
    """ps task 1 held variables: the cluster was restored (generation 9); its readiness there is no readmission."""
    ps1 = _fault(PS1, 21, 30)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    watch.fired(ps1, now=100.0, reading=_at5(30, PS0, PS1))
    tasks.state[PS1] = Replacement.RUNNING
    assert watch.observe(StepReading(31, ready=True, generation=5, ready_members=frozenset({(PS1, 0)})), 101) == []
    restored = frozenset({(PS0, 9), (PS1, 9)})
    assert watch.observe(StepReading(31, ready=True, generation=9, ready_members=restored), 105.0) == []
    assert watch.observe(StepReading(32, ready=True, generation=9, ready_members=restored), 105.2) == [ps1]
    assert ps1.how is None


def test_the_runs_end_reads_every_ps_tasks_stats_for_a_readmission() -> None:
    """Readmitted after the chaos thread's last poll (or the kill in the run's last steps): the final snapshot's
    Stats of every ps task settle it, recovered, never 'the cluster was not restored'."""
    ps3 = _fault(PS3, 31, 60)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    watch.fired(ps3, now=100.0, reading=_at5(60, PS0))
    tasks.state[PS3] = Replacement.RUNNING
    stats: list[dict[str, Any]] = [{"task": PS0, "global_step": 70, "ready": True, "generation": 5},
                                   {"task": PS1, "ready": True, "generation": 5},
                                   {"task": PS3, "ready": True, "generation": 5}]
    reading = final_reading(stats, replicated=False)
    assert reading is not None and reading.ready_members == frozenset({(PS0, 5), (PS1, 5), (PS3, 5)})
    assert watch.settle(reading, 110.0) == [ps3]
    assert (ps3.recovered_at_step, ps3.why, ps3.how) == (70, None, "readmitted, nothing restored")
    summary_outcome = ps3.to_json()
    assert summary_outcome["recovered"] is True and summary_outcome["how"] == "readmitted, nothing restored"


def test_an_idle_task_never_readmitted_is_still_not_recovered() -> None:
    ps3 = _fault(PS3, 31, 60)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    watch.fired(ps3, now=100.0, reading=_at5(60, PS0))
    tasks.state[PS3] = Replacement.RUNNING
    stats = [{"task": PS0, "global_step": 70, "ready": True, "generation": 5}, {"task": PS3, "ready": False}]
    assert watch.settle(final_reading(stats, replicated=False), 110.0) == []
    assert ps3.why == ("the cluster was not restored after /job:ps/task:3's replacement started "
                       "(the step task still at generation 5, global_step 70)")


class _Channel:
    def __init__(self, task: str, meta: dict[str, Any] | None) -> None:
        self.task, self.meta, self.calls = task, meta, 0

    def call(self, method: str, meta: dict[str, Any] | None = None, **_: Any) -> Frame:
        assert method == "Stats"
        self.calls += 1
        if self.meta is None:
            raise RpcError(f"{self.task}: unavailable")
        return Frame(self.meta)

    def reconnect(self) -> None:
        pass


def test_a_poll_asks_the_watched_ps_tasks_too_and_names_those_ready() -> None:
    ps0 = _Channel(PS0, {"task": PS0, "global_step": 40, "ready": True, "generation": 5})
    ps1 = _Channel(PS1, {"task": PS1, "ready": True, "generation": 5})
    ps3 = _Channel(PS3, {"task": PS3, "ready": True, "generation": 5})
    reading = poll_reading([ps0, ps1, ps3])  # type: ignore[list-item]
    assert reading is not None and (ps1.calls, ps3.calls) == (0, 0)  # nothing watched: the step task alone
    reading = poll_reading([ps0, ps1, ps3], also=frozenset({PS3}))  # type: ignore[list-item]
    assert reading is not None and (reading.step, ps1.calls, ps3.calls) == (40, 0, 1)
    assert reading.ready_members == frozenset({(PS0, 5), (PS3, 5)}) and reading.answered == {PS0, PS3}
    ps3.meta = None  # down: not named, not answered
    reading = poll_reading([ps0, ps1, ps3], also=frozenset({PS3}))  # type: ignore[list-item]
    assert reading is not None and reading.ready_members == frozenset({(PS0, 5)}) and reading.answered == {PS0}


def test_a_stopped_ps_task_is_not_asked_until_a_replacement_runs() -> None:
    """``stop:ps:3`` SIGSTOPs task 3, and nothing replaces it until hang detection kills it (``--liveness-timeout``,
    30 s by default; never with 0): its ``Stats`` waited out the chaos channel's rpc_timeout (1 s) at every poll
    (every 5 ms otherwise), so a later fault fired up to a second late (a thousand steps on a small data set).
    Only a running replacement can be readmitted: the stopped process is not asked."""
    ps3 = InjectedFault("stop:ps:3", PS3, 31, "SIGSTOP", 30)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    watch.fired(ps3, now=100.0, reading=_at5(30, PS0))
    ps0 = _Channel(PS0, {"task": PS0, "global_step": 40, "ready": True, "generation": 5})
    stopped = _Channel(PS3, None)
    reading = poll_reading([ps0, stopped], also=watch.ps_tasks())  # type: ignore[list-item]
    assert reading is not None and reading.step == 40 and stopped.calls == 0
    tasks.state[PS3] = Replacement.RUNNING  # hang detection killed it; its replacement started
    stopped.meta = {"task": PS3, "ready": True, "generation": 5}
    reading = poll_reading([ps0, stopped], also=watch.ps_tasks())  # type: ignore[list-item]
    assert reading is not None and stopped.calls == 1 and (PS3, 5) in reading.ready_members
    assert watch.observe(reading, 131.0) == [ps3] and ps3.how == "readmitted, nothing restored"
