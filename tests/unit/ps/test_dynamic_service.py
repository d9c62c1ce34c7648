"""A ps task's dynamic tables (issue #14): created at Register, read and updated by id, saved and loaded whole."""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.numpy import load as safetensors_load

from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.dynamic import DynamicTableError, share_spec, table_totals
from psflow.ps.service import ParameterService
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

ADAGRAD = OptimizerSpec("adagrad", {"learning_rate": 0.5})


def _service(num_ps: int = 2, **options: object) -> ParameterService:
    variables = VariableSet(replica_device_setter(num_ps))
    variables.get_variable("emb", (0, 2), dynamic=dict(options), initializer={"name": "constant", "value": 0.5})
    service = ParameterService(0, holds_global_step=True)
    meta = {"layout": [p.to_json() for p in variables.placements()], "optimizer": ADAGRAD.to_json(), "chief": True}
    assert service.register(Frame(meta, {}))[0]["created"]
    return service


def _pull(service: ParameterService, ids: np.ndarray, *, create: bool) -> np.ndarray:
    meta, arrays = service.pull(Frame({"vars": [["emb/part_0", "r"]], "create": create}, {"r": ids}))
    return arrays["emb/part_0"]


def test_share_specs_divide_the_capacity_and_refuse_bad_options_by_name() -> None:
    spec = share_spec("emb", 4, {"capacity_rows": 10, "capacity_bytes": 7001, "admit_after": 3}, optimizer=None,
                      initializer={"name": "zeros"}, num_shares=3)
    assert (spec.capacity_rows, spec.capacity_bytes, spec.admit_after, spec.dim) == (4, 2334, 3, 4)
    with pytest.raises(DynamicTableError, match=r"dynamic table 'emb': capacity_rows must be an int >= 1, got 0"):
        share_spec("emb", 4, {"capacity_rows": 0}, optimizer=None, initializer={"name": "zeros"}, num_shares=2)
    with pytest.raises(DynamicTableError, match=r"dynamic table 'emb': unknown options \['capacity'\]"):
        share_spec("emb", 4, {"capacity": 5}, optimizer=None, initializer={"name": "zeros"}, num_shares=2)


def test_register_refuses_a_bad_table_by_name_and_keeps_nothing() -> None:
    variables = VariableSet(replica_device_setter(1))
    variables.get_variable("emb", (0, 2), dynamic={"policy": "fifo"})
    service = ParameterService(0, holds_global_step=True)
    meta = {"layout": [p.to_json() for p in variables.placements()], "optimizer": ADAGRAD.to_json(), "chief": True}
    with pytest.raises(InvalidRequest, match=r"variable 'emb': dynamic table 'emb': policy must be one of"):
        service.register(Frame(meta, {}))
    assert not service.registered and service.store.keys() == []


def test_training_reads_create_rows_and_other_reads_do_not() -> None:
    service = _service(1)
    ids = np.array([7, -3, 7], dtype=np.int64)
    np.testing.assert_array_equal(_pull(service, ids, create=False), np.zeros((3, 2), np.float32))
    np.testing.assert_array_equal(_pull(service, ids, create=True), np.full((3, 2), 0.5, np.float32))
    totals = table_totals([service.get_stats(Frame({}, {}))[0]])
    assert totals["emb"]["rows"] == 2 and totals["emb"]["absent_reads"] == 3 and totals["emb"]["admitted"] == 2
    with pytest.raises(InvalidRequest, match=r"dynamic table 'emb' partition 0 is read by ids, never whole"):
        service.pull(Frame({"vars": [["emb/part_0", None]]}, {}))


def test_a_saved_share_loads_back_and_a_bad_snapshot_changes_nothing() -> None:
    service = _service(1, admit_after=1)
    _pull(service, np.array([1, 2, 3], dtype=np.int64), create=True)
    grads = np.ones((3, 2), np.float32)
    service.push(Frame({"grads": [["emb/part_0", "sparse"]], "step": True},
                       {"i/emb/part_0": np.array([1, 2, 3], dtype=np.int64), "g/emb/part_0": grads}))
    meta, arrays = service.handlers()["SaveShard"](Frame({"path": None}, {}))
    (part,) = meta["partitions"]
    assert part["rows"] == 3 and part["slots"] == ["accumulator"] and "ids" in part["dynamic"]
    tensors = safetensors_load(arrays["shard"].tobytes())
    np.testing.assert_array_equal(tensors["emb/part_0@ids"], [1, 2, 3])
    snapshot = {"ids": tensors["emb/part_0@ids"], "values": tensors["emb/part_0"],
                "slot/accumulator": tensors["emb/part_0:accumulator"], "last_step": tensors["emb/part_0@last_step"],
                "frequency": tensors["emb/part_0@frequency"], "step": tensors["emb/part_0@step"]}
    fresh = _service(1)
    load = fresh.handlers()["LoadShard"]
    bad = {f"d/emb/part_0/{k}": v for k, v in snapshot.items()}
    bad["d/emb/part_0/ids"] = np.array([3, 2, 1], dtype=np.int64)
    with pytest.raises(InvalidRequest, match=r"dynamic table 'emb': snapshot: ids must be strictly increasing"):
        load(Frame({"parts": ["emb/part_0"]}, bad))
    assert len(fresh.store.get("emb/part_0").table or []) == 0
    load(Frame({"parts": ["emb/part_0"]}, {f"d/emb/part_0/{k}": v for k, v in snapshot.items()}))
    np.testing.assert_array_equal(_pull(fresh, np.array([1, 2, 3], dtype=np.int64), create=False), tensors["emb/part_0"])
