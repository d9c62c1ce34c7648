"""``psflow report RUN_DIR``: PNG plots of a run, from its TensorBoard summaries.

Which summaries: ``psflow train`` writes each run's into a fresh directory,
``RUN_DIR/summaries/<run id>/`` (run ids begin with the start time), so a run
directory used again holds one directory per run; the report plots the latest
run's alone, and says so. A directory without ``summaries/`` (a summary
directory itself, or a run directory of an older psflow) is read whole.

Writes into ``RUN_DIR/report/`` (or ``--out``):

``loss.png``        train/loss and train/loss_ema over global steps
``eval_auc.png``    eval/auc over global steps
``throughput.png``  examples/s and global_step/s over global steps
``ps_rates.png``    each ps task's pulls/s and pushes/s, and bytes in/s

A plot is drawn from at least 2 points (one point is no curve); a plot with
fewer is not drawn, and the result says which and why (``skipped``).
Uses matplotlib's non-interactive Agg backend; no display is needed. matplotlib
is the extra ``psflow[plots]``; without it :func:`render_report` raises
:class:`~psflow.extras.MissingExtraError` before reading anything.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from psflow.errors import PsflowError
from psflow.extras import require
from psflow.train.summary import read_scalars

__all__ = ["MIN_POINTS", "RUN_SUMMARIES", "ReportError", "latest_summaries", "render_report"]

#: Under a run directory: one directory of TensorBoard summaries per run, named by the run's id.
RUN_SUMMARIES = "summaries"
#: Points a plot needs: fewer is no curve.
MIN_POINTS = 2


class ReportError(PsflowError):
    """The run directory holds no summaries to plot."""


def _pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend.

    Raises:
        MissingExtraError: matplotlib is not installed (``psflow[plots]``).
    """
    matplotlib = require("matplotlib", "plots", "plots", plural=True)
    matplotlib.use("Agg")
    return require("matplotlib.pyplot", "plots", "plots", plural=True)


def _plot(path: str, title: str, series: Sequence[tuple[str, list[tuple[int, float]]]], ylabel: str,
          right: Sequence[tuple[str, list[tuple[int, float]]]] = (), right_label: str = "") -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for label, points in series:
        ax.plot([s for s, _ in points], [v for _, v in points], label=label, marker="." if len(points) < 30 else None)
    ax.set_xlabel("global step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if right:
        ax2 = ax.twinx()
        for label, points in right:
            ax2.plot([s for s, _ in points], [v for _, v in points], label=label, linestyle="--")
        ax2.set_ylabel(right_label)
        h2, l2 = ax2.get_legend_handles_labels()
        handles, labels = handles + h2, labels + l2
    ax.legend(handles, labels, loc="best", fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def latest_summaries(run_dir: str) -> tuple[str, int]:
    """The summary directory of the latest run in ``run_dir`` and how many earlier runs there are.

    ``run_dir/summaries/<run id>/`` (the newest id: ids begin with the start time), or ``run_dir``
    itself when it has no ``summaries/`` with a run in it.
    """
    root = os.path.join(run_dir, RUN_SUMMARIES)
    try:
        runs = sorted(e.name for e in os.scandir(root) if e.is_dir())
    except (FileNotFoundError, NotADirectoryError):
        runs = []
    if not runs:
        return run_dir, 0
    return os.path.join(root, runs[-1]), len(runs) - 1


def render_report(run_dir: str, out_dir: str | None = None) -> dict[str, Any]:
    """Renders the PNGs of the latest run in ``run_dir``; returns what was done.

    Returns:
        ``{"summaries": the directory read, "earlier_runs": N, "plots": {name: file} (written),
        "skipped": {name: why} (each plot not drawn: no points, or fewer than MIN_POINTS)}``.

    Raises:
        MissingExtraError: matplotlib is not installed (``pip install 'psflow[plots]'``).
        ReportError: no scalar summaries under the latest run's directory.
    """
    _pyplot()  # fails before any work when the extra is missing
    summaries, earlier = latest_summaries(run_dir)
    scalars = read_scalars(summaries)
    if not scalars:
        raise ReportError(f"{summaries}: no TensorBoard summaries found (was the run started with summaries on?)")
    out = out_dir or os.path.join(run_dir, "report")
    os.makedirs(out, exist_ok=True)
    written: dict[str, str] = {}
    skipped: dict[str, str] = {}

    def pick(*tags: str) -> list[tuple[str, list[tuple[int, float]]]]:
        return [(t, scalars[t]) for t in tags if scalars.get(t)]

    def drawable(name: str, series: list[tuple[str, list[tuple[int, float]]]], tags: str) -> bool:
        points = max((len(p) for _, p in series), default=0)
        if points >= MIN_POINTS:
            written[name] = os.path.join(out, f"{name}.png")
            return True
        skipped[name] = (f"no {tags} summaries" if not points else
                         f"{points} point of {tags} (a plot needs at least {MIN_POINTS})")
        return False

    loss = pick("train/loss", "train/loss_ema")
    if drawable("loss", loss, "train/loss"):
        _plot(written["loss"], "training loss", loss, "log-loss")
    auc = pick("eval/auc")
    if drawable("eval_auc", auc, "eval/auc (--eval with --eval-every-steps)"):
        _plot(written["eval_auc"], "eval AUC", auc, "AUC")
    rates = pick("train/examples_per_sec")
    if drawable("throughput", rates, "train/examples_per_sec"):
        _plot(written["throughput"], "throughput", rates, "examples / s",
              right=pick("train/global_step_per_sec"), right_label="global steps / s")
    requests = sorted(t for t in scalars if t.startswith("ps/") and t.endswith(("pulls_per_sec", "pushes_per_sec")))
    if drawable("ps_rates", pick(*requests), "ps/<i>/pulls_per_sec"):
        traffic = sorted(t for t in scalars if t.startswith("ps/") and t.endswith("bytes_in_per_sec"))
        _plot(written["ps_rates"], "ps tasks: requests and bytes in", pick(*requests), "requests / s",
              right=pick(*traffic), right_label="bytes in / s")
    return {"summaries": summaries, "earlier_runs": earlier, "plots": written, "skipped": skipped}
