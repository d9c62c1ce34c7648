"""Metrics against brute-force definitions."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from psflow.models.metrics import accuracy, auc, binary_metrics, logloss


def _auc_brute(y: np.ndarray, s: np.ndarray) -> float:
    pos, neg = s[y > 0.5], s[y <= 0.5]
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (pos.size * neg.size))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=2, max_size=40))
def test_auc_equals_pairwise_definition_with_ties(pairs: list[tuple[bool, int]]) -> None:
    y = np.array([float(a) for a, _ in pairs])
    s = np.array([float(b) for _, b in pairs])
    if y.min() == y.max():
        assert np.isnan(auc(y, s))
    else:
        assert abs(auc(y, s) - _auc_brute(y, s)) < 1e-12


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), min_size=2, max_size=300), st.integers(0, 2**32 - 1))
def test_auc_equals_pairwise_definition_with_distinct_scores(labels: list[bool], seed: int) -> None:
    # distinct scores take auc's path without tie handling
    y = np.array(labels, dtype=np.float32)
    s = np.random.default_rng(seed).permutation(y.size).astype(np.float32) / y.size
    if y.min() == y.max():
        assert np.isnan(auc(y, s))
    else:
        assert abs(auc(y, s) - _auc_brute(y, s)) < 1e-12


def test_perfect_and_inverted_ranking() -> None:
    y = np.array([0, 0, 1, 1])
    assert auc(y, np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert auc(y, np.array([0.9, 0.8, 0.2, 0.1])) == 0.0


def test_logloss_and_accuracy() -> None:
    y = np.array([1.0, 0.0])
    p = np.array([0.8, 0.4])
    assert abs(logloss(y, p) - (-(np.log(0.8) + np.log(0.6)) / 2)) < 1e-12
    assert accuracy(y, p) == 1.0
    assert np.isfinite(logloss(y, np.array([0.0, 1.0])))  # clipped, not inf
    assert binary_metrics(y, p)["examples"] == 2


# The metrics as first written (one numpy line per formula): every metric must give these bits, whatever
# shortcuts the module takes to compute them (a worker at --log-every 1 computes them every step).
def _auc_formula(labels: np.ndarray, scores: np.ndarray) -> float:
    y = np.asarray(labels, dtype=np.float64) > 0.5
    s = np.asarray(scores, dtype=np.float64)
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = np.argsort(s, kind="stable")
    sorted_s = s[order]
    starts = np.flatnonzero(np.r_[True, sorted_s[1:] != sorted_s[:-1]])
    ends = np.r_[starts[1:], sorted_s.size]
    ranks = np.empty(s.size, dtype=np.float64)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return (float(ranks[y].sum()) - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def _logloss_formula(labels: np.ndarray, probs: np.ndarray) -> float:
    y = np.asarray(labels, dtype=np.float64)
    p = np.clip(np.asarray(probs, dtype=np.float64), 1e-15, 1 - 1e-15)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def _accuracy_formula(labels: np.ndarray, probs: np.ndarray) -> float:
    return float(np.mean((np.asarray(probs) > 0.5) == (np.asarray(labels) > 0.5)))


def _same(a: float, b: float) -> bool:
    return (np.isnan(a) and np.isnan(b)) or a == b


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    """Batches as workers and eval meet them: float32 and float64 labels and predictions, soft labels, ties,
    one class only, predictions at 0 and 1 (clipped), a NaN prediction, one example."""
    rng = np.random.default_rng(29)
    out = []
    for n in (1, 2, 7, 512, 1024, 50_000):
        for dtype in (np.float32, np.float64):
            y = (rng.random(n) < 0.3).astype(dtype)
            p = rng.random(n).astype(dtype)
            out += [(y, p), (y, np.round(p, 1)), (np.zeros(n, dtype), p), (rng.random(n).astype(dtype), p)]
            q = p.copy()
            q[: max(1, n // 5)] = 0.0
            q[-max(1, n // 7):] = 1.0
            out.append((y, q))
    y = (rng.random(512) < 0.5).astype(np.float32)
    p = rng.random(512)
    p[17] = np.nan
    out.append((y, p))
    out.append((np.array([True, False, True]), np.array([0.2, 0.2, 0.9])))  # bool labels
    out.append((np.array(1.0), np.array(0.3)))  # 0-d arrays
    return out


def test_metrics_give_the_formulas_bits() -> None:
    for y, p in _batches():
        assert _same(auc(y, p), _auc_formula(y, p)), (y.dtype, p.dtype, y.size)
        assert _same(logloss(y, p), _logloss_formula(y, p)), (y.dtype, p.dtype, y.size)
        assert _same(accuracy(y, p), _accuracy_formula(y, p)), (y.dtype, p.dtype, y.size)
        m = binary_metrics(y, p)
        assert _same(m["auc"], _auc_formula(y, p)) and _same(m["logloss"], _logloss_formula(y, p))
        assert _same(m["accuracy"], _accuracy_formula(y, p)) and m["examples"] == y.size
