"""Bounded staleness (``mode="ssp"``) on the ps task holding global_step.

:class:`StalenessClock`: pushes are applied on arrival (as in async mode).
Each push carries the worker's clock (its completed iterations). Before the
push returns, the worker waits until ``clock - min(clock of live workers) <=
staleness``. A slowest worker whose clock has not moved for ``timeout`` seconds,
counted from its last move or from the start of the push's wait, whichever is
later, is declared lost (logged, counted) and no longer holds the others back;
with ``on_timeout="fail"`` the waiting push fails instead, naming that worker.
(Counted from the last move alone, a worker still waiting for the chief's
initial checkpoint -- the others start only once it is saved -- was declared lost
at the chief's first wait, when that save had lasted longer than ``timeout``.) A
worker that runs out of data calls ``leave`` and no longer counts.

A chief's checkpoint save holds the others as a sync step's does (:mod:`psflow.ps.save_hold`; the chief
sends its notices in ssp mode too, to the task holding global_step): its clock does not move while it saves,
so a worker that ran ``staleness`` steps ahead waits; a slowest worker heard saving counts as moving at its
newest notice (up to the save's ``--save-timeout``), so it is not declared lost while it saves, and a push
that waited ``timeout`` seconds during such a save is answered *held* (:attr:`Waited.held`: it was applied and
counted, its wait is not over) before its client's deadline (``--rpc-timeout`` + ``--sync-timeout``). The
client sends it again (:meth:`psflow.ps.task_calls.TaskCalls.collect`); that resend is not applied again
(:meth:`StalenessClock.resent`), it only waits, and its reply carries the global_step the push took.

The run's :class:`~psflow.ps.sync.SyncConfig` (``staleness``, ``timeout``,
``on_timeout``, ``total_num_replicas``) sets it up; the synchronous
aggregator, the other coordinator, is :mod:`psflow.ps.sync`.

Thread-safety: every method may be called from concurrent RPC threads.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from psflow.ps.save_hold import SaveHold, SaveNotices
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import InvalidRequest, PreconditionFailed

__all__ = ["StalenessClock", "Waited"]

log = logging.getLogger("psflow.ps.sync")  # the name its lines had before the split from sync.py


@dataclass(frozen=True)
class Waited:
    """How a push's wait ended: the slowest live worker's clock then; ``held``: not over (a saving worker holds
    it; the push is sent again and waits on, :meth:`StalenessClock.resent`)."""

    min_clock: int
    held: bool = False


class StalenessClock(SaveNotices):
    """Bounded staleness: holds a worker back while it is too far ahead."""

    def __init__(self, config: SyncConfig, *, task_name: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.task_name = task_name
        self._time = clock
        self._cond = threading.Condition()
        self._clocks: dict[str, int] = {f"/job:worker/task:{i}": 0 for i in range(config.total_num_replicas)}
        self._moved_at: dict[str, float] = {w: clock() for w in self._clocks}
        self._gone: set[str] = set()
        self.lost: list[str] = []
        self.waits = 0
        self._hold = SaveHold(clock)  # the saves the workers told of (psflow.ps.save_hold)
        # worker -> (clock, the step its push took, its process) of its push answered held
        self._held: dict[str, tuple[int, int | None, int | None]] = {}
        self._since: dict[str, tuple[int, float]] = {}  # worker -> (clock, since when its push of it waits)

    def _live(self) -> dict[str, int]:
        return {w: c for w, c in self._clocks.items() if w not in self._gone}

    def min_clock(self) -> int:
        live = self._live()
        return min(live.values()) if live else 0

    def advance(self, worker: str, clock: int) -> Waited:
        """Records ``worker``'s clock; blocks while it is more than ``staleness`` ahead.

        Returns:
            The slowest live worker's clock when this worker may go on, or held: it waited ``timeout`` seconds
            while the slowest worker saves a checkpoint (its caller sends it again, :meth:`held`, :meth:`resent`).
        """
        with self._cond:
            if worker not in self._clocks:
                raise InvalidRequest(f"{worker} is not one of the {self.config.total_num_replicas} replicas")
            now = arrived = self._time()
            if clock > self._clocks[worker]:
                self._clocks[worker], self._moved_at[worker] = clock, now
                self._cond.notify_all()
            # Since when this worker's push of `clock` waits (kept across its held answers and resends).
            since = self._since[worker][1] if self._since.get(worker, (None,))[0] == clock else arrived
            self._since[worker] = (clock, since)
            waited = False
            while clock - self.min_clock() > self.config.staleness:
                waited = True
                slow = min(self._live().items(), key=lambda kv: kv[1])[0]
                now = self._time()
                heard = self._hold.heard([slow])  # the slowest worker saving: heard from
                due = max(self._moved_at[slow], heard or since, since) + self.config.timeout
                if (heard is not None and heard > self._moved_at[slow] and now - arrived >= self.config.timeout
                        and now < due):
                    self.waits += 1
                    return Waited(self.min_clock(), held=True)
                if due - now <= 0:
                    self._declare_lost(slow)
                    continue
                answer = arrived + self.config.timeout - now
                self._cond.wait(timeout=min(due - now, answer) if answer > 0 else due - now)
            self._since.pop(worker, None)
            self.waits += int(waited)
            return Waited(self.min_clock())

    def held(self, worker: str, clock: int, step: int | None, incarnation: int | None = None) -> None:
        """``worker``'s push of ``clock`` from its process ``incarnation``, which took global_step ``step``, was
        answered held: its resend is not applied again (:meth:`resent`)."""
        with self._cond:
            self._held[worker] = (clock, step, incarnation)

    def resent(self, worker: str, clock: int | None, incarnation: int | None = None) -> tuple[bool, int | None]:
        """Whether ``worker``'s push of ``clock`` is the resend of one answered held (then only its wait goes on),
        and the global_step that push took. A push of another process of ``worker`` is not (it is applied)."""
        with self._cond:
            held = self._held.pop(worker, None)
            if held is None or held[0] != clock or held[2] != incarnation:
                return False, None
            return True, held[1]

    def leave(self, worker: str) -> None:
        with self._cond:
            self._gone.add(worker)
            self._cond.notify_all()

    def _declare_lost(self, worker: str) -> None:
        if self.config.on_timeout == "fail":
            raise PreconditionFailed(
                f"{self.task_name}: {worker} made no progress for {self.config.timeout:.1f} s (clock {self._clocks[worker]})"
                + self._hold.describe([worker], self._moved_at[worker]))
        log.warning("%s: %s made no progress for %.1f s; no longer waiting for it", self.task_name, worker,
                    self.config.timeout)
        self._gone.add(worker)
        self.lost.append(worker)
        self._cond.notify_all()

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {"ssp_clocks": dict(self._clocks), "ssp_lost": list(self.lost), "ssp_waits": self.waits}
