"""When a chaos fault recovered (psflow.launch.fault_recovery): the steps a loaded run of
test_multihost.py::test_chaos_kills_tasks_on_their_own_hosts_and_the_run_recovers went through.

That run killed ps task 0 at step 319; the restored global_step jumped to 1,000 (the journal's bound) and
that jump was taken for "advancing again"; its worker fault then never recovered: the worker's replacement
had nothing left to train, and nothing moved global_step after it started.
"""

from __future__ import annotations

from dataclasses import replace

from psflow.launch.chaos import InjectedFault
from psflow.launch.fault_recovery import (
    RecoveryWatch,
    Replacement,
    StepReading,
    final_reading,
    primary_reading,
    step_reading,
)


def _fault(task: str, pid: int, at_step: int) -> InjectedFault:
    return InjectedFault(f"kill:{task}", task, pid, "SIGKILL", at_step)


class _Tasks:
    """The launcher's view of each killed task's replacement, set by the test."""

    def __init__(self) -> None:
        self.state: dict[str, Replacement] = {}

    def __call__(self, task: str, killed_pid: int) -> Replacement:
        return self.state.get(task, Replacement.NONE)


def _watch(fault: InjectedFault) -> tuple[RecoveryWatch, _Tasks]:
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    watch.fired(fault, now=100.0)
    return watch, tasks


def test_a_restores_step_jump_is_no_recovery_the_first_push_after_the_restore_is() -> None:
    ps0 = _fault("/job:ps/task:0", 41, 319)
    watch, tasks = _watch(ps0)
    assert watch.observe(None, 100.5) == []                      # ps task 0 is down: nobody holds global_step
    tasks.state[ps0.task] = Replacement.RUNNING
    assert watch.observe(StepReading(0, ready=False), 101.0) == []       # restarted, empty
    assert watch.observe(StepReading(1000, ready=False), 103.0) == []    # restored past its journal's bound
    assert watch.observe(StepReading(1000, ready=True), 103.2) == []     # ready: the baseline, no step run yet
    assert watch.observe(StepReading(1000, ready=True), 103.4) == []
    assert watch.observe(StepReading(1001, ready=True), 103.6) == [ps0]  # the first push after the restore
    assert (ps0.recovered_at_step, ps0.recovery_seconds) == (1001, 3.6)
    assert watch.watching() == 0


def test_steps_before_the_replacement_runs_are_no_recovery() -> None:
    worker1 = _fault("/job:worker/task:1", 43, 1040)
    watch, tasks = _watch(worker1)
    for step in (1041, 1050, 1060):  # worker 0 trains on while worker 1 waits out its restart backoff
        assert watch.observe(StepReading(step, ready=True), 100.1) == []
    tasks.state[worker1.task] = Replacement.RUNNING
    assert watch.observe(StepReading(1061, ready=True), 100.8) == []
    assert watch.observe(StepReading(1062, ready=True), 101.0) == [worker1]
    assert worker1.recovered_at_step == 1062


def test_a_replacement_with_nothing_left_to_train_recovers_when_it_exits_0() -> None:
    worker1 = _fault("/job:worker/task:1", 43, 1040)
    watch, tasks = _watch(worker1)
    tasks.state[worker1.task] = Replacement.RUNNING
    assert watch.observe(StepReading(1040, ready=True), 101.0) == []    # the others finished: no step moves
    assert watch.observe(StepReading(1040, ready=True), 102.0) == []
    tasks.state[worker1.task] = Replacement.FINISHED                    # its data had ended: exit 0
    assert watch.observe(StepReading(1040, ready=True), 102.5) == [worker1]
    assert (worker1.recovered_at_step, worker1.recovery_seconds) == (1040, 2.5)


def test_the_run_ends_reading_settles_a_recovery_between_two_polls() -> None:
    """The replacement trained its last steps and exited between two polls: the final snapshot's reading counts."""
    worker1 = _fault("/job:worker/task:1", 43, 1040)
    watch, tasks = _watch(worker1)
    tasks.state[worker1.task] = Replacement.RUNNING
    assert watch.observe(StepReading(1040, ready=True), 101.0) == []
    tasks.state[worker1.task] = Replacement.FINISHED
    assert watch.observe(StepReading(1046, ready=True), 104.0) == [worker1]   # the snapshot's Stats
    assert worker1.recovered_at_step == 1046


def test_a_replacement_that_died_too_is_waited_for() -> None:
    worker1 = _fault("/job:worker/task:1", 43, 1040)
    watch, tasks = _watch(worker1)
    tasks.state[worker1.task] = Replacement.NONE     # its replacement exited non-zero; the next is not started
    assert watch.observe(StepReading(1100, ready=True), 105.0) == [] and watch.watching() == 1


