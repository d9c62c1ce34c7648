"""``psflow export`` + ``psflow predict`` of a model trained with a dynamic table (``--embedding-table dynamic``).

The export holds the table's rows and ids (``weights``, ``weights@ids``); predict scores a9a.t exactly as the
cluster's evaluation did, and an id the table never held reads as a zero row (so logistic regression gives an
example of only such ids ``sigmoid(bias)``), as on the ps tasks.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from support import A9A, A9A_T, REPO, run_cli

from psflow.checkpoint.variables import DYNAMIC_IDS
from psflow.data import read_all
from psflow.export import load_checkpoint_model
from psflow.models.losses import sigmoid
from psflow.models.metrics import binary_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

#: Ids a9a never uses (its features are 1..123), below the recorded num_features (2**20).
UNSEEN = (124, 5000, 999_999)


def _predictions(path: Path) -> np.ndarray:
    return np.array([float(x) for x in path.read_text().split()])


def test_dynamic_table_export_predicts_as_the_cluster_evaluated(tmp_path: Path) -> None:
    run, ckpt, model = tmp_path / "run", tmp_path / "ckpt", tmp_path / "model"
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--ps", "2", "--workers", "1",
                "--embedding-table", "dynamic", "--epochs", "1", "--checkpoint-dir", str(ckpt),
                "--output", str(run), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())

    r = run_cli("export", str(ckpt), str(model))
    assert r.returncode == 0, r.stderr
    meta = json.loads((model / "model.json").read_text())
    tensors = load_file(str(model / "model.safetensors"))
    ids, rows = tensors[f"weights{DYNAMIC_IDS}"], tensors["weights"]
    assert meta["global_step"] == metrics["global_step"]
    assert 0 < ids.size <= 123 and ids.dtype == np.int64 and bool(np.all(np.diff(ids) > 0))
    assert rows.shape == (ids.size, 1) and not set(UNSEEN) & set(ids.tolist())
    assert meta["variables"]["weights"] == {"shape": [ids.size, 1], "dtype": "float32", "dynamic": True,
                                            "rows": ids.size}
    assert meta["variables"]["bias"] == {"shape": [1], "dtype": "float32"}

    out = tmp_path / "probs.txt"
    r = run_cli("predict", str(model), str(A9A_T), "--output", str(out))
    assert r.returncode == 0, r.stderr
    probs = _predictions(out)
    labels = read_all([str(A9A_T)], "libsvm").labels
    # One worker: the chief's final checkpoint holds the model the launcher evaluated.
    got = binary_metrics(labels, probs)
    assert got["examples"] == metrics["eval"]["examples"] == labels.size
    for key in ("auc", "logloss", "accuracy"):
        assert got[key] == pytest.approx(metrics["eval"][key], abs=1e-6), key
    # The checkpoint read in-process scores the same as the export.
    np.testing.assert_array_equal(load_checkpoint_model(str(ckpt)).predict(str(A9A_T)), probs)

    # Ids never seen: zero rows. Only such ids (or none) give sigmoid(bias); beside seen ids they add nothing.
    seen = int(ids[np.argmax(np.abs(rows[:, 0]))])
    data = tmp_path / "unseen.libsvm"
    data.write_text(f"1 {UNSEEN[0]}:1 {UNSEEN[1]}:2.5 {UNSEEN[2]}:-3\n"
                    f"0 {UNSEEN[1]}:1\n"
                    f"0 {seen}:1 {UNSEEN[2]}:7\n"
                    f"1 {seen}:1\n")
    unseen_out = tmp_path / "unseen.txt"
    r = run_cli("predict", str(model), str(data), "--output", str(unseen_out))
    assert r.returncode == 0, r.stderr
    unseen = _predictions(unseen_out)
    bias_only = float(sigmoid(np.array([float(tensors["bias"][0])]))[0])
    assert unseen.tolist()[:2] == [bias_only, bias_only]
    assert unseen[2] == unseen[3] != bias_only
    np.testing.assert_array_equal(load_checkpoint_model(str(ckpt)).predict(str(data)), unseen)


#: The bundled SYNTHETIC Criteo-format data (data/criteo_synthetic/README.md): the test needs only the format.
CRITEO = REPO / "data" / "criteo_synthetic"


@pytest.mark.parametrize("table", ["static", "dynamic"])
def test_a_criteo_export_reads_its_features_in_the_order_it_was_trained_with(tmp_path: Path, table: str) -> None:
    """The manifest once sorted its keys: the model record's features came back C1, C10, ..., I1, I10, ..., and
    psflow predict fed the dense columns to the wrong weights (on the real sample: eval AUC 0.73 in training, 0.62
    from the export)."""
    train, evaluation = CRITEO / "train.txt", CRITEO / "eval.txt"
    run, ckpt, model = tmp_path / "run", tmp_path / "ckpt", tmp_path / "model"
    r = run_cli("train", "--format", "criteo", "--train", str(train), "--eval", str(evaluation), "--ps", "2",
                "--workers", "1", "--embedding-table", table, "--epochs", "1", "--checkpoint-dir", str(ckpt),
                "--output", str(run), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    loaded = load_checkpoint_model(str(ckpt))
    assert list(loaded.model.config.features.dense) == [f"I{i}" for i in range(1, 14)]
    assert list(loaded.model.config.features.sparse) == [f"C{i}" for i in range(1, 27)]
    assert run_cli("export", str(ckpt), str(model)).returncode == 0
    out = tmp_path / "probs.txt"
    r = run_cli("predict", str(model), str(evaluation), "--output", str(out))
    assert r.returncode == 0, r.stderr
    labels = read_all([str(evaluation)], "criteo", num_features=0 if table == "dynamic" else 1 << 20).labels
    got = binary_metrics(labels, _predictions(out))
    assert got["auc"] == pytest.approx(metrics["eval"]["auc"], abs=1e-6)
    assert got["logloss"] == pytest.approx(metrics["eval"]["logloss"], abs=1e-6)
