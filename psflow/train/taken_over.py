"""A worker that still trains stops once a take-over ended the run without it: one final checkpoint, one final
evaluation.

Under ``psflow server`` (nothing restarts a dead task) a finished worker takes the chief duties over when nobody
pushed or held the chief lease for ``--lease-ttl`` (:mod:`psflow.train.take_over`): it writes the run's final
checkpoint at that global_step, evaluates the final model once, sends ``Done`` and exits. A worker taken for gone
but alive (stopped with SIGSTOP past the ttl, then resumed) used to train on: it campaigned again, was elected (the
take-over's worker had left), saved periodic checkpoints past the final one and, at its own end, wrote a second
checkpoint marked final and evaluated again, after an evaluator task (:mod:`psflow.launch.evaluator`) had ended at
the first.

The take-over's final stands (the resumed worker's loses): it was written first, the run was declared over with it
(its worker's ``Done``), and what read it as the end (an evaluator, a user) cannot be told otherwise. So
:class:`TakenOverHook`, placed before the chief duties' hooks of a run whose finished workers may take the duties
over (``psflow server`` without ``--restarted-by-manager``; never under ``psflow train``: ``make_session``'s
``take_over``), checks each time this worker, still training, holds a
new lease (an epoch it has not checked: the only way its duties could write again), in order:

1. ps task 0 counts another worker's ``Done`` and the run is not over: a worker ended its part of the run while
   this one trains, which only a take-over (or a linger that timed out) does: the others wait for every worker to
   finish first. A run that is over (every worker's ``Done``, ps tasks that ``--keep-serving``) was ended by its
   workers, not taken over: a worker started again then trains and writes its final checkpoint, as before;
2. the run's final was made: the checkpoint directory's newest checkpoint is marked final, or (no directory) ps task
   0 records a final evaluation (:mod:`psflow.train.final_eval`);
3. both: it raises :class:`RunTakenOverError` (one line naming who took over and the final's step) before any duty
   runs under the new lease, so it saves and evaluates nothing; the session's end hooks are skipped, the worker
   exits non-zero without ``Done`` (the ps tasks of ``psflow server`` serve until ``psflow shutdown``, as after a
   killed chief). Its steps since it resumed are in no checkpoint.

The same check runs once before this worker's first step, lease or not: a worker started again by hand after the
take-over (killed, not stalled) campaigns only once it trains, and pushed a few steps past the run's final (ps task
0's global_step moved on from the final checkpoint's, on ps tasks that serve until ``psflow shutdown``) before it
was elected and stopped; now it stops before its first pull (``... it trains no step``).

Costs: one ``Stats`` call, and one pointer read or ``FinalEval`` call, at the first step and per lease this worker
gains; none per step.
A ps task 0 that cannot be asked lets the duties go on (logged): two finals rather than none.

Not guaranteed: a worker stalled after its last push (its data ended as it resumed) runs no step, so this hook never
checks: as the last to finish it writes the final checkpoint of the same global_step again (the same checkpoint,
marked final once) and skips the evaluation (:class:`~psflow.train.final_eval.FinalEvalOnce`).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from psflow.errors import TrainingError
from psflow.ps.protocol import FinalEvalReply, FinalEvalRequest
from psflow.rpc.api import RpcError
from psflow.train.final_duties import newest_final
from psflow.train.hooks import RunContext, RunValues, SessionRunHook

if TYPE_CHECKING:
    from psflow.ps.client import ParameterClient
    from psflow.train.recovery import Leadership

__all__ = ["RunTakenOverError", "TakenOverHook"]

log = logging.getLogger("psflow.worker")


class RunTakenOverError(TrainingError):
    """Another worker took the chief duties over and ended the run (its final written) while this one trained."""


class TakenOverHook(SessionRunHook):
    """Raises :class:`RunTakenOverError` before this worker's first step, and after a step once it holds a new
    lease, of a run a take-over already ended (see the module docstring). Blocks for two RPCs (or one RPC and a
    pointer read) at its first step and per new lease."""

    def __init__(self, leadership: Leadership, checkpoint_dir: str | None) -> None:
        self.leadership = leadership
        self.checkpoint_dir = checkpoint_dir
        self._checked: int | None = None  # the epoch of the last lease checked
        self._started = False  # whether its first step was checked

    def before_run(self, context: RunContext) -> None:
        if self._started:
            return
        self._started = True  # a process started after the take-over: it pushes nothing past the run's final
        self._check(context, "it trains no step (started again after the run's end?)")

    def after_run(self, context: RunContext, values: RunValues) -> None:
        lease = self.leadership.lease()
        if lease is None or lease.epoch == self._checked:
            return
        self._checked = lease.epoch
        self._check(context, "it stops without a checkpoint or an evaluation of its steps since (stalled past "
                             "--lease-ttl?)")

    def _check(self, context: RunContext, then: str) -> None:
        client = context.session.client
        ended = _ended_by(client, self.checkpoint_dir)
        if ended is not None:
            raise RunTakenOverError(f"{client.client_name}: the run was ended without this worker: {ended}; {then}")


def _ended_by(client: ParameterClient, checkpoint_dir: str | None) -> str | None:
    """Who ended the run and with what final (steps 1-2 of the module docstring), or None if it was not."""
    try:
        stats = client.ps_stats()
        run_end = stats.counters.get("run_end")
        if not isinstance(run_end, dict) or run_end.get("run_over"):  # every worker's Done: no take-over (a worker
            return None  # started again against ps tasks that --keep-serving trains again, as before the run's end)
        done = set(run_end.get("workers_done") or ())
        done.discard(client.client_name)
        if not done:
            return None
        whom = ", ".join(sorted(done))
        if checkpoint_dir:
            final = newest_final(checkpoint_dir)
            return None if final is None else (f"{whom} took the chief duties over and wrote the final checkpoint "
                                               f"{final[0]} at global_step {final[1]}")
        record = FinalEvalReply.from_frame(client.call(client.step_task, FinalEvalRequest(client.client_name, 0)))
    except RpcError as e:
        log.warning("%s: could not ask ps task 0 whether a take-over ended the run: %s; acting as chief",
                    client.client_name, e)
        return None
    if record.step is None:
        return None
    return f"{record.worker} took the chief duties over and evaluated the final model at global_step {record.step}"

