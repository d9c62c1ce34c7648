"""``psflow report`` on a run directory used by two runs (issue 25, item 6): only the latest run's events are
plotted, and a plot with too few points is named with the reason instead of silently dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from psflow.status.report import RUN_SUMMARIES, latest_summaries, render_report
from psflow.train.summary import SummaryWriter, read_scalars


def write_run(run_dir: Path, run_id: str, points: dict[str, list[tuple[int, float]]]) -> None:
    writer = SummaryWriter(str(run_dir / RUN_SUMMARIES / run_id))
    try:
        for tag, series in points.items():
            for step, value in series:
                writer.scalars({tag: value}, step)
    finally:
        writer.close()


def test_a_reused_run_directory_plots_the_latest_run_and_says_what_it_did_not_draw(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    # The first run: a long loss curve and an eval curve, over the same global steps as the second's.
    write_run(tmp_path, "20260101-100000-aaaaaaaa", {"train/loss": [(s, 0.9) for s in range(0, 200, 10)],
                                                      "eval/auc": [(100, 0.8), (200, 0.85)]})
    # The second: a short run, 3 loss points, one eval, no throughput (its first summary has no rate yet).
    write_run(tmp_path, "20260101-110000-bbbbbbbb", {"train/loss": [(0, 0.69), (10, 0.5), (20, 0.4)],
                                                      "eval/auc": [(20, 0.7)], "ps/0/pulls_per_sec": [(10, 5.0)]})
    summaries, earlier = latest_summaries(str(tmp_path))
    assert (Path(summaries).name, earlier) == ("20260101-110000-bbbbbbbb", 1)
    done = render_report(str(tmp_path))
    assert done["summaries"] == summaries and done["earlier_runs"] == 1
    assert set(done["plots"]) == {"loss"}
    assert done["skipped"] == {
        "eval_auc": "1 point of eval/auc (--eval with --eval-every-steps) (a plot needs at least 2)",
        "throughput": "no train/examples_per_sec summaries",
        "ps_rates": "1 point of ps/<i>/pulls_per_sec (a plot needs at least 2)",
    }
    # The loss plotted is the second run's alone, not the two runs' events merged into one curve.
    loss = read_scalars(summaries)["train/loss"]
    assert [s for s, _ in loss] == [0, 10, 20] and [v for _, v in loss] == pytest.approx([0.69, 0.5, 0.4])
    assert Path(done["plots"]["loss"]).read_bytes()[:4] == b"\x89PNG"


def test_a_directory_without_runs_is_read_whole(tmp_path: Path) -> None:
    assert latest_summaries(str(tmp_path)) == (str(tmp_path), 0)
    (tmp_path / RUN_SUMMARIES).mkdir()
    assert latest_summaries(str(tmp_path)) == (str(tmp_path), 0)
