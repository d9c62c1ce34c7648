"""A worker whose data ended takes the chief duties over when no worker that trains is left to hold them.

A finished worker hands the chief lease on and waits for the others (:func:`psflow.train.final_duties.resign`,
:meth:`psflow.train.recovery.ClusterRecovery.linger`): the duties run between a worker's steps, so they belong to a
worker that still trains, which campaigns after each step and is elected within the lease ttl of the holder's
death. When the workers still training are all gone (the chief killed for good, no supervisor restarting it),
nobody would take the lease, and the finished worker used to leave after ``connect_timeout`` (60 s) without the
final checkpoint or the final evaluation: the model trained since the last periodic save was lost.

Only where nothing restarts a dead worker (``psflow server`` without ``--restarted-by-manager``): the local launcher
(``psflow train``) restarts it (``--restart-policy``) or stops the run, so its workers never take over
(:func:`~psflow.train.worker.run_worker`'s ``take_over``); nor do those of ``psflow server --restarted-by-manager``,
which ``psflow k8s render`` gives every worker and chief pod (Kubernetes restarts them in place,
``restartPolicy: OnFailure``). There a chief restarted in more than the lease's ttl (the restart's pause, an image
pull, CrashLoopBackOff's 10-20 s back-off, then its start-up) was taken for gone: a finished worker wrote a
checkpoint marked final in the middle of the run and left.

:class:`TakeOver` is asked at each of the lingering worker's polls while another worker has not finished. In order:

1. while global_step moved within the last ``lease_ttl`` s, or anyone holds the lease (a live holder, or a dead
   one's lease not lapsed yet), it waits: a worker that trains pushes, and campaigns whenever the lease is free
   (its campaign pauses at most 0.4 s), so it holds the duties; a live holder is never displaced;
2. the newest checkpoint is already the final one at this global_step (another finished worker took the duties
   over first and gave them up; without a checkpoint directory: ps task 0 records the final model's evaluation at
   this global_step, :mod:`psflow.train.final_eval`): this worker leaves without them;
3. else it campaigns once (its election fences every ps task at the new epoch, as any chief's does); not elected:
   back to 1;
4. elected, it reads global_step again: moved (a worker that trains pushed meanwhile), it resigns the lease to that
   worker and goes back to 1; else it logs WARNING ``worker N: took the chief duties over from the workers still
   training (...)`` and the lingering ends: the worker's session ends holding the lease, so the final
   checkpoint is written at this global_step and the final model evaluated once
   (:class:`~psflow.train.final_eval.FinalEvalOnce`), and the worker sends ``Done`` and exits 0.

Once every worker finished, one that handed the duties on does not leave at once: the last to finish holds them
and writes the final checkpoint after its ``Leave``, and killed in that save it left nobody to write it (the newest
checkpoint was the last periodic one). :meth:`TakeOver.await_holder` waits for the holder's end (its ``Done``
reached ps task 0) and, if nobody holds the lease for ``lease_ttl`` before, takes the duties over by steps 1-4
(WARNING ``... took the chief duties over from the last to finish (...), whose session never ended``). There a
final checkpoint at the last step (step 2) counts as the end only once another worker's ``Done`` followed it (a
take-over that ended): the holder's own, with no ``Done``, means it was killed after its final save, in its final
evaluation, and the take-over evaluates the final model (``... ending the run (its final checkpoint is written
already)``). (It left without: the run's final evaluation was never made.) This worker's ``Done`` then comes
after the holder's (a poll, 0.2 s).
A holder resigns its lease just before its ``Done``: without a checkpoint directory (``--eval`` only), one whose
session's end took more than ``lease_ttl`` is not taken over in that moment: its record of the final evaluation on
ps task 0 (step 2) says its session ended. (It was, with a WARNING that its session never ended and that this
worker was writing the final checkpoint, where there is none to write.) Without a checkpoint directory the WARNING
of step 4 says ``ending the run (no --checkpoint-dir)``.

Guarantees: a worker that pushes or holds the lease keeps the duties (steps 1 and 4); the final checkpoint and
evaluation are of the last pushed step; no extra work per push (only the lingering worker's polls ask the
coordination backend, and only once global_step stood still for a lease ttl).

Not guaranteed: a worker that neither pushed nor held the lease for a whole ``lease_ttl`` (stopped, or one step
that long), or one restarted by a cluster manager that the tasks were not told of (``psflow server`` without
``--restarted-by-manager``), but lives is taken for gone. The take-over's final checkpoint and evaluation are the
run's (an evaluator task, :mod:`psflow.launch.evaluator`, may have ended on it already): when that worker trains
again and is elected, or (stalled right after its last push) reaches its session's end under a new lease, it stops
with one line before its duties run (:mod:`psflow.train.taken_over`), and the steps it pushed since it resumed are
in no checkpoint; one stalled in its final evaluation does not report it (:mod:`psflow.train.final_eval`). (It used
to train on and write a second checkpoint marked final, the model evaluated twice.)
"""

from __future__ import annotations

import logging
import time

from psflow.coord import CoordinationError
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import FinalEvalReply, FinalEvalRequest
from psflow.rpc.api import RpcError
from psflow.train.final_duties import newest_final
from psflow.train.recovery import Leadership

__all__ = ["TakeOver"]

#: The worker's logger: these lines read as the loop's.
log = logging.getLogger("psflow.worker")


