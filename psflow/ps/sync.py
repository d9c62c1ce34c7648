"""Synchronous aggregation (``mode="sync"``, SyncReplicasOptimizer semantics) on a ps task, and the update mode config.

A ps task runs at most one coordinator, chosen by the run's :class:`SyncConfig`
(recorded at registration, identical on every task): the one below, or the
bounded-staleness :class:`~psflow.ps.staleness.StalenessClock` (``mode="ssp"``,
``psflow/ps/staleness.py``).

:class:`SyncAggregator` (``mode="sync"``, SyncReplicasOptimizer semantics)
    States of step ``S`` on this task: *collecting* → *applied*.

    1. A worker pushes a gradient tagged with the step ``T`` whose parameters
       it read. ``T < S``: the gradient is stale; it is dropped and counted
       (``stale_dropped``), and the push returns at once. ``T > S + 1`` cannot
       happen in a healthy cluster and is refused.
    2. ``T == S``: the gradient is added to step ``S``'s sums (one
       contribution per worker per step; a second one from the same worker is
       refused). The push then blocks until step ``S`` is applied.
       ``T == S + 1`` from a worker that has not contributed to ``S`` here: it
       read ``S + 1`` from ps task 0, so its gradient for ``S`` reached the tasks
       that completed ``S`` but will never reach this one (it was killed between
       two pushes and restarted; its last batch then updates only the tasks it
       reached), or the others' gradients for ``S`` are still on their way
       (backups): ``S`` is completed without it, then its gradient counts for
       ``S + 1``. A second gradient of one worker for one step (a restarted
       worker redoing the batch its killed process contributed) waits for the
       step and is dropped as stale.
    3. When ``needed = min(replicas_to_aggregate, live workers)`` contributions
       are in, the sums are averaged (``averaging="replicas"``: divided by the
       number of contributions, for every row, so N workers of batch b equal
       one process with batch N·b; ``"per_row"``: each row divided by the
       number of contributions that contained it, as TensorFlow's
       SparseConditionalAccumulator does; ``"sparse_sum"``: sparse rows summed,
       dense gradients averaged — what TensorFlow's SyncReplicasOptimizer was
       measured to do on embedding_lookup_sparse gradients in the peer
       benchmark (its eval AUC after one epoch equals the sum's, not the
       averages'), so the two runtimes can be compared at equal
       hyper-parameters), the optimizer is applied once per
       partition (a learning-rate schedule read at ``S``: it advances once per
       aggregated step), the step becomes ``S + 1`` and every blocked push returns.
       Exactly one push (the one that completed the step) is told
       ``completed=True``. Contributions arriving after that are stale
       (backup workers: with ``total_num_replicas > replicas_to_aggregate``
       the slowest gradients of each step are dropped).
    4. No silent hang: a blocked push waits at most ``timeout`` seconds after
       the step's first contribution. Then, if the missing workers have been
       silent for a whole timeout and there are at least as many backups
       (``total_num_replicas - replicas_to_aggregate``) as such workers, they
       are presumed dead and the step is applied with the replicas that remain
       (backups absorb dead workers). Otherwise, with ``on_timeout="proceed"``, the
       step is applied with the contributions it has (averaged over their
       number); with ``on_timeout="fail"`` every waiting push fails with an
       error naming the workers that did not contribute, and so does every
       later push (the run stops with that error). A missing worker saving a checkpoint (the chief) holds the
       step without timing out: :mod:`psflow.ps.save_hold`; an error then names the save. A push waiting that
       long is answered ``held`` (and counted) and sent again (the same gradient:
       not added or counted twice).
    5. A worker that runs out of data calls ``leave``; it no longer counts as
       live, so the others are never left waiting for it. A leave after a step
       failed (timed out) applies nothing: that step's pushes were refused.
    6. A restore after a ps task died (:mod:`psflow.train.recovery`):
       ``abort`` at its start fails the waiting pushes (their workers wait for
       the restore), ``reset`` at its end starts over at the restored step.

Thread-safety: every method may be called from concurrent RPC threads.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psflow.ps.save_hold import SaveHold, SaveNotices
from psflow.ps.store import ParameterStore, PartitionState
from psflow.ps.sync_sums import sum_rows
from psflow.rpc.api import InvalidRequest, PreconditionFailed

__all__ = [
    "MODES",
    "SyncConfig",
    "SyncAggregator",
    "SyncResult",
    "Contribution",
    "AppliedStep",
]

log = logging.getLogger(__name__)

MODES = ("async", "sync", "ssp")
AVERAGINGS = ("replicas", "per_row", "sparse_sum")


@dataclass(frozen=True)
class SyncConfig:
    """How updates are coordinated; identical on every task of a run.

    Attributes:
        mode: ``async`` (apply on arrival), ``sync`` (aggregate, SyncReplicas
            semantics) or ``ssp`` (apply on arrival, bounded staleness).
        replicas_to_aggregate: contributions averaged into one step (sync).
        total_num_replicas: workers taking part (sync and ssp).
        staleness: how many steps a worker may run ahead of the slowest (ssp).
        timeout: seconds a step (sync) or a slow worker (ssp) may hold others.
        on_timeout: ``proceed`` (apply with what arrived; ssp: drop the slow
            worker) or ``fail`` (stop with an error naming the missing tasks).
        averaging: ``replicas``, ``per_row`` or ``sparse_sum`` (see module docstring).
    """

    mode: str = "async"
    replicas_to_aggregate: int = 1
    total_num_replicas: int = 1
    staleness: int = 0
    timeout: float = 30.0
    on_timeout: str = "fail"
    averaging: str = "replicas"

    def __post_init__(self) -> None:
        problems = [
            (self.mode in MODES, f"mode must be one of {', '.join(MODES)}, got {self.mode!r}"),
            (self.total_num_replicas >= 1, f"total_num_replicas must be >= 1, got {self.total_num_replicas}"),
            (1 <= self.replicas_to_aggregate <= self.total_num_replicas,
             f"replicas_to_aggregate must be in 1..total_num_replicas ({self.total_num_replicas}), "
             f"got {self.replicas_to_aggregate}"),
            (self.staleness >= 0, f"staleness must be >= 0, got {self.staleness}"),
            (self.timeout > 0, f"timeout must be > 0 seconds, got {self.timeout}"),
            (self.on_timeout in ("proceed", "fail"), f"on_timeout must be proceed or fail, got {self.on_timeout!r}"),
            (self.averaging in AVERAGINGS, f"averaging must be one of {', '.join(AVERAGINGS)}, got {self.averaging!r}"),
        ]
        for ok, message in problems:
            if not ok:
                raise ValueError(message)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, data: Any) -> SyncConfig:
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"sync config must be an object, got {type(data).__name__}")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown sync setting(s): {', '.join(sorted(unknown))}")
        return cls(**data)


@dataclass
class Contribution:
    """One worker's gradient for one step, validated against the store."""

    worker: str
    # (partition, rows or None for dense, values)
    grads: Sequence[tuple[PartitionState, np.ndarray | None, np.ndarray]]
    #: The push it came with (the service's request), handed back with the applied step (:class:`AppliedStep`).
    push: object = None


