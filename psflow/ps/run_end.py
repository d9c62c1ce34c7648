"""The end of a run, as one ps task sees it: which training workers are done, whether that is all, and (ps task 0)
who evaluated the final model.

A ps task started by ``psflow server`` exits once the run is over
(:class:`psflow.server.Server` with ``stop_when_run_over``). The run is over
when every training worker of the cluster spec (:func:`training_workers`) has
sent ``Done``. A worker sends ``Done`` to every ps task once its session has
ended normally: its data ended (or global_step reached ``max_steps``), every
worker of a run that can be restored has finished its data (workers linger
for each other, see :mod:`psflow.train.recovery`), and the session's end hooks
have run, so the final checkpoint has been written by the worker that held
the chief duties then, before that worker's ``Done``. The ps task needs no
training config to know this: the workers' ``Done`` carries whether the run
checkpoints and the final checkpoint's name.

``Done``
    ``meta = {"worker": task, "incarnation": n, "checkpoint_dir": bool,
    "final_checkpoint": name | null}``. ``worker`` must be a training worker of
    the cluster (``/job:worker/task:i``, as :func:`psflow.train.chief.training_view`
    names them: with a ``chief`` job the chief is worker 0). Replies
    ``{"ok": true, "run_over": bool}``. Idempotent: a worker may send it again.

``FinalEval``
    ``meta = {"worker": task, "step": n, "evaluated": bool}`` (sent to ps task 0). With ``evaluated``,
    records that ``worker`` evaluated the final model at global_step ``step``; without, only asks.
    Replies the newest record, ``{"step": n | null, "worker": task | null}``. A worker that holds the
    chief duties at its session's end asks before it evaluates the final model and records once it has,
    before it gives the duties up (:mod:`psflow.train.final_eval`): two workers that finish together
    both hold them at their own end, one after the other, and the second skips the model the first
    evaluated; one that died mid-evaluation recorded nothing, so the next holder evaluates. Kept with
    the ledger (replicated with it) and named in the run-over line. A restarted ps task 0 forgets it.

Each ps task keeps its own ledger: none depends on another to learn that the
run is over, so ps task 0 may exit first.

Restarted workers: a worker that finished and was then restarted must finish
again before the run is over. Its ``Done`` is forgotten when the worker
registers again (every process of a worker registers with every ps task as it
joins the cluster: :meth:`RunLedger.joined`), and it counts only while no
later process of that worker has been seen (a higher incarnation, from its
pushes or its ``ReaderPositions`` claim), so a late ``Done`` of an earlier
process does not count either.

Replicated shards (:mod:`psflow.ps.replication`): the ledger is part of the shard's small state
(:meth:`RunLedger.replica_state`), so a backup holds every ``Done`` its primary acknowledged; promoted, it
counts the ``Done`` sent before (a worker that finished earlier) and, if they complete the run, announces
it then (:meth:`RunLedger.announce_if_over`). A backup never announces the run over itself: its primary,
which heard the last ``Done``, stops it.

Not guaranteed: a worker that fails never sends ``Done``, so the ps tasks of a
failed run keep serving (a restarted worker can still rejoin; ``psflow
shutdown`` stops them); a ps task restarted after the workers sent ``Done``
never hears it and serves until stopped. In an in-graph run the client sends
``Done`` for every training worker once its session has ended (it drives them
all; :mod:`psflow.train.in_graph_client`); the in-graph workers themselves
serve until stopped.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from psflow.cluster import ClusterSpec
from psflow.ps.protocol import DoneReply, DoneRequest, FinalEvalReply, FinalEvalRequest
from psflow.rpc.api import Handler, InvalidRequest, Reply
from psflow.rpc.framing import Frame

__all__ = ["RunLedger", "training_workers", "describe_workers"]

_WORKER = re.compile(r"/job:worker/task:(\d+)")
# A checkpoint's directory name, as the manifests have it (it goes into a log line: no other characters).
_CHECKPOINT_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,200}")
# A task's name, as a FinalEval record names its worker (it goes into a log line too).
_TASK_NAME = re.compile(r"/job:[A-Za-z0-9_]{1,50}/task:\d{1,9}")


def training_workers(cluster: ClusterSpec) -> list[str]:
    """The names the training workers of ``cluster`` report under (``/job:worker/task:i``).

    Without a ``chief`` job: the ``worker`` job's tasks. With one: the chief as
    worker 0 and ``/job:worker/task:i`` as ``i + 1`` (as
    :func:`psflow.train.chief.training_view` numbers them). Empty when the
    cluster has no training task (then the run is never over).
    """
    workers = cluster.num_tasks("worker") if "worker" in cluster.jobs else 0
    if "chief" in cluster.jobs:
        return [f"/job:worker/task:{i}" for i in range(cluster.num_tasks("chief") + workers)]
    if not workers:
        return []
    return [f"/job:worker/task:{i}" for i in sorted(cluster.task_indices("worker"))]


def describe_workers(names: Sequence[str]) -> str:
    """``worker 0``, ``workers 0-2`` or ``workers 0-1, 4``: training workers' names, indices in runs."""
    indices = sorted(int(m.group(1)) for m in map(_WORKER.fullmatch, names) if m is not None)
    if not indices:
        return "no workers"
    runs: list[list[int]] = []
    for i in indices:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return ("worker " if len(indices) == 1 else "workers ") + text