class TakeOver:
    """The lingering worker's take-over of the chief duties; see the module docstring. Not thread-safe (the
    lingering loop's thread calls it)."""

    def __init__(self, leadership: Leadership, client: ParameterClient, task_index: int, *, lease_ttl: float,
                 checkpoint_dir: str | None) -> None:
        self.leadership = leadership
        self.client = client
        self.task_index = task_index
        self.lease_ttl = lease_ttl
        self.checkpoint_dir = checkpoint_dir

    def __call__(self, quiet: float, step: int | None, finished: tuple[str, ...], num_workers: int) -> bool:
        """Whether this worker is to end its lingering now (holding the lease, or the final checkpoint written).

        Args:
            quiet: seconds global_step has stood at ``step`` as this worker saw it.
            finished: the workers that finished, per ps task 0.
            num_workers: how many training workers the cluster has.

        Blocks for a few RPCs at most (one campaign: at most 1 s with a backend the service wakes).
        """
        gone = [f"/job:worker/task:{i}" for i in range(num_workers) if f"/job:worker/task:{i}" not in finished]
        return self._take(quiet, step, f"the workers still training ({', '.join(gone)})")

    def await_holder(self, num_workers: int, *, poll: float = 0.2) -> None:
        """(Every worker finished; this one had handed the duties on) waits until the worker that holds them at the
        end has ended its session (its ``Done`` reached ps task 0). If nobody holds the lease for ``lease_ttl``
        before that (the last to finish killed after its ``Leave``, in its final save or its final evaluation), it
        takes the duties over as :meth:`__call__` does (a final checkpoint at the last step that no other worker's
        ``Done`` followed is the holder's own: not the end) and returns holding the lease, so its own session's end
        writes the final checkpoint (if not written) and evaluates. Returns at once when not every
        worker finished (the lingering left on its timeout), and when ps task 0 cannot be asked (logged)."""
        started = time.monotonic()
        while self.leadership.lease() is None:
            try:
                stats = self.client.ps_stats()
            except RpcError as e:
                log.info("worker %d: asking ps task 0 whether the chief duties' holder ended: %s", self.task_index, e)
                return
            finished = set(stats.finished or ())
            run_end = stats.counters.get("run_end")
            done = set(run_end.get("workers_done") or ()) if isinstance(run_end, dict) else set()
            if len(finished) < num_workers or finished - {self.client.client_name} <= done:
                return
            whom = f"the last to finish ({', '.join(sorted(finished - done - {self.client.client_name}))})"
            # A final checkpoint that nobody's Done followed is the holder's own: killed after its final save, in its
            # final evaluation, it left the rest of its session's end undone.
            if self._take(time.monotonic() - started, stats.global_step, f"{whom}, whose session never ended",
                          final_ends=bool(done - {self.client.client_name})):
                return
            time.sleep(poll)

    def _take(self, quiet: float, step: int | None, whom: str, *, final_ends: bool = True) -> bool:
        """The take-over's steps 1-4 (module docstring); ``whom``: who had the duties, for the WARNING;
        ``final_ends``: whether a final checkpoint at ``step`` means the run's end was done (step 2)."""
        if quiet < self.lease_ttl or not self._lease_free():
            return False
        final = self._final_at(step)
        if final is not None and (final_ends or not self.checkpoint_dir):
            log.info("worker %d: %s; leaving", self.task_index, final)
            return True
        if self.leadership.campaign(timeout=0.0 if self.leadership.backend.campaign_polls else 1.0) is None:
            return False
        try:
            now = self.client.ps_stats().global_step
        except RpcError as e:
            now = None
            log.info("worker %d: reading global_step after its election: %s", self.task_index, e)
        if now != step or now is None:
            log.info("worker %d: global_step moved (%s -> %s) as it was elected: a worker still trains; handing the "
                     "chief duties on", self.task_index, step, now)
            self.leadership.resign()
            return False
        duty = ("ending the run (no --checkpoint-dir)" if not self.checkpoint_dir else "writing the final checkpoint"
                if final is None else "ending the run (its final checkpoint is written already)")
        log.warning("worker %d: took the chief duties over from %s: nobody pushed or held the chief lease for %.0f s "
                    "(--lease-ttl); %s at global_step %s", self.task_index, whom, quiet, duty, step)
        return True

    def _lease_free(self) -> bool:
        try:
            return self.leadership.backend.leader() is None
        except CoordinationError as e:
            log.info("worker %d: asking who holds the chief lease: %s", self.task_index, e)
            return False

    def _final_at(self, step: int | None) -> str | None:
        """What says the run's final duties at ``step`` are done, or None: the newest checkpoint is a final one at
        ``step``; without a checkpoint directory, ps task 0 records the final model's evaluation at ``step`` (a
        read error: None)."""
        if not self.checkpoint_dir:
            return self._evaluated_at(step)
        final = newest_final(self.checkpoint_dir)
        if final is None or final[1] != step:
            return None
        return (f"the final checkpoint at global_step {step} is written already (by a worker that took the chief "
                "duties over)")

    def _evaluated_at(self, step: int | None) -> str | None:
        """Who evaluated the final model at ``step``, per ps task 0's record (:mod:`psflow.train.final_eval`)."""
        if step is None:
            return None
        try:
            record = FinalEvalReply.from_frame(self.client.call(self.client.step_task,
                                                                FinalEvalRequest(self.client.client_name, step)))
        except RpcError as e:
            log.info("worker %d: asking ps task 0 whether the final model was evaluated: %s", self.task_index, e)
            return None
        if record.step != step:
            return None
        return f"the final model (global_step {step}) was evaluated by {record.worker} already (its session ended)"
