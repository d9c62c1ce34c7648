"""Pointer, manifest and retention of CheckpointManager, with the ps side called directly (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from framed_ps import FramedPs

from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.variables import read_variables
from psflow.cluster import ClusterSpec
from psflow.errors import CheckpointError
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.service import ParameterService
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
ADAGRAD = OptimizerSpec("adagrad", {"learning_rate": 0.5})


def _layout() -> list[Any]:
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("w", (10, 2), partitioner=fixed_size_partitioner(2), initializer={"name": "constant", "value": 1.0})
    vs.get_variable("b", (1,))
    return vs.placements()


def _client() -> FramedPs:
    return FramedPs(CLUSTER, _layout(), ADAGRAD)


def test_save_pointer_retention_and_crash(tmp_path: Path) -> None:
    client = _client()
    phases: list[str] = []
    manager = CheckpointManager(str(tmp_path), max_to_keep=2, fault=phases.append)
    paths = []
    for _ in range(3):
        assert client.services[0].global_step is not None
        client.services[0].global_step.increment()
        paths.append(manager.save(client).path)  # type: ignore[arg-type]
    assert phases == ["writer_written", "shards_written", "manifest_written"] * 3
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == [Path(p).name for p in paths[1:]]
    pointer = json.loads((tmp_path / "checkpoint").read_text())
    assert pointer["latest"] == Path(paths[2]).name and pointer["global_step"] == 3
    values = read_variables(paths[2], slots=True)
    np.testing.assert_array_equal(values["w"], np.ones((10, 2), np.float32))
    assert set(values) == {"w", "w:accumulator", "b", "b:accumulator"}

    def crash(phase: str) -> None:
        if phase == "shards_written":
            raise KeyboardInterrupt  # stands in for the process dying here

    with pytest.raises(KeyboardInterrupt):
        client.services[0].global_step.increment()  # type: ignore[union-attr]
        CheckpointManager(str(tmp_path), max_to_keep=2, fault=crash).save(client)  # type: ignore[arg-type]
    assert latest_checkpoint(str(tmp_path)) == paths[2]
    (tmp_path / "checkpoint").unlink()  # without the pointer, the newest complete one is found
    assert latest_checkpoint(str(tmp_path)) == paths[2]


def test_damaged_shard_and_bad_load_are_refused(tmp_path: Path) -> None:
    client = _client()
    path = CheckpointManager(str(tmp_path)).save(client).path  # type: ignore[arg-type]
    shard = next(Path(path).glob("shard-*"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="sha256"):
        read_variables(path)
    svc = client.services[0]
    before = svc.store.get("w/part_0").value.copy()
    with pytest.raises(InvalidRequest, match="variable 'w' partition 0.*shape"):
        svc.handlers()["LoadShard"](Frame({"parts": ["w/part_0"]}, {"v/w/part_0": np.zeros((3, 2), np.float32)}))
    np.testing.assert_array_equal(svc.store.get("w/part_0").value, before)


def test_non_chief_register_is_not_ready_until_the_chief_registers() -> None:
    svc = ParameterService(0, holds_global_step=True)
    meta = {"layout": [p.to_json() for p in _layout()], "optimizer": ADAGRAD.to_json(), "client": "w1"}
    assert svc.register(Frame(dict(meta)))[0] == {"created": False, "ready": False, "init_count": 0}
    assert svc.register(Frame(dict(meta, chief=True, defer_ready=True)))[0]["ready"] is False
    assert svc.register(Frame(dict(meta)))[0]["ready"] is False
    svc.handlers()["SetReady"](Frame({}))
    assert svc.register(Frame(dict(meta)))[0] == {"created": False, "ready": True, "init_count": 1}
