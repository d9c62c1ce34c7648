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

And once more at the session's end, when this worker holds another lease than the one it pushed its last step
under: a holder stalled right after its last push (past ``--lease-ttl``) runs no step once resumed; as the last to
finish it campaigns again, is elected (the take-over's worker had left) and its duties' end would run: it marked the
take-over's final checkpoint final again under its own epoch (the pointer rewritten, naming it), sent ``Done`` and
exited 0, as if its session had ended the run. Now it stops there as above (``... it saves and evaluates nothing``).

Costs: one ``Stats`` call, and one pointer read or ``FinalEval`` call, at the first step, per lease this worker
gains and at an end under a lease its last step was not under; none per step.
A ps task 0 that cannot be asked lets the duties go on (logged): two finals rather than none.

Not guaranteed: a worker that held no lease at its last step (another worker was the holder, then handed the duties
on as it finished) and was stalled from then past ``--lease-ttl`` is not told from one that finished at the same
time as the holder (both hold the duties at their end, one after the other, :mod:`psflow.train.final_eval`): at its
end it marks the take-over's final checkpoint final again and skips the evaluation; every step it pushed is in that
checkpoint.
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
    from psflow.train.session import MonitoredTrainingSession

__all__ = ["RunTakenOverError", "TakenOverHook"]

log = logging.getLogger("psflow.worker")


class RunTakenOverError(TrainingError):
    """Another worker took the chief duties over and ended the run (its final written) while this one trained."""


class TakenOverHook(SessionRunHook):
    """Raises :class:`RunTakenOverError` before this worker's first step, after a step once it holds a new
    lease, and at its session's end under another lease than its last step's, of a run a take-over already ended
    (see the module docstring). Blocks for two RPCs (or one RPC and a pointer read) at its first step, per new
    lease and at such an end."""

    def __init__(self, leadership: Leadership, checkpoint_dir: str | None) -> None:
        self.leadership = leadership
        self.checkpoint_dir = checkpoint_dir
        self._checked: int | None = None  # the epoch of the last lease checked
        self._started = False  # whether its first step was checked
        self._stepped_under: int | None = None  # the epoch of the lease held at its last step (None: none held)

    def before_run(self, context: RunContext) -> None:
        if self._started:
            return
        self._started = True  # a process started after the take-over: it pushes nothing past the run's final
        self._check(context.session.client, "it trains no step (started again after the run's end?)")

    def after_run(self, context: RunContext, values: RunValues) -> None:
        lease = self.leadership.lease()
        self._stepped_under = lease.epoch if lease is not None else None
        if lease is None or lease.epoch == self._checked:
            return
        self._checked = lease.epoch
        self._check(context.session.client, "it stops without a checkpoint or an evaluation of its steps since "
                                            "(stalled past --lease-ttl?)")

    def end(self, session: MonitoredTrainingSession) -> None:
        lease = self.leadership.lease()
        if lease is None or self._stepped_under is None or lease.epoch == self._stepped_under:
            return  # its duties' end runs under the lease of its last step (or it had none then): not taken for gone
        self._check(session.client, "it saves and evaluates nothing (stalled past --lease-ttl after its last step?)")

    def _check(self, client: ParameterClient, then: str) -> None:
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

