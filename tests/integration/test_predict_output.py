"""``psflow predict --output FILE`` writes FILE whole or not at all.

Before, FILE was opened for writing before the model was loaded: a refusal (no such model, a bad
data file, a model.json naming a module the user did not) left an empty FILE behind, and truncated
the predictions an earlier run had written there.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from support import run_bounded

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RECORDS = "1 1:1 3:0.5\n0 2:1 7:1\n1 4:2\n"  # 3 LIBSVM records of 8 features


def export(tmp: Path, model: str = "logistic") -> str:
    """A hand-made export of logistic regression over 8 features, whose model.json names ``model``."""
    out = tmp / "export"
    out.mkdir()
    weights = np.arange(8, dtype=np.float32).reshape(8, 1) / 10
    save_file({"weights": weights, "bias": np.array([-0.5], np.float32)}, str(out / "model.safetensors"))
    (out / "model.json").write_text(json.dumps({
        "format": "psflow-model", "format_version": 2, "model": model, "global_step": 3, "variables": {},
        "model_config": {"num_features": 8}, "data": {"format": "libsvm", "schema": None, "num_features": 8}}))
    return str(out)


def data(tmp: Path, text: str = RECORDS) -> str:
    path = tmp / "data.libsvm"
    path.write_text(text)
    return str(path)


def predict(tmp: Path, *args: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k != "PSFLOW_TOKEN"}
    r = run_bounded([sys.executable, "-m", "psflow", "predict", *args], timeout=100, cwd=tmp, env=env)
    return r.returncode, r.stderr


REFUSALS: dict[str, Callable[[Path], list[str]]] = {
    "no such model": lambda t: [str(t / "nope"), data(t)],
    "a malformed record": lambda t: [export(t), data(t, "1 1:1\n1 x:2\n")],
    "a missing data file": lambda t: [export(t), str(t / "nope.libsvm")],
    "a model.json naming a module the user did not": lambda t: [export(t, "someones_module:Net"), data(t)],
}


@pytest.mark.parametrize("name", list(REFUSALS))
@pytest.mark.parametrize("existing", [False, True], ids=["new file", "existing file"])
def test_a_refusal_leaves_no_file_and_never_truncates_one(name: str, existing: bool, tmp_path: Path) -> None:
    out = tmp_path / "probs.txt"
    if existing:
        out.write_text("0.25\n0.75\n")
    code, stderr = predict(tmp_path, *REFUSALS[name](tmp_path), "--output", str(out))
    assert code == 1, stderr[-3000:]
    assert "Traceback" not in stderr and len(stderr.strip().splitlines()) == 1, stderr[-3000:]
    if existing:
        assert out.read_text() == "0.25\n0.75\n", "the earlier predictions were overwritten"
    else:
        assert not out.exists(), f"a refusal left {out} behind ({out.stat().st_size} bytes)"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("probs")) == (["probs.txt"] if existing else [])


def test_predictions_replace_the_file_whole(tmp_path: Path) -> None:
    out = tmp_path / "probs.txt"
    out.write_text("stale\n" * 10)
    code, stderr = predict(tmp_path, export(tmp_path), data(tmp_path), "--output", str(out))
    assert code == 0, stderr[-3000:]
    lines = out.read_text().splitlines()
    assert len(lines) == 3, lines
    weights = np.arange(8) / 10
    x = np.zeros((3, 8))
    x[0, [1, 3]] = [1, 0.5]
    x[1, [2, 7]] = 1
    x[2, 4] = 2
    want = 1 / (1 + np.exp(-(x @ weights - 0.5)))
    np.testing.assert_allclose([float(v) for v in lines], want, rtol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("probs")) == ["probs.txt"]


@pytest.mark.parametrize("text", ["", "\n\n"], ids=["empty", "blank lines"])
def test_a_data_file_without_records_gives_no_predictions(text: str, tmp_path: Path) -> None:
    """Zero records, zero lines (exit 0). Before, the predictions' reshape raised ValueError with a traceback."""
    out = tmp_path / "probs.txt"
    out.write_text("stale\n")
    code, stderr = predict(tmp_path, export(tmp_path), data(tmp_path, text), "--output", str(out))
    assert code == 0, stderr[-3000:]
    assert out.read_text() == ""
