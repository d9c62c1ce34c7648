"""The logistic model's id handling and gradients."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from psflow.data import SparseBatch
from psflow.models.logistic import LogisticRegression, fold_ids


def batch_of(ids: list[int]) -> SparseBatch:
    n = len(ids)
    return SparseBatch(labels=np.zeros(1, np.float32), indptr=np.array([0, n], np.int64),
                       ids=np.array(ids, np.int64), values=np.ones(n, np.float32))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=60), st.sampled_from([7, 1000, 1 << 27]))
def test_unique_ids_equals_numpy_unique(ids: list[int], num_features: int) -> None:
    model = LogisticRegression(num_features)
    for _ in range(2):  # the lookup table is reused between calls
        uniq, inverse = model.unique_ids(batch_of(ids))
        want_uniq, want_inverse = np.unique(fold_ids(np.array(ids), num_features), return_inverse=True)
        np.testing.assert_array_equal(uniq, want_uniq)
        np.testing.assert_array_equal(inverse, want_inverse.reshape(-1))
        assert uniq.min() >= 0 and uniq.max() < num_features


def test_gradient_matches_finite_differences() -> None:
    rng = np.random.default_rng(0)
    model = LogisticRegression(10)
    batch = SparseBatch(labels=np.array([1, 0, 1], np.float32), indptr=np.array([0, 2, 3, 5], np.int64),
                        ids=np.array([1, 4, 4, 0, 9], np.int64), values=rng.normal(size=5).astype(np.float32))
    uniq, inverse = model.unique_ids(batch)
    w = rng.normal(size=(uniq.size, 1)).astype(np.float64)
    b = np.array([0.3])
    grads, loss, _ = model.compute(batch, {"weights": w, "bias": b}, uniq, inverse)
    eps = 1e-6
    for k in range(uniq.size):
        w2 = w.copy()
        w2[k] += eps
        _, loss2, _ = model.compute(batch, {"weights": w2, "bias": b}, uniq, inverse)
        assert abs((loss2 - loss) / eps - grads["weights"].values[k, 0]) < 1e-4  # type: ignore[union-attr]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=12), st.integers(0, 2**31))
def test_logits_are_per_row_sums_with_and_without_empty_rows(counts: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    nnz = int(indptr[-1])
    batch = SparseBatch(labels=np.zeros(len(counts), np.float32), indptr=indptr,
                        ids=rng.integers(0, 50, nnz).astype(np.int64), values=rng.normal(size=nnz).astype(np.float32))
    weights = rng.normal(size=50)
    got = LogisticRegression(50).logits(batch, weights, 0.25, batch.ids)
    want = [0.25 + sum(float(batch.values[j]) * weights[batch.ids[j]] for j in range(indptr[i], indptr[i + 1]))
            for i in range(len(counts))]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_prepare_stores_the_unique_ids_that_the_step_then_uses() -> None:
    batch = batch_of([5, 3, 5, 99])
    model = LogisticRegression(10)
    prepared = model.prepare(batch)
    uniq, inverse = model.unique_ids(batch)
    got_uniq, got_inverse = model._unique(prepared)
    assert got_uniq is prepared.extras["logistic.unique_ids.10"]  # taken as they are, not recomputed
    np.testing.assert_array_equal(got_uniq, uniq)
    np.testing.assert_array_equal(got_inverse, inverse)
    # A model with another id space folds differently: it recomputes instead of trusting them.
    other = LogisticRegression(1000)
    np.testing.assert_array_equal(other._unique(prepared)[0], other.unique_ids(batch)[0])
    assert "logistic.unique_ids.1000" not in prepared.extras
