"""One worker process's numbered pushes, applied by a ps task in the order they were made.

A worker with more than one push in flight to a ps task (``--steps-in-flight``
3 or more: concurrent gRPC calls, each served by a handler thread of its own)
numbers them: ``seq`` 0, 1, 2, ... per sequence (``stream``: a number the
worker process picks, higher for each new one, e.g. after a recovery) and ps
task, sent in :class:`~psflow.ps.protocol.WorkerTag` with the process's
``incarnation``. Guarantees, per ps task:

* **Order.** Push ``n`` of a process is applied (or refused) only after push
  ``n - 1`` of the same process was: :meth:`PushOrder.enter` blocks the
  handler thread until it is its turn. Pushes of other workers, and unnumbered
  pushes (``seq`` None: one push in flight, as before), never wait here.
* **A prefix, nothing after a gap.** The pushes applied are always a prefix of
  the process's sequence. Once one push is refused (any error while it was
  handled) or its predecessor did not arrive within :attr:`PushOrder.timeout`
  seconds, every later push of that process is refused with
  :class:`~psflow.rpc.api.PreconditionFailed` naming the worker and the push that
  broke the sequence; so the reader position recorded is always that of the
  last push applied, and no batch after a lost one counts. The worker fails on
  the first error anyway; its next process starts a new sequence.
* **Once.** A push numbered below the next one expected (a repeat) is refused,
  never applied twice.
* **Processes and sequences.** A push of a newer incarnation, or of a newer
  stream of the same one, starts that worker's sequence afresh at 0 (the older
  one's waiting pushes are refused, and its later ones); a push of an older
  incarnation passes through unordered
  (:class:`~psflow.ps.worker_ledger.WorkerLedger` refuses it next). State: one
  entry per worker.

Waiting pushes each hold a handler thread: a ps task serves up to
``max_workers`` calls at once (64 for a served ps task), so workers x (pushes in
flight - 1) must stay below that. Thread-safe.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from psflow.rpc.api import PreconditionFailed

__all__ = ["PushOrder", "ORDER_TIMEOUT"]

log = logging.getLogger("psflow.ps.service")

#: Seconds a numbered push waits for its predecessor before the process's sequence is broken.
ORDER_TIMEOUT = 60.0


@dataclass
class _Sequence:
    incarnation: int
    stream: int
    expected: int = 0              # the next seq to apply
    broken_at: int | None = None   # the seq that was refused or never arrived: it and every later one refused
    why: str = ""


class PushOrder:
    """The numbered pushes of each worker process on one ps task (see the module docstring)."""

    def __init__(self, task_name: str, *, timeout: float = ORDER_TIMEOUT) -> None:
        """Args:
            task_name: this ps task (messages name it).
            timeout: seconds a push waits for its predecessor (:attr:`timeout`, settable).
        """
        self.task_name = task_name
        self.timeout = timeout
        self._cond = threading.Condition(threading.Lock())
        self._of: dict[str, _Sequence] = {}
        self._waiting = 0

    def waiting(self) -> int:
        """Pushes blocked in :meth:`enter` now (tests, stats)."""
        with self._cond:
            return self._waiting

    def enter(self, worker: str, incarnation: int, stream: int, seq: int) -> bool:
        """Blocks until push ``seq`` of sequence ``stream`` of ``worker``'s process ``incarnation`` may be
        applied.

        Returns:
            True: the caller must call :meth:`leave` once the push was handled (applied or refused);
            False: an older process's push, not ordered here (no :meth:`leave`).

        Raises:
            PreconditionFailed: a repeat; an older sequence of the process; the sequence was broken at or
                before ``seq``; or the predecessor did not arrive within :attr:`timeout` (the sequence is
                broken there from now on).
        """
        with self._cond:
            state = self._of.get(worker)
            if state is None or (incarnation, stream) > (state.incarnation, state.stream):
                if state is not None and incarnation == state.incarnation:
                    log.info("%s: %s (incarnation %d) started a new sequence of pushes", self.task_name, worker,
                             incarnation)
                state = self._of[worker] = _Sequence(incarnation, stream)
                self._cond.notify_all()  # the older sequence's waiting pushes are refused
            elif incarnation < state.incarnation:
                return False
            elif stream < state.stream:
                raise PreconditionFailed(f"{self.task_name}: push {seq} of {worker} (incarnation {incarnation}) "
                                         "refused: it belongs to an earlier sequence of that process")
            self._refuse_if_broken(worker, state, seq)
            if seq < state.expected:
                raise PreconditionFailed(f"{self.task_name}: push {seq} of {worker} (incarnation {incarnation}) "
                                         f"was handled already (next expected: {state.expected}): a repeat")
            self._waiting += 1
            try:
                arrived = self._cond.wait_for(
                    lambda: state.expected == seq or state.broken_at is not None or self._of.get(worker) is not state,
                    timeout=self.timeout)
            finally:
                self._waiting -= 1
            if self._of.get(worker) is not state:
                raise PreconditionFailed(f"{self.task_name}: push {seq} of {worker} (incarnation {incarnation}) "
                                         "refused: a later process of the worker, or a later sequence of this "
                                         "one, started")
            if not arrived:
                self._break(state, state.expected, f"push {state.expected} never arrived ({self.timeout:g} s "
                                                   f"after push {seq} did)")
            self._refuse_if_broken(worker, state, seq)
            return True

    def leave(self, worker: str, incarnation: int, stream: int, seq: int, *, ok: bool, why: str = "") -> None:
        """Push ``seq`` (let in by :meth:`enter`) was handled: the next one's turn; ``ok`` False (it was
        refused: ``why``) breaks the sequence there."""
        with self._cond:
            state = self._of.get(worker)
            if state is None or (state.incarnation, state.stream) != (incarnation, stream):
                return
            if ok:
                state.expected = seq + 1
            else:
                self._break(state, seq, f"push {seq} was refused ({why:.200})" if why else f"push {seq} was refused")
            self._cond.notify_all()

    def _break(self, state: _Sequence, seq: int, why: str) -> None:  # caller holds _cond
        if state.broken_at is None:
            state.broken_at, state.why = seq, why
            log.warning("%s: pushes of incarnation %d from push %d on are refused: %s", self.task_name,
                        state.incarnation, seq, why)
            self._cond.notify_all()

    def _refuse_if_broken(self, worker: str, state: _Sequence, seq: int) -> None:  # caller holds _cond
        if state.broken_at is not None and seq >= state.broken_at:
            raise PreconditionFailed(f"{self.task_name}: push {seq} of {worker} (incarnation {state.incarnation}) "
                                     f"refused: the pushes are applied in order and {state.why}")
