"""With a chief election every worker has a SummarySaverHook and a SummaryWriter of its own in the one summary
directory (psflow.train.duties), each writing while it holds the chief lease (LeaderOnlyHook). TensorBoard reads a
directory's event files one after the other in the order of their names, and a SessionLog START drops the events
read before it at its step or later. So the events must be read in the order they were written, across the workers'
files: a START within the run (27a9824) written in a file whose name sorts after another worker's file dropped that
other worker's later points (a real run, --ps 2 --workers 2 --chaos kill:ps:0@step=300: worker 1 took the lease,
restored the checkpoint of step 205 and wrote its START, then handed the lease back to worker 0 when its data ended;
TensorBoard's train/loss stopped at 480, worker 0's 560..606 dropped, the files' names sorting by pid). And a START
in a file whose name sorts before the other worker's let the discarded model's points in that file stand.

Here: two hooks on a real in-process cluster, the lease passed A -> B -> A, B writing the START of a restore; the
files' construction names fixed so that one sorts first (as pids and a shared second make them). Read back with
TensorBoard's own EventAccumulator (purge of orphaned data on, its default)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from summary_holders import lease_of, loss_steps, summary_holders
from two_ps_in_process import SGD, train_a_step, two_ps_cluster

from psflow.coord import Lease
from psflow.train.hook_api import RunContext, RunValues
from psflow.train.session import MonitoredTrainingSession

pytestmark = pytest.mark.timeout(60)


class _Lease:
    """The chief lease, held by one of the candidates at a time (set by the test)."""

    def __init__(self) -> None:
        self.holder = "a"

    def for_(self, name: str) -> Any:
        lease = lease_of(name)
        state = self

        class _Leadership:
            candidate = name

            def lease(self) -> Lease | None:
                return lease if state.holder == name else None

        return _Leadership()


@pytest.mark.parametrize("first", ["a", "b"], ids=["a_sorts_first", "b_sorts_first"])
def test_tensorboard_reads_the_workers_files_in_the_order_they_were_written(tmp_path: Path, first: str) -> None:
    client, _ = two_ps_cluster()
    with MonitoredTrainingSession(client, SGD, is_chief=True):  # the cluster initialized and ready
        pass
    logdir = tmp_path / "summaries"
    lease = _Lease()
    writers, hooks, sessions = summary_holders(client, logdir, ("a", "b"), lease.for_)
    for name, writer in writers.items():  # as two processes' writers made in the same second: pids decide
        writer.path = str(logdir / f"events.out.tfevents.1700000000.host.{'1' if name == first else '2'}.0")
    for name in ("a", "b"):
        hooks[name].after_create_session(sessions[name])

    def steps(name: str, count: int) -> None:
        for _ in range(count):
            train_a_step(client)
            step = client.global_step()
            for other in ("a", "b"):  # every worker's hooks run; only the holder's writes
                context = RunContext(session=sessions[other], local_step=0)  # type: ignore[arg-type]
                hooks[other].before_run(context)
                if other == name:
                    hooks[other].after_run(context, RunValues(step=step, loss=0.5, examples=1))

    steps("a", 3)                     # 1..3 by A: the checkpoint is of step 2
    lease.holder = "b"
    steps("b", 2)                     # 4, 5 by B: lost with a ps task
    for name in ("a", "b"):           # the restore (B holds the lease): every worker's hooks hear of it
        hooks[name].after_restore(sessions[name], "ckpt-000000002", 2)
    steps("b", 2)                     # 6, 7 by B: the restored model
    lease.holder = "a"                # B's data ended: it hands the lease on
    steps("a", 2)                     # 8, 9 by A, to the run's end
    for writer in writers.values():
        writer.close()

    assert loss_steps(logdir) == [1, 2, 6, 7, 8, 9]
