"""Evaluation metrics for binary classifiers: AUC, log-loss, accuracy (a model's default metrics).

All are exact (no binning): AUC is the rank statistic (Mann-Whitney U) with
tied scores given their average rank, so it equals the area under the ROC
curve with ties counted as one half.
"""

from __future__ import annotations

import numpy as np

__all__ = ["auc", "logloss", "accuracy", "binary_metrics"]

_EPS = 1e-15


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve; ``nan`` when only one class is present."""
    y = np.asarray(labels, dtype=np.float64) > 0.5
    s = np.asarray(scores, dtype=np.float64)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="stable")
    sorted_s = s[order]
    tied = sorted_s[1:] == sorted_s[:-1]
    if not tied.any():  # distinct scores (the common case): the ranks are the sorted positions
        rank_sum = float(np.flatnonzero(y[order]).sum() + n_pos)
    else:  # average ranks of tied groups (1-based ranks)
        starts = np.flatnonzero(np.r_[True, ~tied])
        ends = np.r_[starts[1:], sorted_s.size]
        avg = (starts + ends + 1) / 2.0
        ranks = np.empty(s.size, dtype=np.float64)
        ranks[order] = np.repeat(avg, ends - starts)
        rank_sum = float(ranks[y].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def logloss(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean binary cross-entropy, probabilities clipped to [1e-15, 1 - 1e-15]."""
    y = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probs, dtype=np.float64), _EPS, 1 - _EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def accuracy(labels: np.ndarray, probs: np.ndarray, threshold: float = 0.5) -> float:
    """Share of examples whose thresholded probability equals the label."""
    y = np.asarray(labels) > 0.5
    return float(np.mean((np.asarray(probs) > threshold) == y))


def binary_metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """``{"auc", "logloss", "accuracy", "examples"}`` for one set of predictions."""
    return {
        "auc": auc(labels, probs),
        "logloss": logloss(labels, probs),
        "accuracy": accuracy(labels, probs),
        "examples": int(np.asarray(labels).size),
    }
