"""psflow.jsonio: the JSON psflow writes never holds NaN or Infinity (issue 17, item 8)."""

from __future__ import annotations

import io
import json
import math
from typing import Any

import numpy as np
import pytest

from psflow import jsonio
from psflow.rpc.framing import decode, encode
from psflow.train.config import ConfigError, TrainConfig


def strict_loads(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, as every reader but Python's does."""
    def refuse(name: str) -> None:
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_non_finite_floats_become_null_at_any_depth() -> None:
    value = {"auc": float("nan"), "loss": [1.0, float("inf"), -math.inf], "ps": [{"ema": np.float32("nan")}],
             "ok": np.float64(0.5), "n": np.int64(3), "flag": np.bool_(True), "arr": np.array([1.0, np.nan]),
             "pair": (2, float("nan")), "text": "NaN"}
    text = jsonio.dumps(value, indent=1)
    assert strict_loads(text) == {"auc": None, "loss": [1.0, None, None], "ps": [{"ema": None}], "ok": 0.5, "n": 3,
                                  "flag": True, "arr": [1.0, None], "pair": [2, None], "text": "NaN"}
    assert value["auc"] != value["auc"] and isinstance(value["pair"], tuple)  # the input is left as it was


def test_the_error_policy_names_the_output_and_the_key_path() -> None:
    with pytest.raises(ValueError, match=r"^config.json: model_params.hidden\[1\] is inf, which JSON cannot hold"):
        jsonio.dumps({"model_params": {"hidden": [1.0, float("inf")]}}, nonfinite="error", what="config.json")
    assert jsonio.dumps({"lr": 0.5}, nonfinite="error") == '{"lr": 0.5}'


def test_dump_writes_nothing_when_the_value_is_refused() -> None:
    out = io.StringIO()
    with pytest.raises(ValueError):
        jsonio.dump({"a": [1, float("nan")]}, out, nonfinite="error")
    assert out.getvalue() == ""
    jsonio.dump({"a": float("nan")}, out)
    assert strict_loads(out.getvalue()) == {"a": None}


def test_a_non_finite_float_in_a_frame_header_travels_as_null() -> None:
    frame = decode(encode({"loss": float("nan"), "examples": 4, "nested": {"x": -math.inf}},
                          {"g/w": np.ones(3, np.float32)}))
    assert frame.meta == {"loss": None, "examples": 4, "nested": {"x": None}}
    assert frame.arrays["g/w"].tolist() == [1.0, 1.0, 1.0]
    assert decode(encode({"loss": 0.25})).meta == {"loss": 0.25}


def test_a_non_finite_setting_is_refused_not_written_as_null() -> None:
    config = TrainConfig.flat(train=("x",), model_params={"dropout": float("nan")})  # --model-param dropout=NaN
    with pytest.raises(ConfigError, match=r"the training config: model\.params\.dropout is nan"):
        config.to_json()
    assert strict_loads(TrainConfig.flat(train=("x",)).to_json())["data"]["train"] == ["x"]
