"""ParameterService handlers, called directly (no sockets): every refusal leaves state intact."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.service import ParameterService
from psflow.rpc.api import InvalidRequest, PreconditionFailed
from psflow.rpc.framing import Frame

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
SGD = OptimizerSpec("sgd", {"learning_rate": 0.5})


def layout(rows: int = 10) -> list[dict[str, Any]]:
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("w", (rows, 2), partitioner=fixed_size_partitioner(2), initializer={"name": "constant", "value": 1.0})
    vs.get_variable("b", (1,))
    return [p.to_json() for p in vs.placements()]


def registered(task: int = 0) -> ParameterService:
    svc = ParameterService(task, holds_global_step=task == 0)
    meta, _ = svc.register(Frame({"layout": layout(), "optimizer": SGD.to_json(), "client": "w0", "chief": True}))
    assert meta["created"] is True
    return svc


def test_register_creates_only_this_tasks_partitions() -> None:
    # round-robin: w/part_0 -> ps 0, w/part_1 -> ps 1, b -> ps 0
    assert sorted(registered(0).store.keys()) == ["b/part_0", "w/part_0"]
    assert sorted(registered(1).store.keys()) == ["w/part_1"]


def test_register_is_idempotent_and_refuses_a_different_layout() -> None:
    svc = registered()
    meta, _ = svc.register(Frame({"layout": layout(), "optimizer": SGD.to_json(), "client": "w1"}))
    assert meta == {"created": False, "ready": True, "init_count": 1}
    with pytest.raises(PreconditionFailed, match="w2 has a different model layout.*'w'"):
        svc.register(Frame({"layout": layout(rows=12), "optimizer": SGD.to_json(), "client": "w2"}))
    with pytest.raises(InvalidRequest, match="bad layout or optimizer"):
        svc.register(Frame({"layout": "nope", "optimizer": SGD.to_json()}))
    assert svc.init_count == 1


def test_push_applies_and_takes_one_step() -> None:
    svc = registered()
    meta, _ = svc.push(Frame({"grads": [["w/part_0", "sparse"]], "step": True, "examples": 4, "loss": 0.5},
                             {"g/w/part_0": np.ones((1, 2), np.float32), "i/w/part_0": np.array([3])}))
    assert meta == {"step": 1}
    _, out = svc.pull(Frame({"vars": [["w/part_0", "r"]]}, {"r": np.array([3, 0])}))
    np.testing.assert_array_equal(out["w/part_0"], [[0.5, 0.5], [1.0, 1.0]])
    stats, _ = svc.get_stats(Frame())
    assert stats["global_step"] == 1 and stats["examples"] == 4 and stats["loss_ema"] == 0.5
    assert stats["apply_seconds"] > 0 and stats["read_seconds"] > 0  # the time spent in the update and the gather


@pytest.mark.parametrize(
    "meta, arrays, message",
    [
        ({"grads": "x"}, {}, "'grads' must be a list"),
        ({"grads": [["w/part_0", "weird"]]}, {}, "must be \\[name, 'dense'\\|'sparse'\\]"),
        ({"grads": [[7, "dense"]]}, {}, "variable name must be a string"),
        ({"grads": [["w/part_0", "dense"]]}, {}, "gradient array missing"),
        ({"grads": [["w/part_0", "sparse"]]}, {"g/w/part_0": np.ones((1, 2), np.float32)}, "without rows"),
        ({"grads": [["w/part_0", "dense"]]}, {"g/w/part_0": np.ones((5, 2), np.int64)}, "\\(5, 2\\) \\(int64\\)"),
        ({"grads": [["w/part_0", "sparse"]]}, {"g/w/part_0": np.ones((1, 2), np.float32), "i/w/part_0": np.array([[1]])},
         "1-D int64"),
        ({"grads": [], "examples": -1}, {}, "non-negative integer"),
        ({"grads": [["w/part_1", "dense"]]}, {"g/w/part_1": np.ones((5, 2), np.float32)}, "unknown variable partition 'w/part_1'"),
    ],
)
def test_bad_pushes_refused_without_change(meta: dict[str, Any], arrays: dict[str, np.ndarray], message: str) -> None:
    svc = registered()
    before = svc.store.get("w/part_0").value.copy()
    with pytest.raises(InvalidRequest, match=message):
        svc.push(Frame(meta, arrays))
    np.testing.assert_array_equal(svc.store.get("w/part_0").value, before)
    assert svc.global_step is not None and svc.global_step.value == 0


def test_step_only_on_the_step_task() -> None:
    svc = registered(1)
    with pytest.raises(InvalidRequest, match="global_step does not live on this task"):
        svc.push(Frame({"grads": [], "step": True}))


@pytest.mark.parametrize(
    "meta, arrays, message",
    [
        ({"vars": [["w/part_0", "r"]]}, {}, "rows array 'r' missing"),
        ({"vars": [["w/part_0", "r"]]}, {"r": np.array([5])}, "row 5 out of range \\(partition has 5 rows\\)"),
        ({"vars": [["w/part_0"]]}, {}, "must be \\[name, rows\\]"),
        ({"vars": [["nope", None]]}, {}, "unknown variable partition 'nope'"),
    ],
)
def test_bad_pulls_refused(meta: dict[str, Any], arrays: dict[str, np.ndarray], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        registered().pull(Frame(meta, arrays))


def test_push_pull_applies_then_reads_and_validates_the_pull_first() -> None:
    svc = registered()
    grads = {"g/w/part_0": np.ones((1, 2), np.float32), "i/w/part_0": np.array([3])}
    meta, out = svc.push_pull(Frame({"grads": [["w/part_0", "sparse"]], "step": True, "vars": [["w/part_0", "r"]]},
                                    {**grads, "r": np.array([3, 4])}))
    assert meta["step"] == 1 and meta["pull_step"] == 1
    np.testing.assert_array_equal(out["w/part_0"], [[0.5, 0.5], [1.0, 1.0]])  # the push is already applied
    with pytest.raises(InvalidRequest, match="row 9 out of range"):
        svc.push_pull(Frame({"grads": [["w/part_0", "sparse"]], "step": True, "vars": [["w/part_0", "r"]]},
                            {**grads, "r": np.array([9])}))
    assert svc.global_step is not None and svc.global_step.value == 1  # the refused call applied nothing
    np.testing.assert_array_equal(svc.store.get("w/part_0").value[3], [0.5, 0.5])


@pytest.mark.parametrize("meta", [{}, {"token": -1}, {"token": 1.5}, {"token": True}, {"token": 1, "scope": ""},
                                  {"token": 1, "scope": 3}, {"token": 1, "holder": ["x"]}])
def test_fence_call_refuses_malformed_tokens(meta: dict[str, object]) -> None:
    with pytest.raises(InvalidRequest):
        ParameterService(0, holds_global_step=True).handlers()["Fence"](Frame(meta=dict(meta)))


def test_fence_call_maps_a_fenced_write_to_failed_precondition() -> None:
    fence = ParameterService(0, holds_global_step=True).handlers()["Fence"]
    assert fence(Frame(meta={"token": 9}))[0] == {"accepted": True, "highest": 9}
    with pytest.raises(PreconditionFailed, match="fenced at epoch 9"):
        fence(Frame(meta={"token": 8}))
