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