@dataclass(frozen=True)
class AppliedStep:
    """What one applied sync step did, for a replicated shard's primary (:mod:`psflow.ps.replication`), which
    forwards it as one entry: the step's rows and the records of every push it applied go together."""

    step: int  # this task's step after it
    written: list[tuple[PartitionState, np.ndarray | None]]  # the partitions it wrote, their rows (None: whole)
    contributions: list[Contribution]  # the pushes it applied
    completer: Contribution | None  # the push that completed it (its reply says completed), if one did


@dataclass(frozen=True)
class SyncResult:
    """What a push in sync mode got back."""

    step: int            # this task's step after the push (S + 1 once its step was applied)
    accepted: bool       # False: stale, dropped
    completed: bool      # True for exactly one push per step: the one that completed it
    held: bool = False   # not applied yet: the step waits for a saving chief; the push is sent again (save_hold)
    counted: bool = False  # the same push again (sent again after a held answer, which counted it): not counted


@dataclass
class _Sums:
    dense: dict[str, np.ndarray] = field(default_factory=dict)
    sparse: dict[str, list[tuple[np.ndarray, np.ndarray]]] = field(default_factory=dict)
    parts: dict[str, PartitionState] = field(default_factory=dict)
    contributions: list[Contribution] = field(default_factory=list)  # kept only for on_applied


