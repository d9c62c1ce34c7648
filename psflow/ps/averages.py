"""Moving averages of variables on the ps tasks: TensorFlow's ``ExponentialMovingAverage``.

A variable declared with a moving-average decay ``D`` (``--moving-average-decay``,
or per variable through the model seam) has a *shadow* beside it on every ps
task holding one of its partitions. The shadow starts at the variable's initial
value. After each applied step -- the optimizer's update of that step, then
global_step's increment -- the ps task moves the shadow of every averaged
partition it holds, with TF's rule (``ExponentialMovingAverage(D,
num_updates=global_step).apply``), float32 throughout as TF computes it::

    decay = min(D, (1 + n) / (10 + n))        # n: global_step after the increment
    shadow -= (1 - decay) * (shadow - var)

Every row moves, looked up this step or not (a sparse step too: an untouched
row's shadow moves toward its unchanged value), as in TF. The cost is one pass
over every averaged variable per step -- TF's cost too (in chunks of 64K
elements, so no table-sized temporary is allocated): about 0.15 ms for a
65,536 x 8 float32 table and 7 ms for 2^20 x 8 (32 MiB) on a 2-core machine,
against ~0.05 ms for the sparse update of a 512-row batch. For a large
embedding table that is most of a ps task's work, so a model may leave a
table out (``VariableSpec(moving_average_decay=0.0)``); an exact lazy update
(moving a row only when it is read or written, in closed form as the catch-up
below does) would avoid it, at the price of a step per row.

Which step ``n`` a task uses:

* on the task holding global_step: the value its increment returned (async);
* in sync mode, on every task: its count of aggregated steps after the advance
  (each task applies every aggregated step, so the count is global_step);
* on another task in async mode: one past the newest step the clients reported
  (the step the schedules read, :mod:`psflow.ps.step_clock`). A task gets a push
  only in steps that have a gradient for one of its partitions; before it
  applies a push, and before its averages are read (a pull for evaluation, a
  checkpoint shard), the shadows catch up over the steps since their last
  move up to the newest reported step: none of those steps reached this task,
  so the variable did not change in them, and :func:`catch_up_factor` gives
  their closed form, ``shadow = var + (shadow - var) * prod(decay)``. With
  several workers pushing at once the reported step may lag by the pushes in
  flight, so there ``n`` is as exact as the schedules' step.

The shadow of a partition is saved in checkpoints as a slot named
:data:`AVERAGE_SLOT` (``"ExponentialMovingAverage"``, TF's name for the shadow
variable), so it is restored, re-sliced onto any number of ps tasks, with the
variable; it is not an optimizer slot (an optimizer change ignores it).

Thread safety: :meth:`MovingAverages.move` updates each partition's shadow under
that partition's lock; concurrent pushes may move the shadows in either order.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable

import numpy as np

from psflow.ps.store import PartitionState

__all__ = ["AVERAGE_SLOT", "MovingAverages", "catch_up_factor", "check_decay", "effective_decay", "move_toward"]

#: The slot name a partition's shadow has in checkpoints (``w/part_0:ExponentialMovingAverage``).
AVERAGE_SLOT = "ExponentialMovingAverage"

# Elements per chunk of a shadow update: a scratch buffer this size stays in cache (256 KiB) and no
# temporary as large as a table is allocated per step.
_CHUNK = 1 << 16


def check_decay(decay: object, what: str) -> float:
    """``decay`` as a float in (0, 1]; ValueError naming ``what`` otherwise."""
    if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not (0.0 < float(decay) <= 1.0):
        raise ValueError(f"{what}: a moving-average decay must be a number in (0, 1], got {decay!r}")
    return float(decay)


def effective_decay(decay: float, num_updates: int) -> np.float32:
    """TF's decay at global step ``num_updates`` (after the increment): ``min(D, (1 + n) / (10 + n))`` in float32."""
    n = np.float32(num_updates)
    return min(np.float32(decay), (np.float32(1.0) + n) / (np.float32(10.0) + n))


