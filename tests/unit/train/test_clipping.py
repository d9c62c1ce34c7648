"""Gradient clipping by global norm: TensorFlow's clip_by_global_norm, dense and sparse, and in the train step."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.data import Batch
from psflow.gradients import DenseGradient, Gradients, SparseGradient
from psflow.models.api import Lookups, Model, ModelConfig, ModelError, ModelOutput, Values, VariableSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.clipping import clip_by_global_norm, global_norm
from psflow.train.step import TrainStep, compute_gradients

GOLDEN = json.loads((Path(__file__).resolve().parents[2] / "data" / "golden" / "trainer_tf.json").read_text())
CLIP = GOLDEN["clip_by_global_norm"]
TENSORS = [np.array(t, np.float32) for t in CLIP["tensors"]]  # shapes (4, 3), (3,), (2, 2)
CLIP_NORMS = sorted(CLIP["by_clip_norm"], key=float)
RTOL = 1e-6


def golden(clip: str) -> tuple[float, list[np.ndarray]]:
    case = CLIP["by_clip_norm"][clip]
    return case["global_norm"], [np.array(c, np.float32) for c in case["clipped"]]


def test_the_golden_file_clips_at_three_norms_below_and_above_the_global_norm() -> None:
    norms = [float(c) for c in CLIP_NORMS]
    assert len(norms) == 3
    assert min(norms) < golden(CLIP_NORMS[0])[0] < max(norms)  # some clip, one lets the gradients through


@pytest.mark.parametrize("clip", CLIP_NORMS)
def test_dense_gradients_are_tfs_clip_by_global_norm(clip: str) -> None:
    want_norm, want = golden(clip)
    grads = {f"v{i}": DenseGradient(t) for i, t in enumerate(TENSORS)}
    clipped, norm = clip_by_global_norm(grads, float(clip))
    assert norm == pytest.approx(want_norm, rel=RTOL)
    assert global_norm(grads) == norm
    for i, w in enumerate(want):
        got = clipped[f"v{i}"]
        assert isinstance(got, DenseGradient) and got.values.dtype == np.float32
        np.testing.assert_allclose(got.values, w, rtol=RTOL, atol=1e-7, err_msg=f"clip {clip}: tensor {i}")
    for i, t in enumerate(TENSORS):  # the input is left as it was
        np.testing.assert_array_equal(grads[f"v{i}"].values, t)


@pytest.mark.parametrize("clip", CLIP_NORMS)
def test_a_sparse_gradient_counts_its_values_as_given_duplicate_rows_included(clip: str) -> None:
    """TF's global_norm of IndexedSlices reads .values: the (4, 3) tensor as 4 rows of a table, row 7 twice."""
    want_norm, want = golden(clip)
    rows = np.array([7, 2, 7, 0], np.int64)
    grads: Gradients = {"table": SparseGradient(rows, TENSORS[0]), "bias": DenseGradient(TENSORS[1]),
                        "kernel": DenseGradient(TENSORS[2])}
    clipped, norm = clip_by_global_norm(grads, float(clip))
    assert norm == pytest.approx(want_norm, rel=RTOL)
    # Not the norm of the duplicates summed first (what the ps applies): that one is different here.
    summed = TENSORS[0][[1, 3]].tolist() + [list(TENSORS[0][0] + TENSORS[0][2])]
    merged = np.sqrt(np.sum(np.square(summed)) + np.sum(np.square(TENSORS[1])) + np.sum(np.square(TENSORS[2])))
    assert merged != pytest.approx(want_norm, rel=1e-3)
    table = clipped["table"]
    assert isinstance(table, SparseGradient)
    np.testing.assert_array_equal(table.rows, rows)
    np.testing.assert_allclose(table.values, want[0], rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(clipped["bias"].values, want[1], rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(clipped["kernel"].values, want[2], rtol=RTOL, atol=1e-7)


def test_gradients_within_the_norm_pass_unchanged_without_a_copy() -> None:
    grads = {f"v{i}": DenseGradient(t) for i, t in enumerate(TENSORS)}
    clipped, norm = clip_by_global_norm(grads, 100.0)
    assert clipped is grads and norm < 100.0
    empty, zero = clip_by_global_norm({}, 1.0)
    assert dict(empty) == {} and zero == 0.0


def test_a_non_finite_gradient_gives_nan_values_as_tensorflow() -> None:
    bad = TENSORS[1].copy()
    bad[0] = np.inf
    clipped, norm = clip_by_global_norm({"a": DenseGradient(TENSORS[0]), "b": DenseGradient(bad)}, 1.0)
    assert norm == np.inf
    assert np.isnan(clipped["a"].values).all() and np.isnan(clipped["b"].values).all()


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_clip_norm_that_is_not_finite_and_positive_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="clip norm must be a finite number > 0"):
        clip_by_global_norm({"a": DenseGradient(TENSORS[1])}, bad)


# --- in the train step -------------------------------------------------------------------------------------
class FixedGradients(Model):
    """Returns the golden tensors as the gradients of 3 variables (the (4, 3) one sparse over rows 1, 3, 4, 6)."""

    name = "fixed"
    ROWS = np.array([1, 3, 4, 6], np.int64)

    def variables(self) -> Sequence[VariableSpec]:
        return [VariableSpec("table", (8, 3)), VariableSpec("bias", (3,)), VariableSpec("kernel", (2, 2))]

    def lookups(self, batch: Batch) -> Lookups:
        return {"table": self.ROWS, "bias": None, "kernel": None}

    def compute(self, batch: Batch, values: Values) -> ModelOutput:
        grads = {"table": SparseGradient(self.ROWS, TENSORS[0]), "bias": DenseGradient(TENSORS[1]),
                 "kernel": DenseGradient(TENSORS[2])}
        return ModelOutput(0.5, grads, {"predictions": np.full(batch.num_examples, 0.5)})

    def predict(self, batch: Batch, values: Values) -> dict[str, np.ndarray]:
        return {"predictions": np.full(batch.num_examples, 0.5)}


def sgd_client(model: Model) -> ParameterClient:
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
    variables = VariableSet(replica_device_setter(cluster=cluster))
    for spec in model.variables():
        variables.get_variable(spec.name, spec.shape)  # zeros
    services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    client = ParameterClient(cluster, variables.placements(), client_name="/job:worker/task:0", channels=channels)
    client.register(OptimizerSpec("sgd", {"learning_rate": 1.0}), chief=True)
    return client


BATCH = Batch(np.zeros(4, np.float32), {}, {})


@pytest.mark.parametrize("clip", CLIP_NORMS)
def test_the_train_step_pushes_the_clipped_gradients_and_reports_the_norm(clip: str) -> None:
    want_norm, want = golden(clip)
    model = FixedGradients(ModelConfig())
    model.clip_gradient_norm = float(clip)
    client = sgd_client(model)
    result = TrainStep(model, client)(BATCH)
    assert result.metrics["grad_norm"] == pytest.approx(want_norm, rel=RTOL)
    after = client.pull({"table": None, "bias": None, "kernel": None})
    np.testing.assert_allclose(-after["table"][FixedGradients.ROWS], want[0], rtol=RTOL, atol=1e-7)  # sgd, lr 1, from 0
    np.testing.assert_allclose(-after["bias"], want[1], rtol=RTOL, atol=1e-7)
    np.testing.assert_allclose(-after["kernel"], want[2], rtol=RTOL, atol=1e-7)
    # compute_gradients (the in-graph workers' step) clips the same way
    output, _ = compute_gradients(model, client, BATCH)
    np.testing.assert_allclose(output.gradients["kernel"].values, want[2], rtol=RTOL, atol=1e-7)


def test_without_a_clip_norm_the_step_pushes_the_gradients_as_computed_and_adds_no_metric() -> None:
    model = FixedGradients(ModelConfig())
    client = sgd_client(model)
    result = TrainStep(model, client)(BATCH)
    assert "grad_norm" not in result.metrics
    np.testing.assert_allclose(-client.pull({"kernel": None})["kernel"], TENSORS[2], rtol=RTOL)


@pytest.mark.parametrize("bad", [0.0, -2.0, float("nan")])
def test_a_models_bad_clip_norm_is_refused_naming_the_model(bad: float) -> None:
    model = FixedGradients(ModelConfig())
    model.clip_gradient_norm = bad
    with pytest.raises(ModelError, match=r"model 'fixed': clip_gradient_norm must be a finite number > 0"):
        TrainStep(model, sgd_client(model))
