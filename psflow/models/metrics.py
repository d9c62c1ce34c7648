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
    return _auc(np.asarray(labels) > 0.5, np.asarray(scores, dtype=np.float64))


def logloss(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean binary cross-entropy, probabilities clipped to [1e-15, 1 - 1e-15]."""
    return _logloss(np.asarray(labels, dtype=np.float64), np.asarray(probs, dtype=np.float64))


def accuracy(labels: np.ndarray, probs: np.ndarray, threshold: float = 0.5) -> float:
    """Share of examples whose thresholded probability equals the label."""
    return _accuracy(np.asarray(labels) > 0.5, np.asarray(probs), threshold)


def binary_metrics(labels: np.ndarray, probs: np.ndarray) -> dict[str, float]:
    """``{"auc", "logloss", "accuracy", "examples"}`` for one set of predictions.

    The same values, bit for bit, as :func:`auc`, :func:`logloss` and :func:`accuracy` called one by one; the
    labels' comparison and the probabilities' conversion are done once (a worker logging every step computes
    these for every batch).
    """
    y = np.asarray(labels)
    p = np.asarray(probs, dtype=np.float64)
    positive = y > 0.5
    return {
        "auc": _auc(positive, p),
        "logloss": _logloss(np.asarray(y, dtype=np.float64), p),
        "accuracy": _accuracy(positive, np.asarray(probs), 0.5),
        "examples": int(y.size),
    }


# The private forms take converted arrays. Each gives the bits of the one-line formula in its docstring: the
# changes are only in how numpy is called (a comparison in the labels' own dtype is exact against 0.5; a count
# of booleans is an exact integer, so count / n is the mean of the 0/1 values; x * y + u * v is the same sum in
# either order of its terms; np.mean is np.add.reduce divided by the count).
def _auc(positive: np.ndarray, s: np.ndarray) -> float:
    """AUC of ``s`` (float64) against ``positive`` (bool), tied scores at their average rank."""
    n_pos = int(np.count_nonzero(positive))
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="stable")
    sorted_s = s[order]
    tied = sorted_s[1:] == sorted_s[:-1]
    if not np.count_nonzero(tied):  # distinct scores (the common case): the ranks are the sorted positions
        rank_sum = float(np.add.reduce(np.nonzero(positive[order])[0]) + n_pos)
    else:  # average ranks of tied groups (1-based ranks)
        starts = np.flatnonzero(np.r_[True, ~tied])
        ends = np.r_[starts[1:], sorted_s.size]
        avg = (starts + ends + 1) / 2.0
        ranks = np.empty(s.size, dtype=np.float64)
        ranks[order] = np.repeat(avg, ends - starts)
        rank_sum = float(ranks[positive].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def _logloss(y: np.ndarray, p: np.ndarray) -> float:
    """``-mean(y * log(p) + (1 - y) * log1p(-p))``, ``p`` clipped; ``y`` and ``p`` float64."""
    # np.clip's values, NaN kept, in this function's own array: an array even for a 0-d p, where a ufunc would
    # return a scalar that the in-place log1p below cannot write into
    p = np.maximum(p, _EPS, out=np.empty(np.shape(p)))
    np.minimum(p, 1 - _EPS, out=p)
    total = np.log(p)
    total *= y
    rest = np.log1p(np.negative(p, out=p), out=p)
    rest *= 1 - y
    total += rest
    if total.size == 0:
        return float(-np.mean(total))  # nan, with numpy's warning, as the mean of nothing
    return -(float(np.add.reduce(total)) / int(total.size))  # np.mean's sum and division


def _accuracy(positive: np.ndarray, probs: np.ndarray, threshold: float) -> float:
    """``mean((probs > threshold) == positive)``."""
    if positive.size == 0:
        return float(np.mean(np.zeros(0)))  # nan, with numpy's warning, as the mean of nothing
    return int(np.count_nonzero((probs > threshold) == positive)) / positive.size
