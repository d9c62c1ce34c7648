"""``psflow report RUN_DIR``: PNG plots of a run, from its TensorBoard summaries.

Writes into ``RUN_DIR/report/`` (or ``--out``):

``loss.png``        train/loss and train/loss_ema over global steps
``eval_auc.png``    eval/auc over global steps
``throughput.png``  examples/s and global_step/s over global steps
``ps_rates.png``    each ps task's pulls/s and pushes/s, and bytes in/s

A plot whose series are all missing is skipped (named in the return value).
Uses matplotlib's non-interactive Agg backend; no display is needed. matplotlib
is the extra ``psflow[plots]``; without it :func:`render_report` raises
:class:`~psflow.extras.MissingExtraError` before reading anything.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from types import ModuleType

from psflow.extras import require
from psflow.train.summary import read_scalars

__all__ = ["ReportError", "render_report"]


class ReportError(Exception):
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


def render_report(run_dir: str, out_dir: str | None = None) -> dict[str, str]:
    """Renders the PNGs; returns plot name -> file (written plots only).

    Raises:
        MissingExtraError: matplotlib is not installed (``pip install 'psflow[plots]'``).
        ReportError: no scalar summaries under ``run_dir``.
    """
    _pyplot()  # fails before any work when the extra is missing
    scalars = read_scalars(run_dir)
    if not scalars:
        raise ReportError(f"{run_dir}: no TensorBoard summaries found (was the run started with summaries on?)")
    out = out_dir or os.path.join(run_dir, "report")
    os.makedirs(out, exist_ok=True)
    written: dict[str, str] = {}

    def pick(*tags: str) -> list[tuple[str, list[tuple[int, float]]]]:
        return [(t, scalars[t]) for t in tags if scalars.get(t)]

    loss = pick("train/loss", "train/loss_ema")
    if loss:
        written["loss"] = os.path.join(out, "loss.png")
        _plot(written["loss"], "training loss", loss, "log-loss")
    auc = pick("eval/auc")
    if auc:
        written["eval_auc"] = os.path.join(out, "eval_auc.png")
        _plot(written["eval_auc"], "eval AUC", auc, "AUC")
    rates = pick("train/examples_per_sec")
    if rates:
        written["throughput"] = os.path.join(out, "throughput.png")
        _plot(written["throughput"], "throughput", rates, "examples / s",
              right=pick("train/global_step_per_sec"), right_label="global steps / s")
    requests = sorted(t for t in scalars if t.startswith("ps/") and t.endswith(("pulls_per_sec", "pushes_per_sec")))
    if requests:
        written["ps_rates"] = os.path.join(out, "ps_rates.png")
        traffic = sorted(t for t in scalars if t.startswith("ps/") and t.endswith("bytes_in_per_sec"))
        _plot(written["ps_rates"], "ps tasks: requests and bytes in", pick(*requests), "requests / s",
              right=pick(*traffic), right_label="bytes in / s")
    return written