def move_toward(shadow: np.ndarray, value: np.ndarray, decay: np.float32) -> None:
    """``shadow -= (1 - decay) * (shadow - value)`` in place, in ``shadow``'s dtype (TF's order of operations).

    ``shadow`` and ``value`` are C-contiguous arrays of one shape; the caller holds the partition's lock.
    """
    k = (np.float32(1.0) - decay).astype(shadow.dtype)
    flat, source = shadow.reshape(-1), value.reshape(-1)
    if flat.size <= _CHUNK:
        step = flat - source
        step *= k
        flat -= step
        return
    scratch = np.empty(_CHUNK, dtype=shadow.dtype)
    for start in range(0, flat.size, _CHUNK):
        part = flat[start:start + _CHUNK]
        step = scratch[:part.size]
        np.subtract(part, source[start:start + _CHUNK], out=step)
        step *= k
        part -= step


def catch_up_factor(decay: float, first: int, last: int) -> float:
    """``prod(min(D, (1 + n) / (10 + n)) for n in first..last)`` (1.0 when ``last < first``), in float64.

    The steps where ``(1 + n) / (10 + n) < D`` telescope (a ratio of 9-term products, through ``lgamma``);
    the rest are ``D`` each.
    """
    if last < first:
        return 1.0
    # (1 + n) / (10 + n) < D  <=>  n < (10 D - 1) / (1 - D): the ratio rules below that step.
    bound = math.inf if decay >= 1.0 else (10.0 * decay - 1.0) / (1.0 - decay)
    ratio_last = min(last, math.ceil(bound) - 1) if bound != math.inf else last
    log = 0.0
    if ratio_last >= first:
        # prod_{n=a}^{c} (1 + n) / (10 + n) = [Gamma(c + 2) / Gamma(a + 1)] / [Gamma(c + 11) / Gamma(a + 10)]
        a, c = first, ratio_last
        log += math.lgamma(c + 2) - math.lgamma(a + 1) - math.lgamma(c + 11) + math.lgamma(a + 10)
    plain = last - max(first, ratio_last + 1) + 1
    if plain > 0:
        log += plain * math.log(decay)
    return math.exp(log)


class MovingAverages:
    """The step one ps task last moved its shadows at, and the moving itself.

    Args:
        task_name: this ps task (for errors and logs).
        catch_up: fill in steps the task got no push for (a task not holding
            global_step, in async mode; see the module docstring).
    """

    def __init__(self, task_name: str, *, catch_up: bool) -> None:
        self.task_name = task_name
        self._catch_up = catch_up
        self._lock = threading.Lock()
        self._last: int | None = None  # the newest step the shadows were moved at; None: unknown (fresh or restored)

    def move(self, partitions: Iterable[PartitionState], step: int) -> int:
        """After a step's update: moves the shadow of every averaged partition in ``partitions`` at global step
        ``step`` (after its increment); returns how many moved."""
        with self._lock:
            if self._last is None or step > self._last:
                self._last = step
        return self._each(partitions, lambda shadow, part, decay: move_toward(shadow, part.value,
                                                                             effective_decay(decay, step)))

    def catch_up(self, partitions: Iterable[PartitionState], step: int) -> int:
        """Before a push is applied here and before the averages are read: on a task that catches up, moves
        the shadows over the steps after their last move up to ``step`` (the newest reported step; none of
        those steps reached this task, so the variable did not change in them). Returns how many partitions
        moved; a no-op on other tasks, before the first move and after a restore of unknown step."""
        with self._lock:
            last = self._last
            if not self._catch_up or last is None or step <= last:
                return 0
            self._last = step

        def catch(shadow: np.ndarray, part: PartitionState, decay: float) -> None:
            shadow -= part.value
            shadow *= np.asarray(catch_up_factor(decay, last + 1, step), dtype=shadow.dtype)
            shadow += part.value

        return self._each(partitions, catch)

    @staticmethod
    def _each(partitions: Iterable[PartitionState],
              update: Callable[[np.ndarray, PartitionState, float], None]) -> int:
        """``update(shadow, partition, decay)`` on each averaged partition, under its lock; returns how many."""
        count = 0
        for part in partitions:
            decay, shadow = part.average_decay, part.average
            if decay is None or shadow is None:
                continue
            with part.lock:
                update(shadow, part, decay)
            count += 1
        return count

    def restored(self, step: int | None = None) -> None:
        """The shadows were loaded (a restore) at global step ``step`` (None: unknown; no catch-up before the
        next move)."""
        with self._lock:
            self._last = step

    @property
    def last_step(self) -> int | None:
        """The newest step the shadows were moved at (None: none since the start or the last restore)."""
        with self._lock:
            return self._last
