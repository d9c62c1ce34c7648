"""ps tasks that hold nothing, and how one restarted (empty, as it was) is brought back without a restore.

With more ps tasks than the model has variables (``--ps 4`` for the two variables of ``logistic``) some tasks hold
nothing: :func:`~psflow.ps.idle.idle_tasks` names them from the layout the chief registered (the placement), never from a reply
(a task restarted empty answers "no partitions" whatever it held before). A task holds something, so is never idle,
when it is

* the task holding global_step (with the workers' reader positions, the example count, the run's ledger and, with
  embedded coordination, the leases);
* a holder of a partition of any variable (its optimizer slots and moving averages beside it);
* any ps task of a run with a dynamic table (each table's rows are spread over every ps task by id);
* any ps task of a synchronous run (every task takes part in each sync step: its accumulators, its step count);
* any ps task of a replicated run (``--ps-replicas``: a shard's members rebuild each other; out of scope here).

Such a task that died and came back empty lost nothing. Restoring every task from the newest checkpoint for it (what
a task that held variables needs: :mod:`psflow.train.recovery`) would throw away what the cluster trained since that
checkpoint. Instead the chief (the lease holder) *readmits* it (:func:`readmit`): registers the layout, which creates
nothing there, then moves it to the generation the cluster is at and makes it ready (``BeginRestore`` and
``SetReady`` of that generation, sent to that task alone, under the lease's epoch). Nothing is loaded anywhere, no
other task's generation changes, global_step goes on, and every worker resumes where it was
(:meth:`~psflow.train.recovery.ClusterRecovery.wait`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from psflow.coord.api import Lease
from psflow.optim import OptimizerSpec
from psflow.ps.client import ParameterClient
from psflow.ps.idle import idle_tasks
from psflow.ps.protocol import BeginRestoreRequest, SetReadyRequest, StatsReply
from psflow.rpc.api import RpcError
from psflow.train.generation_restore import register_as_chief
from psflow.train.hook_api import RunContext, RunValues, SessionRunHook
from psflow.train.state_loss import ps_states

if TYPE_CHECKING:
    from psflow.train.session import MonitoredTrainingSession

__all__ = ["ASK_TIMEOUT", "idle_down", "readmit", "tasks_named", "ReadmitIdleTasks"]

log = logging.getLogger("psflow.recovery")

#: Seconds :class:`ReadmitIdleTasks` waits for an idle task's ``Stats``: a stopped task's silence holds the chief's
#: step loop that long, once a period (a dead one refuses the connection at once).
ASK_TIMEOUT = 0.5


def tasks_named(tasks: Iterable[int]) -> str:
    """``/job:ps/task:2, /job:ps/task:3``."""
    return ", ".join(f"/job:ps/task:{t}" for t in sorted(tasks))


def readmit(client: ParameterClient, optimizer: OptimizerSpec, tasks: Iterable[int], *, generation: int,
            global_step: int | None, lease: Lease | None, run: str | None, limit: float | None) -> None:
    """(The chief) makes idle ``tasks`` (restarted empty: :func:`idle_tasks`) ready at ``generation``, the one every
    other task is ready at, restoring nothing (see the module docstring). Logged (WARNING), naming the tasks.

    Raises:
        RpcError: a call failed (a task unreachable again; FencedOffError where a newer lease's holder fenced the
            ``BeginRestore``): the caller asks again. A task left not ready stays so; nothing else changed.
    """
    wanted = sorted(tasks)
    register_as_chief(client, optimizer, run, limit=limit)  # creates nothing on an idle task: no partition there
    begin = BeginRestoreRequest(generation, *((lease.epoch, lease.holder) if lease is not None else ()))
    for task in wanted:
        client.call(task, begin, timeout=30.0)
        client.call(task, SetReadyRequest(client.client_name, generation, global_step))
    log.warning("%s: %s restarted holding no variables (the placement puts none there): made ready at generation %d; "
                "nothing was restored, training goes on from global_step %s", client.client_name, tasks_named(wanted),
                generation, global_step)


def idle_down(client: ParameterClient, states: Mapping[int, StatsReply | None], generation: int | None) -> frozenset[int]:
    """The tasks of ``states`` not ready (or unreachable) where each is idle (:func:`idle_tasks`) and every other
    task is ready at ``generation`` (the one the cluster trains in): restarted empty, they lost nothing, and are
    made ready at it (:func:`readmit`). Empty otherwise: a restore is needed (a task holding something is down),
    or in progress (another generation than ``generation`` or a fresh task's 0 on an idle task: a restorer's)."""
    down = frozenset(t for t, s in states.items() if s is None or not s.ready)
    if generation is None or not down or not down <= idle_tasks(client):
        return frozenset()
    if any(s is not None and s.generation not in (0, generation) for t, s in states.items() if t in down):
        return frozenset()
    kept = {s.generation for t, s in states.items() if t not in down and s is not None}
    return down if kept == {generation} else frozenset()


class ReadmitIdleTasks(SessionRunHook):
    """(The lease holder's, inside :class:`~psflow.train.leader_hooks.LeaderOnlyHook`, before the saver) finds an
    idle task restarted empty and :func:`readmit`\\ s it: its training never calls such a task, so no step fails to
    tell it (a save asks it for nothing but its fence: :mod:`psflow.checkpoint.shard_files`).

    After a step, at most every ``every`` s: one ``Stats`` call to each idle task (none where there is none; at most
    :data:`ASK_TIMEOUT` s, the most a silent one holds the step loop); where one answers not ready (restarted), every
    task's, and the readmission. At the session's end (before the final save) it checks once more, waiting for
    nothing: an idle task gone for good (its restarts spent, stopped) does not hold the final save.
    Never raises: a failed readmission is logged and asked again at the next period.

    ``lease``: the lease held now (None: not held, nothing readmitted); ``lease=None`` itself: the run's only chief
    (the in-graph client, no election), whose readmission is unfenced, as its restores are."""

    def __init__(self, client: ParameterClient, optimizer: OptimizerSpec, lease: Callable[[], Lease | None] | None, *,
                 run: str | None, every: float = 1.0) -> None:
        self.client, self.optimizer, self.lease, self.run = client, optimizer, lease, run
        self.every = every
        self.idle = idle_tasks(client)
        self._last = float("-inf")

    def after_run(self, context: RunContext, values: RunValues) -> None:
        if self.idle and time.monotonic() - self._last >= self.every:
            self._last = time.monotonic()
            self.check()

    def end(self, session: MonitoredTrainingSession) -> None:
        if self.idle:  # once, not waited for: the final save needs no idle task (psflow.checkpoint.shard_files)
            self.check()

    def check(self) -> bool:
        """Readmits an idle task found restarted; True where every idle task is ready (now), False otherwise."""
        calls = {t: self.client.channels[t].call_async("Stats", timeout=ASK_TIMEOUT) for t in self.idle}
        try:
            ready = [StatsReply.from_frame(call.result()).ready for call in calls.values()]
        except RpcError:  # down, or silent (stopped): nothing to readmit until it answers; asked again next period
            return False
        if all(ready):
            return True
        states = ps_states(self.client)
        step = states.get(self.client.step_task)
        down = idle_down(self.client, states, step.generation if step is not None and step.ready else None)
        lease = self.lease() if self.lease is not None else None
        if not down or (self.lease is not None and lease is None) or any(states[t] is None for t in down):
            return False
        try:
            readmit(self.client, self.optimizer, down, generation=step.generation if step is not None else 0,
                    global_step=step.global_step if step is not None else None, lease=lease, run=self.run,
                    limit=2.0)
        except RpcError as e:
            log.info("%s: %s not made ready yet: %s", self.client.client_name, tasks_named(down), e)
            return False
        return True
