"""Progress: plain lines off a terminal, a tqdm bar on one, and a last line with the run's own examples/s."""

from __future__ import annotations

import io
import re

from psflow.status.progress import Progress, ProgressTotal, progress_total


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lines(out: io.StringIO) -> list[str]:
    return out.getvalue().splitlines()


def test_the_total_is_max_steps_else_epochs_times_records_else_unknown() -> None:
    assert progress_total(max_steps=50, epochs=3, records=1000) == ProgressTotal(50, "steps")
    assert progress_total(max_steps=None, epochs=3, records=1000) == ProgressTotal(3000, "examples")
    assert progress_total(max_steps=None, epochs=3, records=None) is None
    assert progress_total(max_steps=None, epochs=None, records=1000) is None


def test_plain_lines_give_the_interval_rate_percent_and_eta() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, ProgressTotal(10_000, "examples"), bar=False, clock=clock)
    clock.now += 2
    progress.update({"global_step": 0, "examples": 0, "loss_ema": None})
    clock.now += 2
    progress.update({"global_step": 10, "examples": 2_000, "loss_ema": 0.5})
    clock.now += 2
    progress.update({"global_step": 20, "examples": 4_000, "loss_ema": 0.25})
    assert lines(out) == [
        "psflow: global_step 0 | starting | loss n/a | 2.0 s | 0%",
        "psflow: global_step 10 | 1,000 examples/s | loss 0.5000 | 4.0 s | 20% | ETA 8 s",
        "psflow: global_step 20 | 1,000 examples/s | loss 0.2500 | 6.0 s | 40% | ETA 6 s",
    ]


def test_steps_are_the_unit_with_max_steps_and_no_total_means_no_percent() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, ProgressTotal(40, "steps"), bar=False, clock=clock)
    clock.now += 1
    progress.update({"global_step": 10, "examples": 500})
    assert lines(out)[-1].endswith("| 25% | ETA 3 s")
    progress = Progress(out, None, bar=False, clock=clock)
    clock.now += 1
    progress.update({"global_step": 10, "examples": 500})
    assert "%" not in lines(out)[-1] and "ETA" not in lines(out)[-1]


def test_the_last_line_is_the_runs_examples_per_sec_never_an_empty_interval() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, None, bar=False, clock=clock)
    clock.now += 2
    progress.update({"global_step": 192, "examples": 97_683, "loss_ema": 0.3254})
    progress.close({"global_step": 192, "examples": 97_683, "wall_seconds": 12.5, "examples_per_sec": 97_683 / 12.5,
                    "loss": 0.3254})
    progress.close({"global_step": 192})  # idempotent
    progress.update({"global_step": 193, "examples": 1})  # ignored once closed
    assert lines(out)[-1] == ("psflow: done: global_step 192 | 97,683 examples in 12.5 s | 7,815 examples/s "
                              "| loss 0.3254 (moving average)")
    assert len(lines(out)) == 2


def test_a_failed_run_ends_without_a_last_line() -> None:
    out = io.StringIO()
    progress = Progress(out, None, bar=False)
    progress.close(None)
    assert out.getvalue() == ""


def test_unavailable_is_silent_until_the_cluster_first_answered() -> None:
    out = io.StringIO()
    progress = Progress(out, None, bar=False)
    progress.unavailable(RuntimeError("connection refused"))  # the ps tasks are still starting
    assert out.getvalue() == ""
    progress.update({"global_step": 1, "examples": 10})
    progress.unavailable(RuntimeError("connection refused"))
    assert lines(out)[-1] == "psflow: progress unavailable: connection refused"


def test_the_bar_shows_count_total_and_rate_then_the_last_line() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, ProgressTotal(1_000, "examples"), bar=True, clock=clock)
    progress.update({"global_step": 5, "examples": 500, "loss_ema": 0.5})
    progress.close({"global_step": 10, "examples": 1_000, "wall_seconds": 4.0, "examples_per_sec": 250.0,
                    "last_step_loss": 0.5})
    text = out.getvalue()
    assert "100%" in text and "1.00k/1.00k" in text and "examples/s" in text, text
    assert text.splitlines()[-1] == (
        "psflow: done: global_step 10 | 1,000 examples in 4.0 s | 250 examples/s | last step's loss 0.5000")


def test_a_stream_that_is_not_a_terminal_gets_plain_lines() -> None:
    out = io.StringIO()
    progress = Progress(out, ProgressTotal(10, "steps"))
    progress.update({"global_step": 1, "examples": 10})
    assert lines(out)[0].startswith("psflow: global_step 1 |")