def test_step_reading_takes_only_the_task_holding_global_step() -> None:
    assert step_reading({"global_step": 7, "ready": True}) == StepReading(7, True)
    assert step_reading({"global_step": 7}) == StepReading(7, False)
    assert step_reading({"global_step": None, "ready": True}) is None   # ps task 1: no global_step here
    assert step_reading({"global_step": True, "ready": True}) is None


def _view(*members: str) -> StepReading:
    return StepReading(240, ready=True, in_view=frozenset(members))


def test_a_restarted_shard_member_recovers_once_back_in_its_shards_view() -> None:
    """(--ps-replicas) The promoted backup trains on at once; the restarted ps task 0 is no backup yet, so a
    next round killing the new primary would lose every replica: not recovered until its view holds it."""
    ps0 = _fault("/job:ps/task:0", 41, 200)
    watch, tasks = _watch(ps0)
    tasks.state[ps0.task] = Replacement.RUNNING
    for step in (240, 250, 260):  # the promoted backup trains on; ps task 0 is starting, or rebuilding
        assert watch.observe(replace(_view("/job:ps_backup/task:0", "/job:ps/task:1"), step=step), 101.0) == []
    back = _view("/job:ps_backup/task:0", "/job:ps/task:0", "/job:ps/task:1")
    assert watch.observe(replace(back, step=270), 102.0) == []          # caught up: the baseline
    assert watch.observe(replace(back, step=271), 102.2) == [ps0]
    assert (ps0.recovered_at_step, ps0.recovery_seconds) == (271, 2.2)


def test_a_member_not_restarted_and_other_tasks_do_not_wait_for_a_view() -> None:
    backup = _fault("/job:ps_backup/task:0", 42, 20)
    worker1 = _fault("/job:worker/task:1", 43, 30)
    watch, tasks = _watch(backup)
    watch.fired(worker1, now=100.0)
    tasks.state[backup.task] = Replacement.WENT_ON    # restart policy 'never': its shard went on without it
    tasks.state[worker1.task] = Replacement.RUNNING
    assert watch.observe(_view("/job:ps/task:0"), 101.0) == []
    assert watch.observe(replace(_view("/job:ps/task:0"), step=241), 101.5) == [backup, worker1]


def test_primary_reading_names_every_member_the_primaries_views_hold() -> None:
    primaries = [{"global_step": 9, "ready": True, "replication": {"primary": "/job:ps_backup/task:0", "backups": []}},
                 {"replication": {"primary": "/job:ps/task:1", "backups": ["/job:ps_backup/task:1"]}}]
    assert primary_reading(primaries) == StepReading(9, True, in_view=frozenset(
        {"/job:ps_backup/task:0", "/job:ps/task:1", "/job:ps_backup/task:1"}))
    assert primary_reading(primaries[1:]) is None


def _final(step: int, primary: str, *backups: str) -> list[dict[str, object]]:
    """The final snapshot's Stats of a one-shard replicated run (its primary's)."""
    return [{"global_step": step, "ready": True, "replication": {"shard": 0, "role": "primary", "epoch": 2,
                                                                "primary": primary, "backups": list(backups)}}]


def test_the_runs_end_does_not_count_a_replacement_missing_from_its_shards_view() -> None:
    """(--ps-replicas) The run's end reads the shard primaries' views too: ps task 0's replacement, seen back once
    (the baseline), was out of the view at the end; the step the promoted primary trained on is no recovery.
    (Read as a plain step reading, with no view, this counted as recovered at 300.)"""
    ps0 = _fault("/job:ps/task:0", 41, 200)
    watch, tasks = _watch(ps0)
    tasks.state[ps0.task] = Replacement.RUNNING
    assert watch.observe(_view("/job:ps_backup/task:0", "/job:ps/task:0"), 102.0) == []   # the baseline, 240
    assert watch.settle(final_reading(_final(300, "/job:ps_backup/task:0"), replicated=True), 110.0) == []
    assert (ps0.recovered_at_step, ps0.to_json()["recovered"]) == (None, False)
    assert ps0.why == ("/job:ps/task:0's replacement had not rejoined its ps shard's view by the run's end: the shard "
                       "ran without it as a backup")


