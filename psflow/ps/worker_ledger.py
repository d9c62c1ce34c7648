"""The workers as one ps task sees them: each one's newest process, its pushes in flight, its reader
position, and whether it finished its data.

Incarnations: each worker process picks one (``time.time_ns()`` at start, so a
restarted worker's is higher, unless its host's clock is behind the replaced
process's: it is then refused as the earlier one, the line saying so) and sends it with every push and with its
``ReaderPositions`` request. A push carrying a lower incarnation than the
highest seen for that worker is refused (FAILED_PRECONDITION, before anything
is applied); a ``ReaderPositions`` request with an incarnation records it and
first waits (at most 5 s) for that worker's pushes in flight. So a push of a
replaced worker process that the network delivers late (its socket's data sent
after a link heals) is never applied after the new process read its position:
each record stays counted once.

Reader positions (on the task holding global_step): the newest position each
worker pushed with, and the count of examples pushed, read together
(:meth:`WorkerLedger.progress`): a checkpoint records one consistent pair.

Finished workers (on the task holding global_step): the workers whose ``Leave``
arrived since the last restore; a restore forgets them, as it rewinds every
worker to the checkpoint.
"""

from __future__ import annotations

import logging
import threading

from psflow.rpc.api import InvalidRequest, PreconditionFailed

__all__ = ["WorkerLedger"]

log = logging.getLogger("psflow.ps.service")
# An incarnation is its process's start time on its own host's clock: a live process whose clock is behind the
# one it replaced is taken for the earlier one (its every call refused), which the line says.
_EARLIER = ("push from an earlier process of {worker} (incarnation {incarnation} < {highest}) refused: the worker "
            "was restarted (if this is its live process, its host's clock is behind the replaced one's)")


class WorkerLedger:
    """Incarnations, pushes in flight, reader positions and finished workers of one ps task. Thread-safe."""

    def __init__(self, task_name: str, *, records_positions: bool) -> None:
        """Args:
            task_name: this ps task (messages name it).
            records_positions: this task records reader positions and finished workers (it holds global_step).
        """
        self.task_name = task_name
        self._records = records_positions
        # Entered as the plain lock (cheap: every push takes it twice); waited on through the condition.
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._incarnations: dict[str, int] = {}  # worker -> highest incarnation (process) seen
        self._inflight_of: dict[str, int] = {}  # worker -> its pushes being applied (or waiting, in sync)
        self._positions: dict[str, str] = {}  # worker -> newest ReaderPosition JSON it pushed with
        self._examples = 0  # examples pushed (with the positions: read together)
        self._finished: set[str] = set()

    # ---- pushes ---------------------------------------------------------------------------------
    def admit(self, worker: str | None, incarnation: int | None) -> None:
        """Records ``worker``'s incarnation and counts its push in (until :meth:`release`).

        Raises:
            PreconditionFailed: the push comes from an earlier process of ``worker``.
        """
        with self._lock:
            self._check(worker, incarnation)
            key = worker or ""
            self._inflight_of[key] = self._inflight_of.get(key, 0) + 1

    def release(self, worker: str | None) -> None:
        """A push admitted by :meth:`admit` is done."""
        key = worker or ""
        with self._lock:
            self._inflight_of[key] -= 1
            if not self._inflight_of[key]:
                del self._inflight_of[key]
                self._cond.notify_all()

    def record_push(self, worker: str | None, position: str | None, examples: int) -> None:
        """An applied push trained ``examples`` examples, up to ``worker``'s reader ``position`` (None: not sent)."""
        with self._lock:
            self._examples += examples
            if position is not None and worker is not None and self._records:
                self._positions[worker] = position

    def _check(self, worker: str | None, incarnation: int | None) -> None:  # caller holds _cond
        if incarnation is None:
            return
        if worker is None:
            raise InvalidRequest(f"'incarnation' must be sent with 'worker', got {incarnation!r:.40}")
        highest = self._incarnations.get(worker, 0)
        if incarnation < highest:
            why = _EARLIER.format(worker=worker, incarnation=incarnation, highest=highest)
            log.warning("%s: %s", self.task_name, why)
            raise PreconditionFailed(f"{self.task_name}: {why}")
        self._incarnations[worker] = incarnation

    # ---- processes --------------------------------------------------------------------------------
    def claim(self, worker: str | None, incarnation: int, drain_timeout: float = 5.0) -> None:
        """A (re)started worker process: records its incarnation (earlier ones are refused from now on) and
        waits up to ``drain_timeout`` s for that worker's pushes in flight (only its own: in sync mode the
        others' wait for this one), so that the reader position read next is not changed by a push of an
        earlier process.

        Raises:
            PreconditionFailed: a later process of ``worker`` claimed already.
        """
        with self._lock:
            self._check(worker, incarnation)
            self._cond.wait_for(lambda: worker not in self._inflight_of, timeout=drain_timeout)

    def incarnation_of(self, worker: str) -> int:
        """The highest incarnation (process) of ``worker`` seen in a push or claim here; 0: none."""
        with self._lock:
            return self._incarnations.get(worker, 0)

    # ---- reader positions ----------------------------------------------------------------------
    def progress(self) -> tuple[dict[str, str], int]:
        """The reader positions and the examples pushed with them, read together (one consistent pair)."""
        with self._lock:
            return dict(self._positions), self._examples

    def positions(self) -> dict[str, str]:
        """A copy of worker -> newest reported ReaderPosition JSON."""
        with self._lock:
            return dict(self._positions)

    @property
    def examples(self) -> int:
        """Examples pushed (since the start, or as restored)."""
        return self._examples

    def restore(self, positions: dict[str, str], examples: int | None = None) -> None:
        """Replaces the recorded positions (a restore from a checkpoint), and the examples pushed with them
        when given."""
        with self._lock:
            self._positions = dict(positions)
            if examples is not None:
                self._examples = examples

    # ---- finished workers -------------------------------------------------------------------------
    def finish(self, worker: str) -> None:
        """``worker`` finished its data (``Leave``)."""
        if self._records:
            with self._lock:
                self._finished.add(worker)

    def finished(self) -> list[str] | None:
        """The workers that finished since the last restore, sorted (None off the task holding global_step)."""
        if not self._records:
            return None
        with self._lock:
            return sorted(self._finished)

    def forget_finished(self) -> None:
        """A restore rewinds every worker: none has finished."""
        with self._lock:
            self._finished.clear()

    # ---- replicated shards ------------------------------------------------------------------------
    def replica_state(self) -> dict[str, object]:
        """Incarnations, positions, examples and finished workers, read together (:mod:`psflow.ps.replication`)."""
        with self._lock:
            return {"incarnations": dict(self._incarnations), "reader_positions": dict(self._positions),
                    "examples": self._examples, "finished": sorted(self._finished)}

    def load_replica_state(self, state: dict[str, object]) -> None:
        """Replaces the ledger's records with ``state`` (a :meth:`replica_state` of the shard's primary)."""
        incarnations, positions, examples, finished = (state.get("incarnations"), state.get("reader_positions"),
                                                       state.get("examples"), state.get("finished"))
        with self._lock:
            if isinstance(incarnations, dict):
                self._incarnations = {str(k): int(v) for k, v in incarnations.items()}
            if isinstance(positions, dict):
                self._positions = {str(k): str(v) for k, v in positions.items()}
            if isinstance(examples, int):
                self._examples = examples
            if isinstance(finished, list):
                self._finished = {str(w) for w in finished}
