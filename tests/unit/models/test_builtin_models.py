"""The built-in models on the seam: gradients checked by finite differences, lookups, hashing of features."""

from __future__ import annotations

import numpy as np
import pytest

from psflow.data import Batch, BatchSpec, SparseColumn
from psflow.gradients import DenseGradient, SparseGradient
from psflow.models import Model, ModelConfig, ModelError, create_model
from psflow.models.features import fold_ids, shared_rows
from psflow.models.losses import sigmoid_cross_entropy


def multi_feature_batch(rng: np.random.Generator, n: int = 7) -> Batch:
    sparse = {}
    for name in ("C1", "C2"):
        counts = rng.integers(0, 3, n)
        indptr = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        sparse[name] = SparseColumn(indptr, rng.integers(0, 50, indptr[-1]).astype(np.int64),
                                    rng.uniform(0.5, 1.5, indptr[-1]).astype(np.float32))
    dense = {"I1": rng.normal(size=n).astype(np.float32), "I2": rng.normal(size=(n, 2)).astype(np.float32)}
    return Batch(rng.integers(0, 2, n).astype(np.float32), sparse, dense)


def random_values(model: Model, batch: Batch, rng: np.random.Generator) -> dict[str, np.ndarray]:
    shapes = {s.name: s.shape for s in model.variables()}
    values = {}
    for name, ids in model.lookups(batch).items():
        shape = shapes[name] if ids is None else (len(ids), *shapes[name][1:])
        values[name] = (rng.normal(size=shape) * 0.3).astype(np.float32)
    return values


def check_gradients(model: Model, batch: Batch, values: dict[str, np.ndarray]) -> None:
    """Every gradient entry equals the central difference of the loss (in float64)."""
    batch = model.prepare(batch)
    values64 = {k: v.astype(np.float64) for k, v in values.items()}
    out = model.compute(batch, values64)
    lookups = model.lookups(batch)
    eps = 1e-6
    for name, grad in out.gradients.items():
        if isinstance(grad, SparseGradient):
            assert list(grad.rows) == list(lookups[name])  # unique rows, as pulled
        else:
            assert isinstance(grad, DenseGradient)
        flat = values64[name].reshape(-1)
        for k in range(flat.size):
            old = flat[k]
            flat[k] = old + eps
            up = model.compute(batch, values64).loss
            flat[k] = old - eps
            down = model.compute(batch, values64).loss
            flat[k] = old
            assert grad.values.reshape(-1)[k] == pytest.approx((up - down) / (2 * eps), rel=2e-4, abs=1e-7), (name, k)


@pytest.mark.parametrize("name", ["logistic", "fm"])
def test_gradients_on_sparse_and_dense_features(name: str) -> None:
    rng = np.random.default_rng(3)
    spec = BatchSpec({"C1": 64, "C2": 64}, {"I1": 1, "I2": 2})
    model = create_model(name, ModelConfig(spec, num_features=97, embedding_dim=3))
    batch = multi_feature_batch(rng)
    check_gradients(model, batch, random_values(model, batch, rng))


@pytest.mark.parametrize("name", ["logistic", "fm"])
def test_gradients_on_one_sparse_feature(name: str) -> None:
    rng = np.random.default_rng(4)
    model = create_model(name, ModelConfig(num_features=40, embedding_dim=2))
    batch = Batch.from_csr(np.array([1, 0, 1], np.float32), [0, 2, 2, 5], [3, 7, 3, 100, 7], [1, 2, 1, 1, 0.5])
    check_gradients(model, batch, random_values(model, batch, rng))


def test_logistic_single_feature_is_todays_model() -> None:
    """One sparse feature: logit = sum value * weights[fold(id)] + bias, variables weights then bias."""
    model = create_model("logistic", ModelConfig(num_features=10, partitions=2))
    assert [(s.name, s.shape) for s in model.variables()] == [("weights", (10, 1)), ("bias", (1,))]
    batch = Batch.from_csr(np.array([1, 0], np.float32), [0, 2, 3], [3, 12, 3], [2.0, 1.0, 1.0])
    lookups = model.lookups(model.prepare(batch))
    folded = fold_ids(np.array([3, 12, 3]), 10)
    assert list(lookups["weights"]) == sorted(set(folded.tolist())) and lookups["bias"] is None
    w = np.arange(10, dtype=np.float32)[:, None] / 10
    values = {"weights": w[lookups["weights"]], "bias": np.array([0.25], np.float32)}
    out = model.compute(model.prepare(batch), values)
    logits = np.array([2.0 * w[3, 0] + w[folded[1], 0], w[3, 0]]) + 0.25
    np.testing.assert_allclose(out.outputs["logits"], logits, rtol=1e-6)
    assert out.loss == pytest.approx(float(np.mean(sigmoid_cross_entropy(logits, np.array([1.0, 0.0])))))
    np.testing.assert_allclose(model.predict(batch, values)["predictions"], out.outputs["predictions"])


def test_prepare_runs_once_and_is_keyed_by_table_size() -> None:
    batch = Batch.from_csr(np.zeros(1, np.float32), [0, 3], [2, 9, 2], [1, 1, 1])
    small, large = create_model("logistic", ModelConfig(num_features=5)), create_model("logistic", ModelConfig(num_features=1000))
    prepared = small.prepare(batch)
    assert small.lookups(prepared)["weights"] is small.lookups(prepared)["weights"]  # read from extras, not recomputed
    assert list(large.lookups(prepared)["weights"]) == [2, 9]  # another id space: prepared again