def test_the_runs_end_counts_a_replacement_back_in_its_shards_view_with_no_step_since() -> None:
    """Back in the view after the shard's last step: the shard trained past the fault and has its backup again."""
    ps0 = _fault("/job:ps/task:0", 41, 200)
    watch, tasks = _watch(ps0)
    tasks.state[ps0.task] = Replacement.RUNNING
    assert watch.observe(_view("/job:ps_backup/task:0"), 101.0) == []             # trained on; ps task 0 rebuilding
    assert watch.observe(_view("/job:ps_backup/task:0", "/job:ps/task:0"), 102.5) == []  # caught up at 240: baseline
    final = final_reading(_final(240, "/job:ps_backup/task:0", "/job:ps/task:0"), replicated=True)
    assert watch.settle(final, 110.0) == [ps0]
    assert (ps0.recovered_at_step, ps0.recovery_seconds, ps0.why) == (240, 2.5, None)   # as of the reading that saw it


def test_the_runs_end_says_why_a_fault_is_not_recovered() -> None:
    worker1 = _fault("/job:worker/task:1", 43, 1040)
    ps1 = _fault("/job:ps/task:1", 44, 1040)
    watch, tasks = _watch(worker1)
    watch.fired(ps1, now=100.0)
    tasks.state[ps1.task] = Replacement.RUNNING
    final = final_reading([{"global_step": None}, {"global_step": 1050, "ready": True}], replicated=False)
    assert final == StepReading(1050, True)
    assert watch.settle(final, 110.0) == [] and watch.watching() == 2
    assert worker1.why == "/job:worker/task:1 was not running again by the run's end"
    assert ps1.why == "global_step did not advance past 1050 after /job:ps/task:1's replacement started"
    assert [f.to_json()["recovered"] for f in (worker1, ps1)] == [False, False]


def test_a_ps_faults_steps_before_the_restore_are_no_recovery() -> None:
    """ps task 1 killed (with the chief: nobody restores until its lease lapses): the step task, ps task 0, stays
    ready at its generation and in-flight pushes move global_step from 123 to 125 after ps task 1's replacement
    started. Before, that was 'recovered at global_step 125, 1.72 s after the fault'; the restore came at 10 s."""
    ps1 = _fault("/job:ps/task:1", 21, 123)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    assert watch.observe(StepReading(123, ready=True, generation=5), 99.9) == []
    watch.fired(ps1, now=100.0)
    tasks.state["/job:ps/task:1"] = Replacement.RUNNING
    for now, step in ((100.6, 123), (101.0, 124), (101.7, 125), (105.0, 125)):
        assert watch.observe(StepReading(step, ready=True, generation=5), now) == []
    assert watch.observe(StepReading(125, ready=False, generation=9), 110.0) == []   # restoring
    assert watch.observe(StepReading(125, ready=True, generation=9), 110.1) == []    # restored: the baseline
    assert watch.observe(StepReading(126, ready=True, generation=9), 110.3) == [ps1]
    assert (ps1.recovered_at_step, ps1.recovery_seconds) == (126, 10.3)


def test_a_worker_fault_is_not_held_to_a_generation() -> None:
    worker1 = _fault("/job:worker/task:1", 22, 40)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    assert watch.observe(StepReading(40, ready=True, generation=5), 99.9) == []
    watch.fired(worker1, now=100.0)
    tasks.state["/job:worker/task:1"] = Replacement.RUNNING
    assert watch.observe(StepReading(41, ready=True, generation=5), 100.5) == []
    assert watch.observe(StepReading(42, ready=True, generation=5), 100.7) == [worker1]


def test_step_reading_takes_the_generation() -> None:
    assert step_reading({"global_step": 7, "ready": True, "generation": 3}) == StepReading(7, True, generation=3)


def test_a_chief_killed_with_a_ps_task_recovers_only_after_the_restore() -> None:
    """kill:ps:1 and kill:chief in one round: the chief's replacement runs at once and in-flight pushes move
    global_step while the cluster waits for the dead chief's lease to lapse before it restores ps task 1's empty
    replacement. Before, the chief's fault said 'recovered at global_step 105, 2.28 s' (the restore came at ~10 s)."""
    ps1, chief = _fault("/job:ps/task:1", 21, 100), _fault("/job:worker/task:0", 22, 100)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    assert watch.observe(StepReading(100, ready=True, generation=5), 99.9) == []
    watch.fired(ps1, now=100.0)
    watch.fired(chief, now=100.0)
    tasks.state[ps1.task] = tasks.state[chief.task] = Replacement.RUNNING
    for now, step in ((100.6, 101), (101.0, 103), (102.3, 105), (105.0, 105)):
        assert watch.observe(StepReading(step, ready=True, generation=5), now) == []
    assert watch.observe(StepReading(105, ready=True, generation=9), 110.1) == []    # restored: the baseline
    assert watch.observe(StepReading(107, ready=True, generation=9), 110.3) == [ps1, chief]
    assert (chief.recovered_at_step, chief.recovery_seconds) == (107, 10.3)


