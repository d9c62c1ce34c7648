"""The summary hook reads the cluster's last restore (its generation: the SessionLog START it owes) from ps task 0's
Stats. A ps task 0 not ready says nothing of it: restarted and not loaded yet (generation 0, as a cluster that was
never restored), or in a restore (the new generation, set by BeginRestore, before the restore's loads and SetReady).
The hook took either as the cluster's state:

* generation 0: "no restore", so a worker taking the chief duties then wrote no START for the restore before, which
  nobody led through (the holder that restored was lost, or its lease lapsed), and wrote its points after the
  discarded model's. At a worker's end (its final point; no later restore's START comes to drop it) that lasted:
  TensorBoard drew the restored run's curve joined to the discarded one, for good;
* the new generation: a START for a restore not done, at the newest checkpoint's step, and the points of the
  steps taken before that restore written after it (TensorBoard keeps them); the restore's own START, once it
  settled, was found written already, so nothing dropped them: the discarded model's point stayed for good.

Now a ps task 0 that is not ready (or cannot be read) leaves the generation to the one every other ready task is at
(a restore sets every task to one generation; ps task 0, which holds global_step, is made ready last), and where none
can tell, the hook does not decide: it asks again before its next point and writes the START owed once it is known.
Its final point is at the session's global_step where ps task 0 cannot say (a restarted ps task 0's 0 put it before
every point, and TensorBoard, reading a step that goes back, dropped the whole curve past it).

Real in-process ps services (tests/two_ps_in_process.py) restarted and restored by ClusterRecovery, the lease set by
the test, the real SummarySaverHook behind LeaderOnlyHook; read back with TensorBoard's EventAccumulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from summary_holders import lease_of, loss_steps, summary_holders
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.save import CheckpointManager
from psflow.coord import Lease
from psflow.train import generation_restore
from psflow.train.hook_api import RunContext, RunValues
from psflow.train.recovery import ClusterRecovery
from psflow.train.session import MonitoredTrainingSession

pytestmark = pytest.mark.timeout(60)

_NAMES = ("a", "b", "d", "e")


class _Run:
    """Workers a, b, d and e, each with its summary hook behind LeaderOnlyHook; the lease set by the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.client, self.services = two_ps_cluster()
        self.ckpt = str(tmp_path / "ckpt")
        with MonitoredTrainingSession(self.client, SGD, is_chief=True):  # the cluster initialized and ready
            pass
        self.logdir = tmp_path / "summaries"
        self.holder: str | None = "a"
        self.generation = 0  # the one the workers train at
        self.writers, self.hooks, self.sessions = summary_holders(self.client, self.logdir, _NAMES, self._leadership,
                                                                  checkpoint_dir=self.ckpt)
        for name in _NAMES:
            self.hooks[name].after_create_session(self.sessions[name])

    def _leadership(self, name: str) -> Any:
        run = self

        class _Leadership:
            candidate = name

            def lease(self) -> Lease | None:
                return lease_of(name) if run.holder == name else None

        return _Leadership()

    def steps(self, name: str, count: int) -> None:
        """``count`` steps by ``name``; every worker's hooks run, only the holder's write."""
        for _ in range(count):
            train_a_step(self.client)
            self.told(name, self.client.global_step())

    def told(self, name: str, step: int) -> None:
        """The hooks hear of ``name``'s step ``step`` (one in flight is told after it completed)."""
        self.sessions[name].global_step = max(self.sessions[name].global_step, step)
        for other in _NAMES:
            context = RunContext(session=self.sessions[other], local_step=0)  # type: ignore[arg-type]
            self.hooks[other].before_run(context)
            if other == name:
                self.hooks[other].after_run(context, RunValues(step=step, loss=0.5, examples=1))

    def restore(self, restorer: str, lost: int, *, told_to: tuple[str, ...] = _NAMES) -> None:
        """ps task ``lost`` died and came back empty; ``restorer`` (its lease) restores the newest checkpoint; the
        hooks of the workers ``told_to`` (each in recovery: its push failed) hear of it as the cluster settles."""
        restart_ps(self.client, self.services, lost)
        self.settle(restorer, told_to=told_to)

    def settle(self, restorer: str, *, told_to: tuple[str, ...] = _NAMES) -> None:
        def told(checkpoint: str | None, step: int | None) -> None:
            for name in told_to:
                self.hooks[name].after_restore(self.sessions[name], checkpoint, step)

        recovery = ClusterRecovery(self.client, SGD, checkpoint_dir=self.ckpt, leader=lambda: lease_of(restorer),
                                   timeout=30.0, generation=self.generation, on_restored=told)
        assert recovery.wait()[0]
        self.generation = self.client.ps_stats().generation

    def curve(self) -> list[int]:
        for writer in self.writers.values():
            writer.flush()
        return loss_steps(self.logdir)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()


