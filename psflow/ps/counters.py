"""The counters of one ps task, for progress lines, status pages and profiles (``Stats``).

Pulls and pushes served, rows and bytes, the time spent gathering rows and
applying async pushes, the pushes' losses (a moving average and the newest),
and, on the task holding global_step, each push's staleness (global_step at
apply - the step the worker read).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

__all__ = ["ServiceCounters"]

#: Weight of the newest loss in the moving average.
_LOSS_EMA = 0.05


class ServiceCounters:
    """Counters of one ps task. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, float] = {
            "pulls": 0, "pushes": 0, "rows_pulled": 0, "rows_pushed": 0,
            # loss_ema: the pushes' losses, moving average; last_loss: the newest push's (the last step's)
            "loss_ema": float("nan"), "last_loss": float("nan"), "bytes_in": 0, "bytes_out": 0,
            # time this task spent gathering pulled rows and applying async pushes (profile_wd_step.py)
            "read_seconds": 0.0, "apply_seconds": 0.0,
        }
        self._staleness: dict[int, int] = {}

    def pulled(self, rows: int, nbytes: int, seconds: float) -> None:
        """A pull read ``rows`` rows (``nbytes`` bytes) in ``seconds``."""
        with self._lock:
            c = self._counts
            c["read_seconds"] += seconds
            c["pulls"] += 1
            c["rows_pulled"] += rows
            c["bytes_out"] += nbytes

    def pushed(self, rows: int, nbytes: int, loss: float | None, seconds: float = 0.0) -> None:
        """A push of ``rows`` sparse rows (``nbytes`` bytes) was applied in ``seconds``; its batch's ``loss``."""
        with self._lock:
            c = self._counts
            c["pushes"] += 1
            c["apply_seconds"] += seconds
            c["rows_pushed"] += rows
            c["bytes_in"] += nbytes
            if loss is not None and np.isfinite(loss):
                prev = c["loss_ema"]
                c["loss_ema"] = float(loss) if np.isnan(prev) else (1 - _LOSS_EMA) * prev + _LOSS_EMA * float(loss)
                c["last_loss"] = float(loss)

    def stale_by(self, staleness: int) -> None:
        """A push was applied ``staleness`` steps after the step its worker read."""
        with self._lock:
            self._staleness[staleness] = self._staleness.get(staleness, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        """Every counter by name (losses None while there is none), and the staleness histogram."""
        with self._lock:
            out: dict[str, Any] = dict(self._counts)
            histogram = {str(k): v for k, v in sorted(self._staleness.items())}
        for key in ("loss_ema", "last_loss"):
            out[key] = None if np.isnan(out[key]) else out[key]
        out["staleness_histogram"] = histogram
        return out