def test_a_ps_fault_never_restored_says_so_at_the_runs_end() -> None:
    """ps task 1 killed as training ended: nobody restored its empty replacement; pushes in flight moved
    global_step, so 'did not advance past' was not what happened."""
    ps1 = _fault("/job:ps/task:1", 21, 200)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    assert watch.observe(StepReading(200, ready=True, generation=5), 99.9) == []
    watch.fired(ps1, now=100.0)
    tasks.state[ps1.task] = Replacement.RUNNING
    assert watch.settle(StepReading(203, ready=True, generation=5), 110.0) == []
    assert ps1.why == ("the cluster was not restored after /job:ps/task:1's replacement started "
                       "(the step task still at generation 5, global_step 203)")


def test_a_fault_fired_on_the_first_reading_takes_that_readings_generation() -> None:
    """The chaos thread's first reading may already be past the fault's step (training outran its connect), and
    the fault fires on a fresh reading taken with the trainers held: no reading was observed before it. Seen: a
    run killing ps:1 and chief at step 60, first read at 67, said 'recovered at global_step 68, 2.32 s' (as
    before a212476); the restore came at 7.5 s, at global_step 68."""
    ps1, chief = _fault("/job:ps/task:1", 21, 67), _fault("/job:worker/task:0", 22, 67)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    fired_on = StepReading(67, ready=True, generation=0)
    watch.fired(ps1, now=100.0, reading=fired_on)
    watch.fired(chief, now=100.0, reading=fired_on)
    tasks.state[ps1.task] = tasks.state[chief.task] = Replacement.RUNNING
    for now, step in ((100.5, 67), (102.3, 68)):
        assert watch.observe(StepReading(step, ready=True, generation=0), now) == []
    assert watch.observe(StepReading(68, ready=True, generation=7), 107.6) == []
    assert watch.observe(StepReading(69, ready=True, generation=7), 107.8) == [ps1, chief]


def test_a_ps_fault_fired_while_the_step_task_was_not_ready_is_not_held_to_that_generation() -> None:
    """A resumed run: the chief restores the checkpoint at start at generation 0 (no BeginRestore), global_step
    already the checkpoint's while ps task 0 is not ready, and a fault due by then fires on that reading. ps task 1
    killed in the middle of that restore is initialized again with the others by the chief's next try, at
    generation 0 again: no restore at a new generation ever comes, and the cluster trains. Held to generation 0,
    the fault never recovered and held back every later round."""
    ps1, worker1 = _fault("/job:ps/task:1", 21, 1200), _fault("/job:worker/task:1", 22, 1200)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    restoring = StepReading(1200, ready=False, generation=0)
    assert watch.observe(restoring, 99.9) == []
    watch.fired(ps1, now=100.0, reading=restoring)
    watch.fired(worker1, now=100.0, reading=restoring)
    tasks.state[ps1.task] = tasks.state[worker1.task] = Replacement.RUNNING
    assert watch.observe(StepReading(1200, ready=False, generation=0), 101.0) == []
    assert watch.observe(StepReading(1200, ready=True, generation=0), 102.0) == []   # ready: the baseline
    assert watch.observe(StepReading(1201, ready=True, generation=0), 102.2) == [ps1, worker1]


def test_a_ps_fault_whose_replacement_never_started_says_so_not_that_it_started() -> None:
    """The run ended before ps task 1's replacement ran (its restart still in its backoff): the why names that,
    for the ps fault and for the worker fault of its round, never 'after ...'s replacement started'."""
    ps1, worker1 = _fault("/job:ps/task:1", 21, 200), _fault("/job:worker/task:1", 22, 200)
    tasks = _Tasks()
    watch = RecoveryWatch(tasks)
    assert watch.observe(StepReading(200, ready=True, generation=5), 99.9) == []
    watch.fired(ps1, now=100.0)
    watch.fired(worker1, now=100.0)
    tasks.state[worker1.task] = Replacement.RUNNING
    assert watch.settle(StepReading(203, ready=True, generation=5), 110.0) == []
    assert ps1.why == "/job:ps/task:1 was not running again by the run's end"
    assert worker1.why == ("the cluster was not restored: /job:ps/task:1 was not running again by the run's end "
                           "(the step task still at generation 5, global_step 203)")
