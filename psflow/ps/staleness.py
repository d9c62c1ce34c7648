"""Bounded staleness (``mode="ssp"``) on the ps task holding global_step.

:class:`StalenessClock`: pushes are applied on arrival (as in async mode).
Each push carries the worker's clock (its completed iterations). Before the
push returns, the worker waits until ``clock - min(clock of live workers) <=
staleness``. A worker whose clock has not moved for ``timeout`` seconds is
declared lost (logged, counted) and no longer holds the others back; with
``on_timeout="fail"`` the waiting push fails instead, naming that worker. A
worker that runs out of data calls ``leave`` and no longer counts.

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
from typing import Any

from psflow.ps.sync import SyncConfig
from psflow.rpc.api import InvalidRequest, PreconditionFailed

__all__ = ["StalenessClock"]

log = logging.getLogger("psflow.ps.sync")  # the name its lines had before the split from sync.py


class StalenessClock:
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

    def _live(self) -> dict[str, int]:
        return {w: c for w, c in self._clocks.items() if w not in self._gone}

    def min_clock(self) -> int:
        live = self._live()
        return min(live.values()) if live else 0

    def advance(self, worker: str, clock: int) -> int:
        """Records ``worker``'s clock; blocks while it is more than ``staleness`` ahead.

        Returns:
            The slowest live worker's clock when this worker may go on.
        """
        with self._cond:
            if worker not in self._clocks:
                raise InvalidRequest(f"{worker} is not one of the {self.config.total_num_replicas} replicas")
            now = self._time()
            if clock > self._clocks[worker]:
                self._clocks[worker], self._moved_at[worker] = clock, now
                self._cond.notify_all()
            waited = False
            while clock - self.min_clock() > self.config.staleness:
                waited = True
                slow = min(self._live().items(), key=lambda kv: kv[1])[0]
                remaining = self._moved_at[slow] + self.config.timeout - self._time()
                if remaining <= 0:
                    self._declare_lost(slow)
                    continue
                self._cond.wait(timeout=remaining)
            self.waits += int(waited)
            return self.min_clock()

    def leave(self, worker: str) -> None:
        with self._cond:
            self._gone.add(worker)
            self._cond.notify_all()

    def _declare_lost(self, worker: str) -> None:
        if self.config.on_timeout == "fail":
            raise PreconditionFailed(
                f"{self.task_name}: {worker} made no progress for {self.config.timeout:.1f} s (clock {self._clocks[worker]})"
            )
        log.warning("%s: %s made no progress for %.1f s; no longer waiting for it", self.task_name, worker,
                    self.config.timeout)
        self._gone.add(worker)
        self.lost.append(worker)
        self._cond.notify_all()

    def stats(self) -> dict[str, Any]:
        with self._cond:
            return {"ssp_clocks": dict(self._clocks), "ssp_lost": list(self.lost), "ssp_waits": self.waits}
