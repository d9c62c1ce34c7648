"""A training run's progress on the console: a bar on a terminal, plain lines otherwise.

The launcher feeds :class:`Progress` the cluster's counters every few seconds
(the ``Stats`` of the ps task holding global_step: ``global_step``,
``examples``, ``loss_ema``) and, at the end, the run's metrics:

1. ``Progress(out, total)``: ``total`` (:func:`progress_total`) is the run's
   end in global steps (``--max-steps``) or in examples (``--epochs`` x the
   training records, when the launcher counted them; see
   :func:`psflow.train.inputs.check_inputs`), or None (not known).
2. :meth:`Progress.update` for each reading. On a terminal (``out.isatty()``)
   a tqdm bar: count, rate and, with a total, percentage and ETA. Otherwise
   one line each::

       psflow: global_step 150 | 37,578 examples/s | loss 0.3272 | 10.2 s | 77% | ETA 3 s

   The rate is the interval's since the last reading; the ETA uses the
   average rate since training began (the last reading that saw nothing done).
   A reading across a restore has no rate: a restore sets the examples count
   (the model's history) back to its checkpoint's, and a restarted ps task 0
   holds 0 until it is restored, so the line says so instead
   (``restoring: examples set back from A to B``, or ``restored (generation
   G)`` when the ps tasks' restore generation changed), and the next rate is
   measured from the restored count. A rate is never negative.
3. :meth:`Progress.close` with the run's final snapshot (``metrics.json``,
   :mod:`psflow.status.final_snapshot`): the last line (:func:`final_line`)
   gives this run's examples and ``examples_per_sec`` (after a resume, not
   the earlier run's too), never the rate of an interval that may be empty,
   and the last step's loss, never a stale reading; with an eval, its
   log-loss and AUC, named so. With None (the run failed) the bar is ended
   and nothing more is printed. Idempotent.

Not thread-safe: one thread (the launcher's watch loop) calls it.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TextIO

__all__ = ["Progress", "ProgressTotal", "final_line", "progress_total"]


@dataclass(frozen=True)
class ProgressTotal:
    """Where a run ends: ``count`` global steps, or ``count`` examples (exactly-once, all epochs)."""

    count: int
    unit: Literal["steps", "examples"]


def progress_total(*, max_steps: int | None, epochs: int | None, records: int | None) -> ProgressTotal | None:
    """The run's end for the bar: ``max_steps`` global steps when set, else ``epochs`` x ``records``
    examples when both are known, else None."""
    if max_steps is not None and max_steps > 0:
        return ProgressTotal(max_steps, "steps")
    if records is not None and records > 0 and epochs is not None:
        return ProgressTotal(records * epochs, "examples")
    return None


class Progress:
    """Prints a run's progress to ``out``; see the module docstring.

    Args:
        out: the console stream (stderr).
        total: the run's end, or None.
        bar: a tqdm bar (True) or plain lines (False); default: a bar when ``out`` is a terminal.
        started: the run's start on ``clock`` (default: now), for elapsed times.
        clock: monotonic seconds.
    """

    def __init__(self, out: TextIO, total: ProgressTotal | None = None, *, bar: bool | None = None,
                 started: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.out = out
        self.total = total
        self._clock = clock
        self._started = clock() if started is None else started
        self._last = (self._started, 0)  # (time, examples) of the last reading: the interval's rate
        self._origin = (self._started, 0)  # (time, value) when training began: the ETA's rate
        self._last_value = 0
        self._loss: float | None = None
        self._step: int | None = None
        self._answered = False
        self._generation: int | None = None  # the ps tasks' restore generation at the last reading
        self._closed = False
        self._bar: Any = None
        if bar if bar is not None else _is_terminal(out):
            from tqdm import tqdm

            unit = total.unit if total is not None else "examples"
            self._bar = tqdm(total=total.count if total is not None else None, unit=" " + unit, unit_scale=True,
                             file=out, desc="psflow", dynamic_ncols=True, leave=True, mininterval=0.0,
                             smoothing=0.3)

    def update(self, stats: Mapping[str, Any]) -> None:
        """One reading of the cluster's counters (``global_step``, ``examples``, ``loss_ema``)."""
        if self._closed:
            return
        now = self._clock()
        step, examples = stats.get("global_step"), int(stats.get("examples") or 0)
        self._step = step if isinstance(step, int) else self._step
        loss = stats.get("loss_ema")
        if isinstance(loss, (int, float)) and math.isfinite(loss):
            self._loss = float(loss)
        restore = self._restore(examples, stats.get("generation"))
        self._answered = True
        value = self._value(examples)
        if value <= self._last_value:
            self._origin = (now, value)  # nothing done since the last reading (starting, restoring): not yet
        self._last_value = value
        rate = (examples - self._last[1]) / max(now - self._last[0], 1e-9)
        self._last = (now, examples)
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self._step_text()} | loss {self._loss_text()}", refresh=False)
            self._bar.update(self._bar_value(value) - self._bar.n)
            return
        if restore is not None:
            text = f"psflow: {self._step_text()} | {restore} (no rate for this interval)"
        elif examples:
            text = f"psflow: {self._step_text()} | {rate:,.0f} examples/s"
        else:
            text = f"psflow: {self._step_text()} | starting"
        text += f" | loss {self._loss_text()} | {now - self._started:.1f} s"
        if self.total is not None:
            text += f" | {min(100.0, 100.0 * value / self.total.count):.0f}%{self._eta(now, value, self.total)}"
        self.write(text)

    def _step_text(self) -> str:
        """``global_step S``; before the chief created it (the step task's Stats say None), that it has none."""
        return f"global_step {self._step}" if self._step is not None else "no global_step yet"

    def _restore(self, examples: int, generation: Any) -> str | None:
        """What a restore did between the last reading and this one (None: nothing): the examples count is the
        model's history, which a restore sets back to its checkpoint's (and a restarted ps task 0 holds 0 until
        it is restored), so no rate is measured across it; a changed ``generation`` (the ps tasks' restore
        count) marks a restore that did not lower the count."""
        previous, self._generation = self._generation, generation if isinstance(generation, int) else None
        if not self._answered:
            return None
        set_back = examples < self._last[1]
        counted = f"examples set back from {self._last[1]:,} to {examples:,}" if set_back else f"examples {examples:,}"
        if self._generation is not None and previous is not None and self._generation != previous:
            return f"restored (generation {self._generation}): {counted}"
        return f"restoring: {counted}" if set_back else None

    def unavailable(self, error: Exception) -> None:
        """A reading failed. Before the first answer the ps tasks are still starting: nothing is printed."""
        if self._answered and not self._closed:
            self.write(f"psflow: progress unavailable: {error}")

    def write(self, line: str) -> None:
        """Prints ``line`` above the bar (or as a plain line)."""
        if self._bar is not None:
            self._bar.write(line, file=self.out)
        else:
            print(line, file=self.out, flush=True)

    def close(self, metrics: Mapping[str, Any] | None) -> None:
        """Ends the bar; with ``metrics`` (a finished run's), prints the last line from them. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._bar is not None:
            if metrics is not None:
                step, loss = metrics.get("global_step"), _number(metrics.get("loss"))
                self._step = step if isinstance(step, int) else self._step
                self._loss = loss if loss is not None else self._loss
                self._bar.set_postfix_str(f"{self._step_text()} | loss {self._loss_text()}", refresh=False)
                self._bar.update(self._bar_value(self._value(int(metrics.get("examples") or 0))) - self._bar.n)
            self._bar.close()
        if metrics is not None:
            print(self.final_line(metrics), file=self.out, flush=True)

    def final_line(self, metrics: Mapping[str, Any]) -> str:
        """:func:`final_line`."""
        return final_line(metrics)

    def _value(self, examples: int) -> int:
        """The reading in the total's unit (examples without a total)."""
        if self.total is not None and self.total.unit == "steps":
            return self._step if self._step is not None else 0
        return examples

    def _bar_value(self, value: int) -> int:
        return min(value, self.total.count) if self.total is not None else value

    def _eta(self, now: float, value: int, total: ProgressTotal) -> str:
        done = value - self._origin[1]
        if done <= 0 or now <= self._origin[0] or value >= total.count:
            return ""
        seconds = (total.count - value) / (done / (now - self._origin[0]))
        return f" | ETA {_duration(seconds)}"

    def _loss_text(self) -> str:
        return f"{self._loss:.4f}" if self._loss is not None else "n/a"


