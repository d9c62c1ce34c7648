"""Progress: plain lines off a terminal, a tqdm bar on one, and a last line with the run's own examples/s."""

from __future__ import annotations

import io

from psflow.launch.progress import Progress, ProgressTotal, progress_total


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
    progress.close({"global_step": 192, "examples": 97_683, "wall_seconds": 12.5, "examples_per_sec": 97_683 / 12.5})
    progress.close({"global_step": 192})  # idempotent
    progress.update({"global_step": 193, "examples": 1})  # ignored once closed
    assert lines(out)[-1] == "psflow: done: global_step 192 | 97,683 examples in 12.5 s | 7,815 examples/s | loss 0.3254"
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
    progress.close({"global_step": 10, "examples": 1_000, "wall_seconds": 4.0, "examples_per_sec": 250.0})
    text = out.getvalue()
    assert "100%" in text and "1.00k/1.00k" in text and "examples/s" in text, text
    assert text.splitlines()[-1] == "psflow: done: global_step 10 | 1,000 examples in 4.0 s | 250 examples/s | loss 0.5000"


def test_a_stream_that_is_not_a_terminal_gets_plain_lines() -> None:
    out = io.StringIO()
    progress = Progress(out, ProgressTotal(10, "steps"))
    progress.update({"global_step": 1, "examples": 10})
    assert lines(out)[0].startswith("psflow: global_step 1 |")