def test_several_sparse_features_are_salted_apart() -> None:
    """Equal ids of two features land on different rows of the shared table; one feature keeps its ids."""
    ids = np.arange(20, dtype=np.int64)
    column = SparseColumn(np.arange(21, dtype=np.int64), ids, np.ones(20, np.float32))
    two = shared_rows(Batch(np.zeros(20, np.float32), {"A": column, "B": column}), 1 << 20)
    assert list(two.indptr) == list(range(0, 41, 2))  # merged per example, A's entry then B's
    a, b = two.ids[0::2], two.ids[1::2]
    assert not set(a.tolist()) & set(b.tolist())
    one = shared_rows(Batch(np.zeros(20, np.float32), {"A": column}), 1 << 20)
    assert list(one.ids) == list(ids)
    again = shared_rows(Batch(np.zeros(20, np.float32), {"A": column, "B": column}), 1 << 20)
    assert list(again.ids) == list(two.ids)  # deterministic


def test_fm_interactions_are_pairwise_products() -> None:
    """FM logit of one example with features i, j (values 1): bias + w_i + w_j + <v_i, v_j>."""
    model = create_model("fm", ModelConfig(num_features=10, embedding_dim=2))
    batch = model.prepare(Batch.from_csr(np.ones(1, np.float32), [0, 2], [1, 4], [1.0, 1.0]))
    assert list(model.lookups(batch)["embedding"]) == [1, 4]
    values = {"linear": np.array([[0.5], [-0.25]], np.float32), "embedding": np.array([[1, 2], [3, -1]], np.float32),
              "bias": np.array([0.1], np.float32)}
    logit = model.predict(batch, values)["logits"][0]
    assert logit == pytest.approx(0.1 + 0.5 - 0.25 + (1 * 3 + 2 * -1))


def test_fm_default_optimizers_linear_part_the_runs_dense_factors_a_tenth_of_the_sparse() -> None:
    """fm's linear part takes the run's optimizer (as logistic); the sparse factors Adagrad 0.05; the dense factors
    Adagrad 0.005 (issue 25, item 11: at 0.05 their pairs' term overshoots on Criteo's log-count values). Each given
    optimizer replaces its default alone."""
    config = ModelConfig(BatchSpec({"C1": 100, "C2": 100}, {"I1": 1, "I2": 2}))
    specs = {s.name: s for s in create_model("fm", config).variables()}
    assert [specs[n].optimizer for n in ("linear", "bias", "dense_linear")] == [None, None, None]
    assert specs["embedding"].optimizer is not None and specs["embedding"].optimizer.to_json() == {
        "name": "adagrad", "hyperparameters": {"learning_rate": 0.05, "initial_accumulator_value": 0.1}}
    assert specs["dense_embedding"].optimizer is not None and specs["dense_embedding"].optimizer.to_json() == {
        "name": "adagrad", "hyperparameters": {"learning_rate": 0.005, "initial_accumulator_value": 0.1}}
    given = {"name": "adagrad", "hyperparameters": {"learning_rate": 0.05, "initial_accumulator_value": 0.1}}
    specs = {s.name: s for s in create_model("fm", ModelConfig(config.features, params={
        "dense_embedding_optimizer": given})).variables()}
    assert specs["dense_embedding"].optimizer is not None and specs["dense_embedding"].optimizer.to_json() == given
    with pytest.raises(ModelError, match="model 'fm'.*rho"):
        create_model("fm", ModelConfig(config.features, params={"dense_embedding_optimizer": {
            "name": "adagrad", "hyperparameters": {"rho": 1}}}))


def test_unknown_model_and_bad_config() -> None:
    with pytest.raises(ModelError, match="unknown model 'nope'.*fm, logistic"):
        create_model("nope", ModelConfig())
    with pytest.raises(ModelError, match="cannot import module 'no_such_module'"):
        create_model("no_such_module:Model", ModelConfig())
    with pytest.raises(ModelError, match="is not a subclass of psflow.models.Model"):
        create_model("psflow.models.features:UniqueIds", ModelConfig())
    with pytest.raises(ModelError, match="init_stddev"):
        create_model("fm", ModelConfig(params={"init_stddev": -1}))


def test_unique_ids_is_safe_across_threads() -> None:
    # A worker's prefetch thread prepares training batches while the chief's evaluation prepares its own,
    # with the same model's table; numpy releases the GIL inside large fancy indexing, so unguarded calls
    # interleave and return wrong indices (this failed within a few hundred calls without the lock).
    import sys
    import threading

    from psflow.models.features import UniqueIds

    unique = UniqueIds(50_000)
    wrong: list[int] = []

    def run(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(800):
            ids = rng.integers(0, 50_000, 20_000)
            try:
                uniq, inverse = unique(ids)
                ok = uniq[inverse].tolist() == ids.tolist()
            except IndexError:  # an inverse from the other thread's table can point past this uniq
                ok = False
            if not ok:
                wrong.append(seed)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(seed,)) for seed in (1, 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert not wrong
