"""The final model evaluated once, however many workers hold the chief duties at their session's end.

With chief election two workers that finish their data together can both hold the chief duties at their own
end: each saw the other finished, so neither handed them on (:mod:`psflow.train.final_duties`). The first to
hold the lease ends its session (final checkpoint, final evaluation) and resigns; the second, which campaigned
meanwhile, is then elected and ends its own session, and evaluated the same final model again (two
``eval step=S`` lines, two ``eval/*`` points at one step). So :class:`FinalEvalOnce` wraps the chief's
:class:`~psflow.train.hooks.EvalHook`; at the session's end, in order:

1. it asks ps task 0 for its record of the final evaluation (``FinalEval``, :mod:`psflow.ps.run_end`); one at
   this global_step means the final model was evaluated already: skipped, logged (INFO) naming who did it;
2. else, unless a periodic evaluation was of this step, it evaluates the model, then asks ps task 0 again: a record
   at this step made meanwhile is its successor's (this worker stalled, SIGSTOP, past ``--lease-ttl`` in the
   evaluation; a finished worker took the duties over and evaluated the same model): its own evaluation is dropped,
   logged (INFO), neither logged as ``eval step=S`` nor written as ``eval/*`` points. (It was reported as well: two
   evaluations of one model, and its record replaced the successor's.) Else the evaluation hook reports it;
3. once this step was evaluated, ps task 0 records it, before the session's end goes on, so before this
   worker gives the lease up.

The step asked and recorded is :func:`~psflow.train.hook_api.end_step`'s: ps task 0's global_step where it is
ready, else the session's last step (a restarted ps task 0 not loaded yet says 0: the final evaluation was recorded
at step 0).

A second holder is elected only after the first resigned (its record made) or its lease lapsed: a holder that
died before its record recorded nothing, and the next holder evaluates. A ps task 0 that cannot be asked does
not stop the evaluation (logged): the model evaluated twice rather than not at all.

Not guaranteed: a ps task 0 restarted between the two holders' ends has forgotten the record (with replicated
shards it is kept with the run ledger); a holder stalled mid-evaluation that resumes while its successor evaluates
and ends its evaluation within the few milliseconds between the successor's second ask and its record (ps task 0
keeps the last record made at a step, not the first) reports it too: two evaluations of that model, never none.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from psflow.ps.protocol import FinalEvalReply, FinalEvalRequest
from psflow.rpc.api import RpcError
from psflow.train.hook_api import WrappingHook, end_step
from psflow.train.hooks import EvalHook

if TYPE_CHECKING:
    from psflow.ps.client import ParameterClient
    from psflow.train.session import MonitoredTrainingSession

__all__ = ["FinalEvalOnce"]

log = logging.getLogger("psflow.worker")


class FinalEvalOnce(WrappingHook):
    """Runs ``inner`` (the chief's :class:`~psflow.train.hooks.EvalHook`) as it is, except that its evaluation
    at the session's end is skipped when ps task 0 recorded one of the model at this global_step (asked before
    and after it evaluates), and is recorded there once made (see the module docstring). Blocks for three
    ``FinalEval`` calls at the end."""

    inner: EvalHook

    def __init__(self, inner: EvalHook) -> None:
        super().__init__(inner)

    def end(self, session: MonitoredTrainingSession) -> None:
        client = session.client
        step = end_step(session)  # (a restarted ps task 0, not ready, says 0: the session's last step then)
        record = _final_eval(client, FinalEvalRequest(client.client_name, step))
        if record is not None and record.step == step:
            log.info("%s: the final model (global_step %d) was evaluated by %s already: not again",
                     client.client_name, step, record.worker)
            return
        if not self.inner.history or self.inner.history[-1][0] != step:  # (else a periodic one evaluated it)
            metrics = self.inner.evaluated(step, final=True)
            if metrics is None:  # not done (logged): nothing recorded, a later holder of the duties may evaluate it
                return
            record = _final_eval(client, FinalEvalRequest(client.client_name, step))
            if record is not None and record.step == step:  # its successor's, while this one was stalled
                log.info("%s: the final model (global_step %d) was evaluated by %s while this worker evaluated it "
                         "(stalled past --lease-ttl?): its own evaluation is not reported", client.client_name, step,
                         record.worker)
                return
            self.inner.report(step, metrics)
        _final_eval(client, FinalEvalRequest(client.client_name, step, evaluated=True))


def _final_eval(client: ParameterClient, request: FinalEvalRequest) -> FinalEvalReply | None:
    """``request`` sent to the task holding global_step; its reply, or None (logged) if it failed."""
    try:
        return FinalEvalReply.from_frame(client.call(client.step_task, request))
    except RpcError as e:
        if request.evaluated:
            log.warning("%s: could not record the final evaluation (global_step %d) on %s: %s; a worker that "
                        "holds the chief duties after this one evaluates that model again", client.client_name,
                        request.step, client.channels[client.step_task].task, e)
        else:
            log.warning("%s: could not ask %s whether the final model (global_step %d) was evaluated already: %s; "
                        "evaluating it", client.client_name, client.channels[client.step_task].task, request.step, e)
        return None
