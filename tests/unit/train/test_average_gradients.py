"""In-graph sync's combination of the workers' gradients (:func:`psflow.train.in_graph.average_gradients`), on a
real model's sparse and dense gradients: slices of uneven size, each weighted by its examples, give one process's
gradient on the whole batch (57033e4 tested it on the digits CNN, whose gradients are all dense)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from psflow.cluster import ClusterSpec
from psflow.data import Batch, read_all
from psflow.gradients import DenseGradient, Gradients, SparseGradient
from psflow.train.build import build_model, data_options
from psflow.train.config import TrainConfig
from psflow.train.evaluation import ArrayParameters
from psflow.train.in_graph import average_gradients

A9A = Path(__file__).resolve().parents[3] / "data" / "a9a" / "a9a"


def dense(grad: DenseGradient | SparseGradient, shape: tuple[int, ...]) -> np.ndarray:
    if isinstance(grad, DenseGradient):
        return np.asarray(grad.values, np.float64).reshape(shape)
    out = np.zeros(shape, np.float64)
    np.add.at(out, grad.rows, np.asarray(grad.values, np.float64))
    return out


def test_uneven_slices_weighted_by_their_examples_give_one_process_sparse_and_dense_gradient() -> None:
    config = TrainConfig.flat(train=(str(A9A),), num_features=124, model="logistic", batch_size=5)
    model, variables = build_model(config, ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"]}))
    rng = np.random.default_rng(0)
    values = {p.var.name: rng.normal(0, 0.5, p.var.shape).astype(np.float32) for p in variables.placements()}
    batch = read_all([str(A9A)], "libsvm", **data_options(config)).slice(0, 5)

    def gradients(b: Batch) -> Gradients:
        prepared = model.prepare(b)
        return model.compute(prepared, ArrayParameters(values).pull(model.lookups(prepared))).gradients

    whole = gradients(batch)
    assert any(isinstance(g, SparseGradient) for g in whole.values()), whole  # the weights: a sparse gradient
    assert any(isinstance(g, DenseGradient) for g in whole.values()), whole   # the bias: a dense one
    sizes = [1, 2, 2]  # an epoch's last batch of 5 on 3 workers; rows shared between the slices are summed
    slices = [gradients(batch.slice(a, a + n)) for a, n in zip(np.cumsum([0, *sizes[:-1]]), sizes, strict=True)]
    combined = average_gradients(slices, sizes)
    for name, want in whole.items():
        shape = values[name].shape
        np.testing.assert_allclose(dense(combined[name], shape), dense(want, shape), rtol=1e-5, atol=1e-7,
                                   err_msg=name)
    plain = average_gradients(slices)  # the plain mean (what 57033e4 replaced) is not one process's gradient
    assert not all(np.allclose(dense(plain[n], values[n].shape), dense(whole[n], values[n].shape)) for n in whole)
