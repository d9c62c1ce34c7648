"""Dynamic tables read back from exports and checkpoints: ArrayParameters by id, and ``_rebuild``'s checks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from psflow.checkpoint.variables import DYNAMIC_IDS
from psflow.data import Batch
from psflow.export import load_model
from psflow.models.api import DYNAMIC_TABLE_PARAM, ModelConfig, ModelError
from psflow.models.losses import sigmoid
from psflow.train.evaluation import ArrayParameters

IDS = np.array([-(1 << 62), -7, 0, 3, 1 << 40], np.int64)
ROWS = np.arange(10, dtype=np.float32).reshape(5, 2) + 1.0  # no zero row: a hit never looks like a miss


def _params() -> ArrayParameters:
    return ArrayParameters({"emb": ROWS, f"emb{DYNAMIC_IDS}": IDS, "bias": np.array([0.5], np.float32),
                            "static": np.arange(6, dtype=np.float32).reshape(3, 2)}, what="the test model")


def test_dynamic_rows_are_looked_up_by_id_and_unseen_ids_read_as_zeros() -> None:
    ids = np.array([3, 4, -7, 1 << 40, 3, -(1 << 62), -1, np.iinfo(np.int64).max, np.iinfo(np.int64).min], np.int64)
    got = _params().pull({"emb": ids})["emb"]
    want = np.zeros((ids.size, 2), np.float32)
    for i, x in enumerate(ids):
        if x in IDS:
            want[i] = ROWS[int(np.flatnonzero(IDS == x)[0])]
    assert got.dtype == np.float32 and got.shape == (ids.size, 2)
    np.testing.assert_array_equal(got, want)
    assert not got[[1, 6, 7, 8]].any() and got[[0, 2, 3, 4, 5]].all()  # misses are zeros, hits are not


def test_dynamic_pull_of_no_ids_and_of_an_empty_table() -> None:
    assert _params().pull({"emb": np.zeros(0, np.int64)})["emb"].shape == (0, 2)
    empty = ArrayParameters({"emb": np.zeros((0, 3), np.float32), f"emb{DYNAMIC_IDS}": np.zeros(0, np.int64)})
    np.testing.assert_array_equal(empty.pull({"emb": np.array([1, -2], np.int64)})["emb"], np.zeros((2, 3)))


def test_dynamic_pull_returns_a_copy() -> None:
    params = _params()
    params.pull({"emb": np.array([0], np.int64)})["emb"][:] = 99.0
    np.testing.assert_array_equal(params.arrays["emb"], ROWS)


def test_static_variables_beside_a_dynamic_table_are_unchanged() -> None:
    params = _params()
    out = params.pull({"static": np.array([2, 0]), "bias": None})
    np.testing.assert_array_equal(out["static"], [[4, 5], [0, 1]])
    np.testing.assert_array_equal(out["bias"], [0.5])
    with pytest.raises(ModelError, match=r"'static': id 3 is out of range \[0, 3\) in the test model"):
        params.pull({"static": np.array([3])})


@pytest.mark.parametrize("ids", [np.array([3, 0], np.int32), np.array([3.0]), np.array([[3, 0]], np.int64),
                                 np.array([3], np.uint64)])
def test_dynamic_ids_must_be_1d_int64(ids: np.ndarray) -> None:
    with pytest.raises(ModelError, match=r"dynamic table 'emb': ids must be a 1-D int64 array"):
        _params().pull({"emb": ids})


def test_dynamic_table_cannot_be_pulled_whole() -> None:
    with pytest.raises(ModelError, match=r"dynamic table 'emb' in the test model cannot be pulled whole"):
        _params().pull({"emb": None})


def test_bad_dynamic_ids_arrays_are_refused_naming_the_table() -> None:
    with pytest.raises(ModelError, match=r"dynamic table 'emb' .*one id per row"):
        ArrayParameters({"emb": ROWS, f"emb{DYNAMIC_IDS}": IDS[:3]})
    with pytest.raises(ModelError, match=r"dynamic table 'emb' .*1-D int64 ids"):
        ArrayParameters({"emb": ROWS, f"emb{DYNAMIC_IDS}": IDS.astype(np.float64)})
    with pytest.raises(ModelError, match=r"dynamic table 'emb' .*not sorted and distinct"):
        ArrayParameters({"emb": ROWS, f"emb{DYNAMIC_IDS}": IDS[::-1].copy()})


def _export(tmp_path: Path, tensors: dict[str, np.ndarray], *, dynamic: bool = True) -> Path:
    """A hand-written export of logistic regression (dynamic weights unless ``dynamic`` is False)."""
    config = ModelConfig(num_features=8, params={DYNAMIC_TABLE_PARAM: {}} if dynamic else {})
    save_file(tensors, str(tmp_path / "model.safetensors"))
    meta = {"format": "psflow-model", "format_version": 2, "model": "logistic", "model_config": config.to_dict(),
            "data": {"format": "libsvm", "schema": None, "num_features": 8}, "variables": {}, "global_step": 7}
    (tmp_path / "model.json").write_text(json.dumps(meta))
    return tmp_path


def _batch(ids: list[list[int]]) -> Batch:
    indptr = np.cumsum([0] + [len(row) for row in ids]).astype(np.int64)
    flat = np.array([x for row in ids for x in row], np.int64)
    return Batch.from_csr(np.zeros(len(ids)), indptr, flat, np.ones(flat.size))


def test_load_model_scores_a_dynamic_export_and_unseen_ids_get_the_bias_only_prediction(tmp_path: Path) -> None:
    weights = np.array([[0.25], [-1.0], [2.0]], np.float32)
    ids = np.array([-5, 2, 1 << 50], np.int64)
    exported = load_model(str(_export(tmp_path, {"weights": weights, f"weights{DYNAMIC_IDS}": ids,
                                                 "bias": np.array([0.3], np.float32)})))
    out = exported.outputs(_batch([[2, 1 << 50], [-5], [11, -6, 1 << 51], []]))
    np.testing.assert_allclose(out["logits"], [0.3 - 1.0 + 2.0, 0.3 + 0.25, 0.3, 0.3], rtol=1e-6)
    np.testing.assert_array_equal(out["predictions"], sigmoid(out["logits"]))
    assert out["predictions"][2] == sigmoid(np.array([np.float32(0.3)], np.float64))[0]


@pytest.mark.parametrize(("tensors", "message"), [
    ({"weights": np.zeros((2, 1), np.float32), "bias": np.zeros(1, np.float32)},
     r"dynamic table 'weights' .*'weights@ids' missing"),
    ({"weights": np.zeros((2, 3), np.float32), "weights@ids": np.arange(2), "bias": np.zeros(1, np.float32)},
     r"dynamic table 'weights' has rows of shape \(1,\); it holds rows \(2, 3\)"),
    ({"weights": np.zeros((2, 1), np.float32), "weights@ids": np.arange(3), "bias": np.zeros(1, np.float32)},
     r"dynamic table 'weights' has rows of shape \(1,\); it holds rows \(2, 1\) and ids \(3,\)"),
    ({"weights": np.zeros((2, 1), np.float32), "weights@ids": np.arange(2, dtype=np.int32),
      "bias": np.zeros(1, np.float32)}, r"'weights@ids' are int32, not int64"),
    ({"weights": np.zeros((2, 1), np.float32), "weights@ids": np.arange(2), "bias": np.zeros(2, np.float32)},
     r"'bias' has shape \(1,\); it holds \(2,\)"),
    ({"weights": np.zeros((2, 1), np.float32), "weights@ids": np.arange(2), "bias": np.zeros(1, np.float32),
      "extra": np.zeros(1, np.float32)}, r"variables it does not declare: 'extra'"),
])
def test_rebuild_refuses_real_mismatches_of_a_dynamic_model(tmp_path: Path, tensors: dict[str, np.ndarray],
                                                            message: str) -> None:
    with pytest.raises(ModelError, match=message):
        load_model(str(_export(tmp_path, tensors)))


def test_rebuild_refuses_a_dynamic_table_where_the_model_has_a_static_one(tmp_path: Path) -> None:
    tensors: dict[str, np.ndarray] = {"weights": np.zeros((8, 1), np.float32), "weights@ids": np.arange(8),
                                      "bias": np.zeros(1, np.float32)}
    with pytest.raises(ModelError, match=r"'weights' is a static variable of shape \(8, 1\); it holds a dynamic table"):
        load_model(str(_export(tmp_path, tensors, dynamic=False)))
