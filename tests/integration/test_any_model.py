"""Any model on every path: the generic step, evaluation, checkpoints, restore, export and predict.

``fm``, the user's own Wide & Deep (examples/wide_deep_numpy.py) and the built-in
PyTorch ``wide_deep`` run through
``psflow train`` exactly as ``logistic`` does: between-graph, in-process,
in-graph, sync and ssp; a checkpoint restores onto another number of ps
tasks; ``psflow export`` records the model and ``psflow predict`` rebuilds
it and scores exactly what the cluster's evaluation scored.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from support import A9A, A9A_T, run_cli

from psflow.data import read_all
from psflow.models.metrics import binary_metrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

WIDE_DEEP = "examples.wide_deep_numpy:WideDeep"
COMMON = ("--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--log-every", "5", "--quiet")
FM = ("--model", "fm", "--embedding-dim", "4", "--optimizer", "adagrad", "--learning-rate", "0.1")


def logged_steps(run: Path, stderr: str) -> list[int]:
    """Every ``step=`` value logged by the run's workers (or clients): in-process runs log to stderr."""
    texts = [log.read_text() for log in sorted((run / "logs").glob("*.log"))] or [stderr]
    return [int(s) for text in texts for s in re.findall(r"\bstep=(\d+)", text)]


PATHS = {
    "between-graph": ("--workers", "2"),
    "in-process": ("--in-process",),
    "in-graph": ("--workers", "2", "--replication", "in-graph"),
    "in-graph-sync": ("--workers", "2", "--replication", "in-graph", "--mode", "sync"),
    "sync": ("--workers", "2", "--mode", "sync"),
    "ssp": ("--workers", "2", "--mode", "ssp"),
}
#: The built-in PyTorch Wide & Deep (psflow.torch), on the paths tests/integration/test_cnn_digits.py does not
#: run a PyTorch model on (it runs sync, in-graph sync and in-process).
TORCH_WIDE_DEEP = ("--model", "wide_deep", "--embedding-dim", "4", "--hidden", "16")
#: (model, its variables as the worker logs them, path)
CASES = [pytest.param(FM, "model 'fm': 3 variables", path, id=f"fm-{name}") for name, path in PATHS.items()] + [
    pytest.param(TORCH_WIDE_DEEP, "model 'wide_deep': 7 variables", PATHS[name], id=f"torch_wide_deep-{name}")
    for name in ("between-graph", "ssp")]


@pytest.mark.parametrize("model, described, path", CASES)
def test_models_train_on_every_path(model: tuple[str, ...], described: str, path: tuple[str, ...], tmp_path: Path) -> None:
    if model[1] == "wide_deep":
        pytest.importorskip("torch")
    out = tmp_path / "run"
    r = run_cli("train", *COMMON, *model, "--ps", "2", "--partitions", "2", "--epochs", "1", *path, "--output", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["eval"]["auc"] >= 0.86, metrics["eval"]  # one epoch (sync: half the steps); logistic: ~0.89
    assert metrics["eval"]["examples"] == 16281
    steps = logged_steps(out, r.stderr)
    assert steps and len(steps) == len(set(steps)), "each logged step value belongs to one push"
    if "--in-process" not in path and "in-graph" not in path:
        # A step's line is logged by the worker whose push produced it (in sync mode: completed it), so which
        # worker logs the steps that are multiples of --log-every depends on timing: look at every worker.
        logs = "".join(log.read_text() for log in sorted((out / "logs").glob("worker-*.log")))
        assert re.search(r"step=\d+ loss=[\d.]+ auc=[\d.]+ logloss=[\d.]+ accuracy=[\d.]+ examples/s=", logs), logs[-2000:]
        assert described in (out / "logs" / "worker-0.log").read_text()  # a9a has no dense features: fm has linear, embedding, bias


@pytest.mark.parametrize("model", [FM, ("--model", WIDE_DEEP, "--embedding-dim", "4", "--model-param", "hidden=[16]"),
                                   TORCH_WIDE_DEEP], ids=["fm", "wide_deep_numpy", "torch_wide_deep"])
def test_checkpoint_restore_elsewhere_export_and_predict(model: tuple[str, ...], tmp_path: Path) -> None:
    if model[1] == "wide_deep":
        pytest.importorskip("torch")
    ckpt, export = tmp_path / "ckpt", tmp_path / "model"
    first, second = tmp_path / "first", tmp_path / "second"
    r = run_cli("train", *COMMON, *model, "--ps", "2", "--partitions", "2", "--workers", "1", "--epochs", "1",
                "--checkpoint-dir", str(ckpt), "--output", str(first))
    assert r.returncode == 0, r.stderr[-3000:]
    steps_one_epoch = json.loads((first / "metrics.json").read_text())["global_step"]
    r = run_cli("train", *COMMON, *model, "--ps", "3", "--partitions", "3", "--workers", "1", "--epochs", "2",
                "--checkpoint-dir", str(ckpt), "--output", str(second))
    assert r.returncode == 0, r.stderr[-3000:]
    assert re.search(r"restored checkpoint \S+ at step \d+", (second / "logs" / "worker-0.log").read_text())
    metrics = json.loads((second / "metrics.json").read_text())
    assert metrics["global_step"] == 2 * steps_one_epoch  # the second epoch resumed where the first ended

    r = run_cli("export", str(ckpt), str(export))
    assert r.returncode == 0, r.stderr
    meta = json.loads((export / "model.json").read_text())
    assert meta["model"] == model[1] and meta["model_config"]["embedding_dim"] == 4
    assert meta["data"]["format"] == "libsvm" and meta["global_step"] == metrics["global_step"]
    out = tmp_path / "predictions.txt"
    named = ("--model", model[1]) if ":" in model[1] else ()  # a module model.json names is imported only if named
    r = run_cli("predict", str(export), str(A9A_T), *named, "--output", str(out))
    assert r.returncode == 0, r.stderr
    predictions = np.array([float(x) for x in out.read_text().split()])
    # One worker: the final checkpoint holds exactly the model the launcher evaluated.
    assert binary_metrics(read_all([str(A9A_T)], "libsvm").labels, predictions) == metrics["eval"]
