"""EmbeddingLookup: TF's safe_embedding_lookup_sparse semantics, forward and backward."""

from __future__ import annotations

import numpy as np
import pytest

from psflow.models import EmbeddingLookup, ModelError, unique_ids


def naive(indptr: np.ndarray, ids: np.ndarray, weights: np.ndarray | None, table: np.ndarray, combiner: str) -> np.ndarray:
    """One example at a time, straight from TF's documentation."""
    out = np.zeros((len(indptr) - 1, table.shape[1]))
    for e in range(len(indptr) - 1):
        i = ids[indptr[e]:indptr[e + 1]]
        w = np.ones(i.size) if weights is None else weights[indptr[e]:indptr[e + 1]].astype(np.float64)
        keep = w > 0
        i, w = i[keep], w[keep]
        if not i.size:
            continue
        total = (w[:, None] * table[i]).sum(0)
        out[e] = {"sum": total, "mean": total / w.sum(), "sqrtn": total / np.sqrt((w * w).sum())}[combiner]
    return out


def random_feature(rng: np.random.Generator, n: int, vocab: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    counts = rng.integers(0, 4, n)
    counts[0] = 0  # an example without ids
    indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    ids = rng.integers(0, vocab, indptr[-1]).astype(np.int64)
    weights = rng.uniform(0.5, 2.0, indptr[-1]).astype(np.float32)
    return indptr, ids, weights


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
@pytest.mark.parametrize("weighted", [False, True])
def test_forward_matches_the_definition(combiner: str, weighted: bool) -> None:
    rng = np.random.default_rng(1)
    indptr, ids, weights = random_feature(rng, 30, 9)
    table = rng.normal(size=(9, 4))
    lookup = EmbeddingLookup.build(indptr, ids, weights if weighted else None, table="emb", vocabulary=9, combiner=combiner)
    assert list(lookup.ids) == sorted(set(ids.tolist()))  # each row pulled once
    got = lookup.forward(table[lookup.ids])
    np.testing.assert_allclose(got, naive(indptr, ids, weights if weighted else None, table, combiner), rtol=1e-12)
    assert not got[0].any()  # no ids: a zero vector


def test_non_positive_weights_are_pruned_as_tf_does() -> None:
    indptr = np.array([0, 3], np.int64)
    ids = np.array([0, 1, 2], np.int64)
    weights = np.array([1.0, -1.0, 0.0], np.float32)
    lookup = EmbeddingLookup.build(indptr, ids, weights, table="emb", vocabulary=3, combiner="mean")
    assert list(lookup.ids) == [0]
    np.testing.assert_allclose(lookup.forward(np.eye(3)[[0]]), [[1.0, 0, 0]])


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_backward_is_the_gradient_of_forward(combiner: str) -> None:
    rng = np.random.default_rng(2)
    indptr, ids, weights = random_feature(rng, 12, 6)
    table = rng.normal(size=(6, 3))
    upstream = rng.normal(size=(12, 3))
    lookup = EmbeddingLookup.build(indptr, ids, weights, table="emb", vocabulary=6, combiner=combiner)
    rows = table[lookup.ids].copy()
    grad = lookup.backward(upstream)
    eps = 1e-6
    for r in range(rows.shape[0]):
        for c in range(rows.shape[1]):
            plus, minus = rows.copy(), rows.copy()
            plus[r, c] += eps
            minus[r, c] -= eps
            numeric = ((lookup.forward(plus) - lookup.forward(minus)) * upstream).sum() / (2 * eps)
            assert grad[r, c] == pytest.approx(numeric, rel=1e-6, abs=1e-9)


def test_an_id_outside_the_vocabulary_names_feature_table_and_id() -> None:
    indptr = np.array([0, 1, 2], np.int64)
    with pytest.raises(ModelError, match=r"feature 'C1': id 7 \(example 1 of the batch\) is outside the vocabulary of "
                                         r"table 'deep/emb_C1' \(7 rows\)"):
        EmbeddingLookup.build(indptr, np.array([3, 7], np.int64), None, table="deep/emb_C1", vocabulary=7, feature="C1")
    with pytest.raises(ModelError, match="combiner"):
        EmbeddingLookup.build(indptr, np.array([3, 4], np.int64), None, table="t", vocabulary=7, combiner="max")


def test_unique_ids_inverts() -> None:
    ids = np.array([5, 3, 5, 9, 3], np.int64)
    uniq, inverse = unique_ids(ids)
    assert list(uniq) == [3, 5, 9]
    assert list(uniq[inverse]) == list(ids)