def final_line(metrics: Mapping[str, Any]) -> str:
    """``psflow: done: global_step S | N examples in T s | R examples/s | last step's loss L | eval ...``
    from the run's final snapshot (:mod:`psflow.status.final_snapshot`), never from a reading; ``no global_step
    read`` in place of ``global_step S`` where the snapshot holds none (never ``global_step None``).

    N and R are this run's (``examples_this_run``); after a resume the line also says how many
    examples the model holds in all and how many came from the checkpoint it resumed.
    """
    examples = int(metrics.get("examples") or 0)
    this_run = metrics.get("examples_this_run")
    this_run = int(this_run) if isinstance(this_run, int) else examples
    wall = float(metrics.get("wall_seconds") or 0.0)
    rate = metrics.get("examples_per_sec")
    rate = float(rate) if isinstance(rate, (int, float)) else this_run / max(wall, 1e-9)
    step = metrics.get("global_step")  # None: the final snapshot read none (no ps task answered one)
    text = (f"psflow: done: {f'global_step {step}' if step is not None else 'no global_step read'} | "
            f"{this_run:,} examples in {wall:.1f} s")
    resumed = metrics.get("resumed_from")
    if isinstance(resumed, Mapping):
        text += (f" (this run; the model's {examples:,} include {int(resumed.get('examples') or 0):,} "
                 f"from {os.path.basename(str(resumed.get('path')))})")
    return f"{text} | {rate:,.0f} examples/s | {_final_loss(metrics)}{_final_eval(metrics)}"


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value) else None


def _final_loss(metrics: Mapping[str, Any]) -> str:
    """The last step's loss; the moving average, named so, where no step carried a loss."""
    last, average = _number(metrics.get("last_step_loss")), _number(metrics.get("loss"))
    if last is not None:
        return f"last step's loss {last:.4f}"
    return f"loss {average:.4f} (moving average)" if average is not None else "loss n/a"


def _final_eval(metrics: Mapping[str, Any]) -> str:
    """`` | eval logloss L, AUC A`` (the first two of logloss, AUC, accuracy the eval has), or nothing."""
    evaluation = metrics.get("eval")
    if not isinstance(evaluation, Mapping):
        return ""
    shown = [f"{label} {value:.4f}" for key, label in (("logloss", "logloss"), ("auc", "AUC"), ("accuracy", "accuracy"))
             if (value := _number(evaluation.get(key))) is not None][:2]
    return f" | eval {', '.join(shown)}" if shown else ""


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def _is_terminal(out: TextIO) -> bool:
    """A terminal with a width (a pseudo-terminal of 0 columns gets plain lines: a bar would not show)."""
    try:
        return out.isatty() and os.get_terminal_size(out.fileno()).columns > 0
    except (AttributeError, ValueError, OSError):  # a closed or minimal stream
        return False