# ---- issue 25, item 6: numbers a user reads ---------------------------------------------------------------------
def test_a_restore_that_sets_the_examples_back_never_prints_a_negative_rate() -> None:
    """The issue's repro: a progress line of ``-3,178 examples/s`` right after a ps restore. The examples count is
    set back to the checkpoint's by a restore (and to 0 while a restarted ps task 0 waits for it), so the reading
    across it has no rate; the line says so, and the next interval's rate is measured from the restored count."""
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, None, bar=False, clock=clock)
    for step, examples, generation in ((100, 20_000, 0), (200, 40_000, 0), (0, 0, 0), (150, 33_644, 1),
                                       (250, 53_644, 1), (180, 30_000, 2)):
        clock.now += 2
        progress.update({"global_step": step, "examples": examples, "loss_ema": 0.4, "generation": generation})
    shown = lines(out)
    rates = [int(r.replace(",", "")) for line in shown for r in re.findall(r"\| (-?[\d,]+) examples/s", line)]
    assert rates == [10_000, 10_000, 10_000], shown
    restored = [line for line in shown if "no rate for this interval" in line]
    assert restored == [
        "psflow: global_step 0 | restoring: examples set back from 40,000 to 0 (no rate for this interval) "
        "| loss 0.4000 | 6.0 s",
        "psflow: global_step 150 | restored (generation 1): examples 33,644 (no rate for this interval) "
        "| loss 0.4000 | 8.0 s",
        "psflow: global_step 180 | restored (generation 2): examples set back from 53,644 to 30,000 "
        "(no rate for this interval) | loss 0.4000 | 12.0 s",
    ], shown


def test_the_last_line_gives_this_runs_examples_and_rate_and_the_last_steps_loss() -> None:
    """After a resume the model's history (``examples``) includes the earlier run's work: the last line's count and
    rate are this run's (``examples_this_run``), and its loss is the final snapshot's, never a stale reading
    (or ``n/a`` on a run that ended before the first reading had a loss)."""
    out = io.StringIO()
    progress = Progress(out, None, bar=False)
    progress.close({"global_step": 900, "examples": 100_000, "examples_at_start": 60_000, "examples_this_run": 40_000,
                    "wall_seconds": 10.0, "examples_per_sec": 4_000.0, "loss": 0.35, "last_step_loss": 0.3312,
                    "resumed_from": {"path": "/c/ckpt-000000600", "global_step": 600, "examples": 60_000},
                    "eval": {"auc": 0.9, "logloss": 0.3290, "accuracy": 0.85, "examples": 16_281}})
    assert lines(out) == [
        "psflow: done: global_step 900 | 40,000 examples in 10.0 s (this run; the model's 100,000 include 60,000 "
        "from ckpt-000000600) | 4,000 examples/s | last step's loss 0.3312 | eval logloss 0.3290, AUC 0.9000"]
    out = io.StringIO()
    progress = Progress(out, None, bar=False)
    progress.close({"global_step": 192, "examples": 97_683, "examples_this_run": 97_683, "wall_seconds": 3.1,
                    "examples_per_sec": 31_511.0, "loss": 0.3260, "last_step_loss": 0.3101})
    assert lines(out) == ["psflow: done: global_step 192 | 97,683 examples in 3.1 s | 31,511 examples/s "
                          "| last step's loss 0.3101"]


def test_a_reading_before_global_step_exists_says_so_never_none() -> None:
    """Before the chief created the variables the step task holds no global_step (its Stats say None): the
    line said ``global_step None | starting``."""
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, None, bar=False, clock=clock)
    clock.now += 1
    progress.update({"global_step": None, "examples": 0})
    clock.now += 1
    progress.update({"global_step": 0, "examples": 0})
    assert lines(out) == ["psflow: no global_step yet | starting | loss n/a | 1.0 s",
                          "psflow: global_step 0 | starting | loss n/a | 2.0 s"]


def test_the_done_line_of_a_run_with_no_global_step_read_says_so_never_none() -> None:
    from psflow.status.progress import final_line

    line = final_line({"global_step": None, "examples": 0, "wall_seconds": 2.0})
    assert line.startswith("psflow: done: no global_step read | 0 examples in 2.0 s"), line
    assert "None" not in line
    assert final_line({"global_step": 7, "examples": 0, "wall_seconds": 2.0}).startswith("psflow: done: global_step 7 |")
