"""When a fault injected by ``--chaos`` recovered: ``recovery_seconds`` and ``recovered_at_step`` in metrics.json.

A fault has recovered once its task's replacement runs and the cluster trains again: global_step, read
from the step task (ps task 0) while it is *ready* (serving at its generation), goes past the first value
read that way after the replacement started. Ordered, for one fault:

1. the fault fires (:meth:`RecoveryWatch.fired`); nothing counts until the task's replacement runs;
2. the first ready reading after that is the fault's baseline;
3. the first ready reading past the baseline is its recovery (that step, the seconds since the fault).

What does not count as training again:

* a restore's jump: a restarted ps task 0 answers 0 until the chief restores it, then (not yet ready) the
  restored value, past its journal's bound (up to 1,000 higher); a reading of a step task that is not
  ready is never a baseline, so the restored value is, and the first push after the restore recovers.
  (Counting the jump recovered a ps fault at the restore, before any step ran; the next chaos round then
  fired 40 steps after a recovery that had not happened yet.)

And what recovers without a step: a replacement with nothing left to train (a worker killed once its data
had ended, or in the run's last steps) moves no step; it has recovered when it ends its part cleanly
(exit 0), at the newest step read (its ``recovery_seconds`` then ends at the reading that saw the exit).
When the run ends, the launcher observes once more, with its final snapshot's reading, so a recovery in
the run's last moments is not missed between two polls of the chaos thread.

Not thread-safe: the caller serializes (the chaos thread and the run's end take the launcher's lock).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from psflow.launch.chaos import InjectedFault

__all__ = ["StepReading", "Replacement", "RecoveryWatch", "step_reading"]


@dataclass(frozen=True)
class StepReading:
    """global_step as the step task answered it, whether that task was ready (restored, serving), and
    how many workers it counted as finished with their data (``Leave``)."""

    step: int
    ready: bool
    finished: int = 0


class Replacement(Enum):
    """The state of a killed task's replacement process."""

    NONE = "none"          # not started yet (restart backoff), or it died too and its own is not started yet
    RUNNING = "running"
    FINISHED = "finished"  # exited 0: it did its part


def step_reading(stats: dict[str, Any]) -> StepReading | None:
    """The reading in one ps task's ``Stats`` meta; None if that task does not hold global_step."""
    step = stats.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int):
        return None
    finished = stats.get("finished")
    return StepReading(step, stats.get("ready") is True, len(finished) if isinstance(finished, list) else 0)


@dataclass
class _Watched:
    fault: InjectedFault
    fired: float             # time.monotonic() when it fired
    baseline: int | None = None


class RecoveryWatch:
    """The faults fired and not recovered yet; see the module docstring."""

    def __init__(self, replacement: Callable[[str, int], Replacement]) -> None:
        """``replacement(task, killed_pid)``: the state of the newest process of ``task`` other than the killed one."""
        self._replacement = replacement
        self._watched: list[_Watched] = []
        self._last_step: int | None = None

    def fired(self, fault: InjectedFault, now: float) -> None:
        """Starts watching ``fault``, fired at ``now`` (``time.monotonic()``)."""
        self._watched.append(_Watched(fault, now))

    def watching(self) -> int:
        """Faults fired and not recovered yet."""
        return len(self._watched)

    def observe(self, reading: StepReading | None, now: float) -> list[InjectedFault]:
        """One reading of the chaos thread (None: no ps task answered); returns the faults it recovered,
        each with ``recovered_at_step`` and ``recovery_seconds`` set."""
        if reading is not None:
            self._last_step = reading.step if self._last_step is None else max(self._last_step, reading.step)
        recovered = []
        for watched in list(self._watched):
            state = self._replacement(watched.fault.task, watched.fault.pid)
            if state is Replacement.FINISHED and self._last_step is not None:
                self._recover(watched, self._last_step, now)
            elif state is not Replacement.RUNNING or reading is None or not reading.ready:
                continue
            elif watched.baseline is None:
                watched.baseline = reading.step
                continue
            elif reading.step > watched.baseline:
                self._recover(watched, reading.step, now)
            else:
                continue
            recovered.append(watched.fault)
        return recovered

    def _recover(self, watched: _Watched, step: int, now: float) -> None:
        watched.fault.recovered_at_step = step
        watched.fault.recovery_seconds = round(now - watched.fired, 3)
        self._watched.remove(watched)