@dataclass(frozen=True)
class _Done:
    incarnation: int
    checkpoint_dir: bool
    final_checkpoint: str | None


class RunLedger:
    """The ``Done`` reports of one ps task, and the moment the run is over. Thread-safe."""

    def __init__(self, task_name: str, expected: Sequence[str], *, incarnation_of: Callable[[str], int],
                 on_over: Callable[[str], None] | None = None) -> None:
        """Args:
            task_name: this ps task (errors name it).
            expected: the training workers (:func:`training_workers`); empty: the run is never over.
            incarnation_of: the highest incarnation seen of a worker (0: none), e.g.
                :meth:`psflow.ps.worker_ledger.WorkerLedger.incarnation_of`.
            on_over: called once, on the thread of the ``Done`` that completed the ledger, with a
                description such as ``workers 0-1 finished, final checkpoint ckpt-000000512 written``.
        """
        self.task_name = task_name
        self._expected = tuple(expected)
        self._incarnation_of = incarnation_of
        self._on_over = on_over
        self._lock = threading.Lock()
        self._done: dict[str, _Done] = {}
        self._final_eval: tuple[int, str] | None = None  # (global_step, worker) of the newest final evaluation
        self._over = False
        self._announced = False  # on_over called (here: a ledger loaded as over has not announced it)

    def handlers(self) -> dict[str, Handler]:
        """``{"Done": ..., "FinalEval": ...}``, for the ps task's services."""
        return {DoneRequest.METHOD: self.done, FinalEvalRequest.METHOD: self.final_eval}

    def done(self, frame: Frame) -> Reply:
        """Records a worker's ``Done`` (see the module docstring); the one that completes the ledger calls ``on_over``."""
        worker, report = self._parse(frame)
        with self._lock:
            self._done[worker] = report
            self._over = self._over or self._complete()
        self.announce_if_over()
        reply = DoneReply(self.over).to_frame()
        return reply.meta, reply.arrays

    def final_eval(self, frame: Frame) -> Reply:
        """Answers (and with ``evaluated``, first records) ``FinalEval`` (see the module docstring): the newest
        record wins, so a record of an earlier step never replaces a later one."""
        try:
            request = FinalEvalRequest.from_frame(frame)
        except InvalidRequest as e:
            raise InvalidRequest(f"{self.task_name}: FinalEval: {e}") from e
        if not _TASK_NAME.fullmatch(request.worker):
            raise InvalidRequest(f"{self.task_name}: FinalEval: 'worker' must be a task name, got "
                                 f"{request.worker!r:.100}")
        with self._lock:
            if request.evaluated and (self._final_eval is None or request.step >= self._final_eval[0]):
                self._final_eval = (request.step, request.worker)
            step, worker = self._final_eval if self._final_eval is not None else (None, None)
        reply = FinalEvalReply(step, worker).to_frame()
        return reply.meta, reply.arrays

    def announce_if_over(self) -> None:
        """Calls ``on_over`` if the run is over and this ledger has not called it yet: after a ``Done``, or on a
        backup promoted to primary whose replicated ledger says the run is over (its old primary died before
        stopping the shard)."""
        with self._lock:
            fire = self._over and not self._announced
            self._announced = self._announced or fire
        if fire and self._on_over is not None:
            self._on_over(self.describe())

    def replica_state(self) -> dict[str, Any]:
        """The ledger as a replicated shard's small state carries it (JSON): each ``Done``, whether the run is
        over, and the final evaluation's record."""
        with self._lock:
            return {"done": [[w, d.incarnation, d.checkpoint_dir, d.final_checkpoint] for w, d in self._done.items()],
                    "over": self._over, "final_eval": list(self._final_eval) if self._final_eval else None}

    def load_replica_state(self, state: Any) -> None:
        """Replaces the ledger's reports with the primary's (:meth:`replica_state`); announces nothing (a backup's
        primary stops it). A malformed state changes nothing.

        Raises:
            ValueError: ``state`` is malformed (names what).
        """
        if not isinstance(state, dict) or not isinstance(state.get("done"), list):
            raise ValueError(f"{self.task_name}: a run ledger state is {{'done': [...], 'over': bool}}, "
                             f"got {state!r:.100}")
        done: dict[str, _Done] = {}
        for item in state["done"]:
            if not (isinstance(item, list) and len(item) == 4 and item[0] in self._expected
                    and isinstance(item[1], int) and isinstance(item[2], bool)
                    and (item[3] is None or isinstance(item[3], str) and _CHECKPOINT_NAME.fullmatch(item[3]))):
                raise ValueError(f"{self.task_name}: malformed Done in a run ledger state: {item!r:.100}")
            done[item[0]] = _Done(item[1], item[2], item[3])
        final_eval = state.get("final_eval")
        if not (final_eval is None or isinstance(final_eval, list) and len(final_eval) == 2
                and type(final_eval[0]) is int and isinstance(final_eval[1], str)
                and _TASK_NAME.fullmatch(final_eval[1])):
            raise ValueError(f"{self.task_name}: malformed final evaluation in a run ledger state: {final_eval!r:.100}")
        with self._lock:
            self._done = done
            self._over = bool(state.get("over"))
            self._final_eval = (final_eval[0], final_eval[1]) if final_eval is not None else None

    def joined(self, worker: object) -> None:
        """``worker`` registered (a process of it joins the cluster): a ``Done`` it sent before no longer counts.
        Names that are not training workers (the launcher, tools) are ignored; so is anything once the run is over."""
        with self._lock:
            if not self._over and isinstance(worker, str):
                self._done.pop(worker, None)

    @property
    def over(self) -> bool:
        """Whether every training worker's ``Done`` has arrived (and is its newest process's)."""
        with self._lock:
            return self._over

    def stats(self) -> dict[str, Any]:
        """``workers_done`` (names whose ``Done`` counts), ``workers_expected``, ``run_over``."""
        with self._lock:
            counted = sorted(w for w in self._done if self._counts(w))
            return {"workers_done": counted, "workers_expected": len(self._expected), "run_over": self._over}

    def describe(self) -> str:
        """``workers 0-1 finished, final checkpoint ckpt-... written`` (or why there is none), and, where this
        task recorded it (ps task 0), ``, final model evaluated at step S by /job:worker/task:i``."""
        with self._lock:
            reports = list(self._done.values())
            finished = [w for w in self._expected if self._counts(w)]
            final_eval = self._final_eval
        named = sorted(r.final_checkpoint for r in reports if r.final_checkpoint is not None)
        if named:
            checkpoint = f"final checkpoint {named[-1]} written"
        elif any(r.checkpoint_dir for r in reports):
            checkpoint = "no final checkpoint reported: see the chief's log"
        else:
            checkpoint = "no checkpoint directory"
        evaluated = "" if final_eval is None else f", final model evaluated at step {final_eval[0]} by {final_eval[1]}"
        return f"{describe_workers(finished)} finished, {checkpoint}{evaluated}"

    def _complete(self) -> bool:  # caller holds _lock
        return bool(self._expected) and all(self._counts(w) for w in self._expected)

    def _counts(self, worker: str) -> bool:  # caller holds _lock
        report = self._done.get(worker)
        return report is not None and report.incarnation >= self._incarnation_of(worker)

    def _parse(self, frame: Frame) -> tuple[str, _Done]:
        try:
            request = DoneRequest.from_frame(frame)
        except InvalidRequest as e:
            raise InvalidRequest(f"{self.task_name}: Done: {e}") from e
        worker, final = request.worker, request.final_checkpoint
        if worker not in self._expected:
            known = describe_workers(self._expected) if self._expected else "none"
            raise InvalidRequest(f"{self.task_name}: Done from {worker!r:.100}, not a training worker of this "
                                 f"cluster ({known})")
        if final is not None and not _CHECKPOINT_NAME.fullmatch(final):
            raise InvalidRequest(f"{self.task_name}: Done of {worker}: 'final_checkpoint' must be a checkpoint's "
                                 f"directory name, got {final!r:.100}")
        return worker, _Done(request.incarnation, request.checkpoint_dir, final)
