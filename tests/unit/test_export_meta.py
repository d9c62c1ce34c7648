"""An exported model's model.json of another shape (hand-edited, or not psflow's) is one error naming the file and
the field, never a traceback of psflow predict (issue 30: every error path of predict is one line)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import save_file

from psflow.cli.main import main

pytestmark = pytest.mark.timeout(60)

GOOD: dict[str, Any] = {"format": "psflow-model", "format_version": 2, "model": "logistic", "global_step": 7,
                        "model_config": {"num_features": 8}, "data": {"format": "libsvm", "num_features": 8}}


@pytest.mark.parametrize("field, value, says", [
    ("model_config", 5, "field 'model_config' is int 5"),
    ("global_step", None, "field 'global_step' is None, not a step"),
    ("global_step", "x", "field 'global_step' is 'x', not a step"),
    ("model", ["a"], "field 'model' is list ['a']"),
    ("data", 5, "field 'data' is int 5"),
    ("data", {"format": "nope"}, "field 'data' is {'format': 'nope'}: not how psflow reads data"),
    ("data", {"format": "tfrecord", "schema": 5}, "field 'data' is {'format': 'tfrecord', 'schema': 5}"),
    ("data", {"num_features": "x"}, "field 'data' is {'num_features': 'x'}"),
    ("moving_averages", 3, "field 'moving_averages' is int 3"),
    ("moving_averages", {"variables": 3}, "field 'moving_averages' names variables 3"),
])
def test_a_model_json_of_another_shape_is_one_line(tmp_path: Path, field: str, value: Any, says: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    save_file({"weights": np.zeros((8, 1), np.float32), "bias": np.zeros(1, np.float32)},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "model.json").write_text(json.dumps(GOOD | {field: value}))
    (tmp_path / "d.libsvm").write_text("1 3:1\n")
    assert main(["predict", str(tmp_path), str(tmp_path / "d.libsvm"), "--moving-averages"]) == 1
    err = capsys.readouterr().err
    assert err == f"psflow predict: error: {tmp_path / 'model.json'}: {says}" + err.split(says, 1)[1], err
    assert err.count("\n") == 1 and "not a model.json psflow export wrote" in err


def test_the_same_model_json_in_its_own_shape_scores(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    save_file({"weights": np.zeros((8, 1), np.float32), "bias": np.zeros(1, np.float32)},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "model.json").write_text(json.dumps(GOOD))
    (tmp_path / "d.libsvm").write_text("1 3:1\n0 5:1\n")
    assert main(["predict", str(tmp_path), str(tmp_path / "d.libsvm")]) == 0
    assert capsys.readouterr().out == "0.5\n0.5\n"