def _restored_nobody_leading(run: _Run) -> None:
    """Steps 1, 2 (checkpoint of 2), 3..5 lost; a restores and is lost (nobody leads as the cluster settles); b, not
    holding the duties, trains 6, 7 on the restored model."""
    run.steps("a", 2)
    CheckpointManager(run.ckpt).save(run.client)
    run.steps("a", 3)
    run.holder = None
    run.restore("a", lost=1)
    run.steps("b", 2)


def test_a_worker_first_holding_the_duties_at_its_end_beside_a_restarted_ps_task_0_writes_the_restore_s_start(
        tmp_path: Path) -> None:
    """d takes the duties at its session's end, ps task 0 restarted just then (not loaded: no restore follows, the
    run is ending): no START for the restore before, and its final point after the discarded model's 3..5, at the
    restarted ps task 0's global_step (before: [1, 2, 3, 4, 5, 0])."""
    run = _Run(tmp_path)
    _restored_nobody_leading(run)
    run.sessions["d"].global_step = run.client.global_step()  # 7: d's own last step
    restart_ps(run.client, run.services, 0)
    run.holder = "d"
    run.hooks["d"].end(run.sessions["d"])
    assert run.curve() == [1, 2, 7]
    run.close()


def test_a_worker_taking_the_duties_beside_a_restarted_ps_task_0_writes_no_point_before_the_start(
        tmp_path: Path) -> None:
    """d takes the duties while ps task 0 is restarted, not loaded, and hears of its steps 8 and 9 (two in flight as
    ps task 0 died: the restored model's): the restore before, nobody led through, gets its START first, then their
    points (before: point 9 straight after the discarded 3..5, [1, 2, 3, 4, 5, 9], until the next restore's START)."""
    run = _Run(tmp_path)
    _restored_nobody_leading(run)
    train_a_step(run.client)
    train_a_step(run.client)   # d's 8 and 9, told once ps task 0 died
    restart_ps(run.client, run.services, 0)
    run.holder = "d"
    run.told("d", 8)
    run.told("d", 9)
    assert run.curve() == [1, 2, 8, 9]
    run.settle("d")  # d restores ps task 0 (global_step, lost with it, from the checkpoint: 2)
    run.steps("d", 2)
    assert run.curve() == [1, 2, 3, 4]
    run.close()


@pytest.mark.parametrize("told", [True, False], ids=["told_of_the_restore", "asks_before_its_next_point"])
def test_a_worker_taking_the_duties_during_a_restore_writes_its_start_once_it_settled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, told: bool) -> None:
    """ps task 1 lost again after the first restore; its restorer e had sent BeginRestore (every task not ready at the
    new generation, its loads not come) when e's lease lapsed and d took the duties, hearing of its steps 8 and 9 (in
    flight: the model the restore discards). d wrote that restore's START then, at the newest checkpoint's step, with
    points 8 and 9 after it; once the restore settled, d found its START written: they stayed beside the restored
    model's (before: [1, 2, 8, 9, 10, 11]). Also where d's session is not told of the restore (its own pushes did
    not fail): the START is written before its next point."""
    run = _Run(tmp_path)
    run.steps("a", 2)
    CheckpointManager(run.ckpt).save(run.client)
    run.steps("a", 3)
    run.restore("a", lost=1)   # a leads: its START at 2
    run.steps("a", 2)          # 6, 7 by a
    train_a_step(run.client)
    train_a_step(run.client)   # d's 8 and 9, told once ps task 1 died
    real_restore = generation_restore.restore

    def restore(*args: Any, **kwargs: Any) -> Any:  # e's loads, after its BeginRestore
        run.holder = "d"
        run.told("d", 8)
        run.told("d", 9)
        return real_restore(*args, **kwargs)

    monkeypatch.setattr(generation_restore, "restore", restore)
    run.holder = "e"
    run.restore("e", lost=1, told_to=_NAMES if told else ("a", "b", "e"))  # settles; d holds the duties then
    run.steps("d", 2)          # 10, 11: the restored model (global_step kept by ps task 0)
    assert run.curve() == [1, 2, 10, 11]
    run.close()
