"""An evaluation of live ps tasks that reports metrics of one ready model, or says it was not done.

A ps task restarted empty, or halfway through a restore, holds no model of the run: metrics computed from its
values (AUC, loss) are of a model that never existed. So :class:`ReadyEvaluation`, the chief's evaluation
(:class:`~psflow.train.hooks.EvalHook`), for each attempt:

1. reads the readiness, generation and initializations (``Stats``) of every ps task holding a partition of a
   variable, and of the one holding global_step (a task holding none is not part of the model): one not ready
   waits;
2. evaluates with pulls that require a ready task (:mod:`psflow.ps.ready_read`): a task not ready, or restored
   during its read, refuses (FAILED_PRECONDITION);
3. reads those tasks' states again: any change (a restore that began and ended between two pulls, a task restarted
   and restored) drops the metrics.

A dropped attempt is made again from the start (earlier chunks read the model before the restore), every
``RETRY_SECONDS``, until ``timeout`` is spent (``WAIT_SECONDS``, at most the client's ``rpc_timeout``: short, since
the evaluating worker holds the chief duties, and the restore a task awaits is the chief's own, made once this
evaluation returns: a longer wait would only delay it; a restore another process is making, a deposed holder's or a
replicated shard's, ends within it); then :class:`EvaluationNotDone` says why (the task, its state, its
generation). The hooks record it as not done, with no number. A task that
cannot be reached raises as before (``RpcError``). The workers' training path is unchanged: only these reads carry
``require_ready``, and ``Stats`` is asked twice per evaluation, not per step.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from psflow.data import Batch
from psflow.errors import PsflowError
from psflow.models.api import Model
from psflow.rpc.api import FailedPreconditionError
from psflow.train.evaluation import evaluate, parameters

__all__ = ["EvaluationNotDone", "ReadyEvaluation", "RETRY_SECONDS", "WAIT_SECONDS"]

#: Seconds between two attempts while a ps task is being restored.
RETRY_SECONDS = 0.25
#: Seconds an evaluation waits for a ps task being restored (at most the client's ``rpc_timeout``).
WAIT_SECONDS = 5.0


class EvaluationNotDone(PsflowError):
    """An evaluation that could not read one ready model in its time (names the task and why); no metrics."""


class ReadyEvaluation:
    """Callable: the model's metrics on ``batch`` from the live ps tasks of ``client`` (a
    :class:`~psflow.ps.client.ParameterClient`), all ready at one generation through the reads (see the module
    docstring). ``timeout``: seconds to wait for a restore (default: ``WAIT_SECONDS``, at most ``rpc_timeout``)."""

    def __init__(self, model: Model, client: Any, batch: Batch, *, moving_averages: bool,
                 timeout: float | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        self.model, self.client, self.batch = model, client, batch
        self.moving_averages = moving_averages
        self.timeout = min(WAIT_SECONDS, client.config.rpc_timeout) if timeout is None else timeout
        self.sleep = sleep
        #: attempts made by the last call (dropped ones included)
        self.attempts = 0

    def _states(self) -> dict[str, tuple[bool, int, int]]:
        """(ready, generation, init_count) of each ps task the model is read from (one holding a partition of a
        variable) and of the one holding global_step, by task name. A task holding none (``--ps`` above the
        variables) is not asked: restarted or gone, the model is whole; a restore goes to every task, so one made
        during the reads still changes these tasks' generation."""
        out = {}
        for index in _read_from(self.client):
            stats = self.client.ps_stats(index)
            out[stats.task] = (stats.ready, stats.generation, stats.init_count)
        return out

    def __call__(self) -> dict[str, float]:
        """The metrics.

        Raises:
            EvaluationNotDone: no attempt read one ready model within ``timeout`` (says the last reason).
            RpcError: a ps task could not be reached.
        """
        deadline = time.monotonic() + self.timeout
        self.attempts = 0
        while True:
            self.attempts += 1
            why = self._attempt()
            if isinstance(why, dict):
                return why
            left = deadline - time.monotonic()
            if left <= 0:
                raise EvaluationNotDone(f"{self.client.client_name}: evaluation not done: {why} "
                                        f"(waited {self.timeout:g} s, {self.attempts} attempts)")
            self.sleep(min(RETRY_SECONDS, left))

    def _attempt(self) -> dict[str, float] | str:
        """The metrics, or why this attempt's reads are not of one ready model."""
        before = self._states()
        waiting = [f"{task} is not ready (generation {gen})" for task, (ready, gen, _) in before.items() if not ready]
        if waiting:
            return "; ".join(waiting)
        try:
            metrics = evaluate(self.model, parameters(self.client, moving_averages=self.moving_averages), self.batch)
        except FailedPreconditionError as e:  # a task not ready, or restored while read (psflow.ps.ready_read)
            return str(e)
        after = self._states()
        changed = [f"{task} went from {_said(before[task])} to {_said(state)}"
                   for task, state in after.items() if before.get(task) != state]
        return "; ".join(changed) + " during the evaluation" if changed else metrics


def _read_from(client: Any) -> list[int]:
    """The ps tasks holding a partition of a variable (``client.layout``), and ``client.step_task``, sorted."""
    holders = {part.task for placement in client.layout.values() for part in placement.partitions}
    return sorted(holders | {client.step_task})


def _said(state: tuple[bool, int, int]) -> str:
    ready, generation, init_count = state
    return f"{'ready' if ready else 'not ready'} at generation {generation} (initialized {init_count}x)"
