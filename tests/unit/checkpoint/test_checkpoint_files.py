"""Pointer, manifest and retention of CheckpointManager, with the ps side called directly (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.variables import read_variables
from psflow.cluster import ClusterSpec
from psflow.errors import CheckpointError
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, fixed_size_partitioner, replica_device_setter
from psflow.ps.service import ParameterService
from psflow.rpc.api import ConnectConfig, InvalidRequest
from psflow.rpc.framing import Frame, decode, encode

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
ADAGRAD = OptimizerSpec("adagrad", {"learning_rate": 0.5})


def _layout() -> list[Any]:
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("w", (10, 2), partitioner=fixed_size_partitioner(2), initializer={"name": "constant", "value": 1.0})
    vs.get_variable("b", (1,))
    return vs.placements()


class _Call:
    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def result(self) -> Frame:
        return self.frame


class _Channel:
    """Calls a ParameterService handler through the real frame encoding."""

    def __init__(self, svc: ParameterService) -> None:
        self.svc, self.handlers, self.task = svc, svc.handlers(), svc.task_name

    def call_async(self, method: str, meta: Any = None, arrays: Any = None, **kw: Any) -> _Call:
        out_meta, out_arrays = self.handlers[method](decode(encode(meta or {}, arrays or {})))
        return _Call(decode(encode(out_meta, out_arrays)))

    def call(self, method: str, meta: Any = None, arrays: Any = None, **kw: Any) -> Frame:
        return self.call_async(method, meta, arrays).result()


class _Client:
    def __init__(self) -> None:
        self.layout = {p.var.name: p for p in _layout()}
        self.cluster, self.client_name, self.step_task = CLUSTER, "chief", 0
        self.config = ConnectConfig()  # its rpc_timeout: the deadline a LoadShard carries
        self.services = [ParameterService(i, holds_global_step=i == 0) for i in (0, 1)]
        self.channels = {i: _Channel(s) for i, s in enumerate(self.services)}
        meta = {"layout": [p.to_json() for p in self.layout.values()], "optimizer": ADAGRAD.to_json(), "chief": True}
        for ch in self.channels.values():
            ch.call("Register", meta)

    def global_step(self) -> int:
        gs = self.services[0].global_step
        return gs.value if gs is not None else 0

    def call_async(self, task: int, request: Any, **kw: Any) -> _Call:
        frame = request.to_frame()
        return self.channels[task].call_async(request.METHOD, frame.meta, frame.arrays)

    def call(self, task: int, request: Any, **kw: Any) -> Frame:
        return self.call_async(task, request).result()


def test_save_pointer_retention_and_crash(tmp_path: Path) -> None:
    client = _Client()
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
    client = _Client()
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
