"""ps tasks as ParameterServices in this process, each call through the real frame encoding (encoded and decoded
both ways, as over a socket, but with no socket), behind the calling surface of a ParameterClient that
CheckpointManager, restore and warm_start use: the shared set-up of the checkpoint unit tests
(tests/unit/checkpoint/test_checkpoint_files.py, test_incremental.py, test_lazy_checkpoint.py), and their comparison of
read-back arrays, bit for bit (:func:`same_arrays`).

A handler's error is raised as the handler raised it (an InvalidRequest, not an RpcError): the tests match its
message. For a ParameterClient itself over in-process channels, see tests/two_ps_in_process.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariablePlacement
from psflow.ps.protocol import StatsReply
from psflow.ps.service import ParameterService
from psflow.rpc.api import ConnectConfig
from psflow.rpc.framing import Frame, decode, encode


def ps_cluster(num_ps: int) -> ClusterSpec:
    """A cluster of ``num_ps`` ps tasks at addresses nothing listens on (the services are in this process)."""
    return ClusterSpec({"ps": [f"127.0.0.1:{i + 1}" for i in range(num_ps)]})


class Done:
    """A call that has finished (a PendingCall's ``result``)."""

    def __init__(self, frame: Frame) -> None:
        self.frame = frame

    def result(self) -> Frame:
        return self.frame


class FramedChannel:
    """Calls one ParameterService's handlers (a TaskChannel's ``call``, ``call_async`` and ``task``)."""

    def __init__(self, svc: ParameterService) -> None:
        self.svc, self.handlers, self.task = svc, svc.handlers(), svc.task_name

    def call_async(self, method: str, meta: Any = None, arrays: Any = None, **kw: Any) -> Done:
        out_meta, out_arrays = self.handlers[method](decode(encode(meta or {}, arrays or {})))
        return Done(decode(encode(out_meta, out_arrays)))

    def call(self, method: str, meta: Any = None, arrays: Any = None, **kw: Any) -> Frame:
        return self.call_async(method, meta, arrays).result()


class FramedPs:
    """The chief's client of ``cluster``'s ps tasks (fresh services; task 0 holds global_step), registered with
    ``placements`` and ``optimizer``."""

    def __init__(self, cluster: ClusterSpec, placements: Sequence[VariablePlacement],
                 optimizer: OptimizerSpec) -> None:
        self.cluster, self.client_name, self.step_task = cluster, "chief", 0
        self.layout = {p.var.name: p for p in placements}
        self.config = ConnectConfig()  # its rpc_timeout: the deadline a LoadShard carries
        self.services = [ParameterService(i, holds_global_step=i == 0) for i in range(cluster.num_tasks("ps"))]
        self.channels = {i: FramedChannel(s) for i, s in enumerate(self.services)}
        meta = {"layout": [p.to_json() for p in self.layout.values()], "optimizer": optimizer.to_json(), "chief": True}
        for channel in self.channels.values():
            channel.call("Register", meta)

    def global_step(self) -> int:
        gs = self.services[0].global_step
        return gs.value if gs is not None else 0

    def ps_stats(self, task: int | None = None, **kw: Any) -> StatsReply:
        """ps task ``task``'s ``Stats`` (default: task 0), as ParameterClient.ps_stats (a save asks it before its
        pointer switch: psflow/checkpoint/publish_checks.py)."""
        return StatsReply.from_frame(self.channels[self.step_task if task is None else task].call("Stats"))

    def call_async(self, task: int, request: Any, **kw: Any) -> Done:
        frame = request.to_frame()
        return self.channels[task].call_async(request.METHOD, frame.meta, frame.arrays)

    def call(self, task: int, request: Any, **kw: Any) -> Frame:
        return self.call_async(task, request).result()


def same_arrays(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> None:
    """Asserts that ``a`` and ``b`` hold the same names, each of the same dtype, shape and bytes."""
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name