class SyncAggregator(SaveNotices):
    """Aggregates the gradients of one step, then applies them once."""

    def __init__(self, config: SyncConfig, store: ParameterStore, *, task_name: str,
                 advance: Callable[[], int], current: Callable[[], int],
                 clock: Callable[[], float] = time.monotonic,
                 on_applied: Callable[[AppliedStep], None] | None = None) -> None:
        """Args:
            config: the sync settings.
            store: the partitions this task holds.
            task_name: for errors and logs.
            advance: moves this task's step from S to S + 1 and returns S + 1
                (global_step's increment on ps 0, a local counter elsewhere).
            current: this task's step S.
            clock: time source (tests may inject one).
            on_applied: called after each applied step (under the step's lock) with what it wrote and whose
                pushes it applied (:class:`AppliedStep`): a replicated shard's primary forwards them
                (:mod:`psflow.ps.replication`). None: nothing is collected.
        """
        self.config = config
        self.store = store
        self.task_name = task_name
        self._advance, self._current, self._clock = advance, current, clock
        self._on_applied = on_applied
        self._cond = threading.Condition()
        self._sums = _Sums()
        self._contributors: list[str] = []
        self._first_at: float | None = None
        self._left: set[str] = set()
        # Workers already at the next step, not waited for in the current one (see contribute).
        self._absent: set[str] = set()
        # worker -> when it last contributed (start: when this aggregator was made)
        self._workers = tuple(f"/job:worker/task:{i}" for i in range(config.total_num_replicas))
        self._last_seen: dict[str, float] = {w: clock() for w in self._workers}
        self._failure: str | None = None
        self._hold = SaveHold(clock)  # the saves the workers told of (psflow.ps.save_hold)
        self._held: dict[str, int] = {}  # worker -> the step its push was answered held at: its next is the same
        self.stale_dropped = 0
        self.steps_applied = 0
        self.timeouts = 0

    # ---- public ------------------------------------------------------------
    def needed(self) -> int:
        live = self.config.total_num_replicas - len(self._left | self._absent)
        return max(1, min(self.config.replicas_to_aggregate, live))

    def contribute(self, tag: int, contribution: Contribution) -> SyncResult:
        """Adds a gradient tagged with step ``tag``; blocks until that step is applied.

        Raises:
            PreconditionFailed: the step timed out under ``on_timeout="fail"``
                (names the missing workers), or this worker already contributed.
            InvalidRequest: ``tag`` is ahead of this task's step.
        """
        with self._cond:
            self._raise_if_failed()
            step = self._current()
            worker = contribution.worker
            if self._held.get(worker) == tag:  # the same push again after a held answer: its gradient is in
                del self._held[worker]
                return dataclasses.replace(self._wait_for(tag, worker), counted=True)
            if tag == step + 1 and worker not in self._contributors:
                # The worker read step + 1 from ps task 0, so its gradient for `step` reached the
                # tasks that completed it but will never reach this one (it was killed between its
                # pushes and restarted), or this task is still collecting `step` from the others
                # (backups). Either way `step` goes on without it.
                self._absent.add(worker)
                log.info("%s: %s is at step %d; step %d goes on without it", self.task_name, worker, tag, step)
                if self._contributors and len(self._contributors) >= self.needed():
                    self._apply()
                else:
                    self._wait_for(step)
                step = self._current()
            if tag < step:
                self.stale_dropped += 1
                log.info("%s: dropped stale gradient of %s (step %d, now %d)", self.task_name, worker, tag, step)
                return SyncResult(step, accepted=False, completed=False)
            if tag > step:
                raise InvalidRequest(f"gradient of {worker} is tagged step {tag}, ahead of step {step}")
            if worker in self._contributors:
                # A restarted worker redoing the batch its killed process already contributed (that one is applied
                # and counted, at its held answer during a save): wait for the step, then drop this one. During a
                # save it is answered held too (before its own deadline), and sent again: counted by neither.
                log.info("%s: %s contributed to step %d already; its second gradient is not added", self.task_name,
                         worker, step)
                result = self._wait_for(step, worker)
                if result.held:
                    return dataclasses.replace(result, counted=True)
                self.stale_dropped += 1
                return dataclasses.replace(result, accepted=False)
            self._add(contribution)
            if len(self._contributors) >= self.needed():
                return SyncResult(self._apply(contribution), accepted=True, completed=True)
            return self._wait_for(step, worker)

    def leave(self, worker: str) -> None:
        """``worker`` has finished (out of data); it is no longer waited for."""
        with self._cond:
            if worker in self._left:
                return
            self._left.add(worker)
            log.info("%s: %s left; %d live replicas", self.task_name, worker,
                     self.config.total_num_replicas - len(self._left))
            # A step that failed (timed out) stays failed until a restore: its pushes were refused, so a leave
            # after it must not apply what they sent.
            if self._failure is None and self._contributors and len(self._contributors) >= self.needed():
                self._apply()

    def _heard_from(self, worker: str) -> None:
        """A save notice is a sign of life: ``worker`` is not presumed gone (backups absorb dead workers)."""
        if worker in self._last_seen:
            self._last_seen[worker] = self._clock()

    def abort(self, reason: str) -> None:
        """Abandons the step being collected: every waiting and later push fails with
        PreconditionFailed(``reason``) until :meth:`reset` (a restore after a ps death)."""
        with self._cond:
            self._failure = reason
            self._sums, self._contributors, self._first_at = _Sums(), [], None
            self._held.clear()
            self._cond.notify_all()

    def reset(self) -> None:
        """Starts over at this task's current step (after a restore): no contributions, no
        failure, every worker live again (a rewound worker trains and leaves again)."""
        with self._cond:
            self._failure = None
            self._sums, self._contributors, self._first_at = _Sums(), [], None
            self._left.clear()
            self._absent.clear()
            self._hold.forget()
            self._held.clear()
            now = self._clock()
            self._last_seen = dict.fromkeys(self._last_seen, now)

    def replica_state(self) -> dict[str, Any]:
        """The workers that left and the counts (:mod:`psflow.ps.replication`). Read without the lock (a
        set's copy is atomic under the GIL): the primary reads it while holding the step's lock, or not."""
        return {"left": sorted(self._left), "steps_applied": self.steps_applied, "stale_dropped": self.stale_dropped}

    def load_replica_state(self, state: dict[str, Any]) -> None:
        """Sets the workers that left and the counts to ``state`` (a :meth:`replica_state` of the primary)."""
        with self._cond:
            self._left = {str(w) for w in state.get("left", ())}
            self.steps_applied = int(state.get("steps_applied", self.steps_applied))
            self.stale_dropped = int(state.get("stale_dropped", self.stale_dropped))

    def stats(self) -> dict[str, Any]:
        with self._cond:
            waiting = self._failure is None and bool(self._contributors)
            return {
                "stale_dropped": self.stale_dropped,
                "sync_steps_applied": self.steps_applied,
                "sync_timeouts": self.timeouts,
                "live_replicas": self.config.total_num_replicas - len(self._left),
                # The step being collected: who contributed, the live workers it may still wait for
                # (any ``needed() - contributed`` of them complete it), and for how long. A failed step (timed out
                # under on_timeout="fail", or abandoned for a restore) waits for nobody: every push is refused
                # until :meth:`reset`, and ``sync_failed`` is the refusal's words.
                "sync_contributed": list(self._contributors),
                "sync_waiting_for": [w for w in self._last_seen if w not in self._contributors
                                     and w not in self._left and w not in self._absent] if waiting else [],
                "sync_waiting_seconds": self._clock() - self._first_at if waiting and self._first_at is not None else None,
                "sync_failed": self._failure,
            }

    # ---- internals (hold self._cond) ---------------------------------------
    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise PreconditionFailed(self._failure)

    def _add(self, c: Contribution) -> None:
        if not self._contributors:
            self._first_at = self._clock()
        self._contributors.append(c.worker)
        if self._on_applied is not None:
            self._sums.contributions.append(c)
        self._last_seen[c.worker] = self._clock()
        for part, rows, values in c.grads:
            self._sums.parts[part.key] = part
            if rows is None:
                acc = self._sums.dense.get(part.key)
                if acc is None:
                    self._sums.dense[part.key] = values.astype(np.float64)
                else:
                    acc += values
            elif rows.size:
                self._sums.sparse.setdefault(part.key, []).append((rows, values))

    def _wait_for(self, step: int, worker: str | None = None) -> SyncResult:
        """Waits until ``step`` is applied; ``worker``'s push is answered held (it is sent again) once it waited
        ``timeout`` s while a missing worker's save holds the step: before its caller's deadline runs out."""
        arrived = self._clock()
        while self._current() == step:
            self._raise_if_failed()
            now = self._clock()
            first = self._first_at if self._first_at is not None else now
            heard = self._hold.heard(self._missing())  # a missing worker saving: heard from
            if worker is not None and heard is not None and heard > first and now - arrived >= self.config.timeout:
                self._held[worker] = step
                return SyncResult(step, accepted=True, completed=False, held=True)
            remaining = max(first, heard or first) + self.config.timeout - now
            if remaining <= 0:
                self._on_timeout(step)
                continue
            answer = arrived + self.config.timeout - now
            self._cond.wait(timeout=min(remaining, answer) if worker is not None and answer > 0 else remaining)
        self._raise_if_failed()
        return SyncResult(self._current(), accepted=True, completed=False)

    def _missing(self) -> list[str]:
        """The live workers the step waits for, in task order. Read by every waiting push each time it wakes (a save
        under way or not): one pass over the workers, sets only (a contributor list's ``in`` made it quadratic)."""
        contributed = set(self._contributors)
        return [w for w in self._workers if w not in contributed and w not in self._left and w not in self._absent]

    def _on_timeout(self, step: int) -> None:
        self.timeouts += 1
        have, need = len(self._contributors), self.needed()
        # Backups absorb dead workers: a worker silent for a whole timeout is presumed gone, and as long
        # as no more are gone than there are backups, the step goes on with the replicas that remain.
        now = self._clock()
        gone = [w for w in self._missing() if now - self._last_seen.get(w, now) >= self.config.timeout]
        backups = self.config.total_num_replicas - self.config.replicas_to_aggregate
        live = self.config.total_num_replicas - len(self._left) - len(gone)
        if gone and len(gone) <= backups and have >= max(1, min(self.config.replicas_to_aggregate, live)):
            log.warning("%s: step %d: %s silent for %.1f s, presumed gone; applying %d gradients (backups absorb it)",
                        self.task_name, step, ", ".join(gone), self.config.timeout, have)
            self._apply()
            return
        missing = (", ".join(self._missing()) or "none") + self._hold.describe(self._missing(), self._first_at)
        if self.config.on_timeout == "proceed":
            log.warning("%s: step %d timed out after %.1f s with %d of %d gradients (missing: %s); "
                        "applying what arrived", self.task_name, step, self.config.timeout, have, need, missing)
            self._apply()
            return
        # (No task name: the refusal a push gets names the serving task and the method, psflow.rpc.api.refusal.)
        self._failure = (f"sync step {step} timed out after {self.config.timeout:.1f} s "
                         f"with {have} of {need} gradients; missing: {missing}")
        log.error("%s: %s", self.task_name, self._failure)
        self._cond.notify_all()

    def _apply(self, completer: Contribution | None = None) -> int:
        """Applies the step collected; ``completer``: the push whose contribution completed it (None: a leave,
        a timeout or a worker already at the next step made it go on)."""
        count = len(self._contributors)
        sums, self._sums = self._sums, _Sums()
        self._contributors, self._first_at = [], None
        self._absent.clear()
        at = self._current()  # the step before this update's increment: a learning-rate schedule's step
        written: list[tuple[PartitionState, np.ndarray | None]] | None = [] if self._on_applied is not None else None
        for key, total in sums.dense.items():
            self.store.apply_dense(sums.parts[key], (total / count).astype(sums.parts[key].value.dtype), step=at)
            if written is not None:
                written.append((sums.parts[key], None))
        for key, pieces in sums.sparse.items():
            part = sums.parts[key]
            rows, values = sum_rows(pieces)
            if self.config.averaging == "per_row":
                contained = np.zeros(rows.size, dtype=np.float64)
                for r, _ in pieces:
                    contained[np.searchsorted(rows, np.unique(r))] += 1
                values /= contained.reshape((-1,) + (1,) * (values.ndim - 1))
            elif self.config.averaging == "replicas":
                values /= count
            self.store.apply_sparse(part, rows, values.astype(part.value.dtype), step=at)
            if written is not None:
                written.append((part, rows))
        step = self._advance()
        self.steps_applied += 1
        if self._on_applied is not None and written is not None:
            self._on_applied(AppliedStep(step, written, sums.contributions, completer))
        self._cond.notify_all()
        return step

