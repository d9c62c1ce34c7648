"""In-graph replication: one client drives every worker task (the worker's side and the client's face).

The client (one process, which also reads all the data and holds the chief
duties: :mod:`psflow.train.in_graph_client`) splits each batch into one slice
per worker and asks each worker task, over gRPC, to run a step on its slice
(:class:`Session`). Every worker builds the run's model from its own config
(:func:`psflow.train.build.build_model`), so only the batch's arrays travel.
The step's code is named by an import path (``module:function``) that the
worker resolves only from its allowlist (:data:`BUILTIN_STEPS`:
:func:`model_step`, the model's own step, plus what its config adds); no code
or pickle ever crosses the wire.

A worker pulls and computes, and returns its gradient
(:func:`psflow.train.step.compute_gradients`); the client pushes (in
``async`` mode each slice's gradient, one step each; in ``sync`` mode the
average of the W gradients, each weighted by its slice's share of the batch,
once: N workers of batch b = one process with batch N·b, the epoch's last,
uneven batch included; not with a clip norm: each worker clips its own
slice's gradient first, as a between-graph sync worker does). So a step the client runs again
on a restarted worker is pushed once. ``RunStep`` with ``push`` set has the
worker push itself (:class:`Session` users; the client does not).
``ssp`` is a between-graph mode only.

The worker side is :class:`StepService` (``RunStep`` on the WorkerService of a
worker task started with ``replication="in-graph"``).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from psflow.cluster import ClusterSpec
from psflow.data import Batch, SparseColumn
from psflow.gradients import DenseGradient, Gradients, SparseGradient
from psflow.models.api import Model
from psflow.native.ids import unique_inverse
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import RunStepReply, RunStepRequest
from psflow.rpc.api import WORKER_SERVICE, ConnectConfig, InvalidRequest, PreconditionFailed, Reply, RpcError
from psflow.rpc.framing import Frame
from psflow.rpc.grpc_client import TaskChannel
from psflow.rpc.tls import TlsConfig
from psflow.train.build import build_model
from psflow.train.config import TrainConfig
from psflow.train.step import compute_gradients

__all__ = ["BUILTIN_STEPS", "Session", "StepService", "StepFnOutput", "average_gradients", "model_step"]

log = logging.getLogger("psflow.in_graph")


@dataclass
class StepFnOutput:
    """What an in-graph step function (:data:`StepFn`) returns on the worker task: the batch's loss, the model's
    outputs, its gradients and the global_step its pull read (sent back in a RunStep reply)."""

    loss: float
    outputs: Mapping[str, np.ndarray]
    grads: Gradients
    read_step: int | None


def model_step(model: Model, client: ParameterClient, batch: Batch) -> StepFnOutput:
    """The built-in step: the run's model on ``batch`` (prepare, pull, compute; no push)."""
    output, read_step = compute_gradients(model, client, batch)
    return StepFnOutput(output.loss, output.outputs, output.gradients, read_step)


StepFn = Callable[[Model, ParameterClient, Batch], StepFnOutput]

#: Step functions every worker accepts, by import path.
BUILTIN_STEPS = ("psflow.train.in_graph:model_step",)


def _resolve(path: str, allowed: Sequence[str]) -> StepFn:
    if path not in allowed:
        raise InvalidRequest(f"step function {path!r} is not allowed on this worker (allowed: {', '.join(allowed)})")
    module, _, name = path.partition(":")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise InvalidRequest(f"step function {path!r} does not exist")
    return fn  # type: ignore[no-any-return]


def _request(step_fn: str, batch: Batch, push: bool) -> RunStepRequest:
    """The RunStep request running ``step_fn`` on ``batch``."""
    return RunStepRequest(step_fn, push, batch.labels,
                          {n: (c.indptr, c.ids, c.values) for n, c in batch.sparse.items()}, dict(batch.dense))


def _batch_from(request: RunStepRequest) -> Batch:
    """The batch of a RunStep request, checked."""
    try:
        batch = Batch(np.asarray(request.labels, np.float32),
                      {n: SparseColumn(np.asarray(indptr, np.int64), np.asarray(ids, np.int64),
                                       np.asarray(values, np.float32))
                       for n, (indptr, ids, values) in request.sparse.items()},
                      {n: np.asarray(value) for n, value in request.dense.items()})
        batch.validate()
    except ValueError as e:
        raise InvalidRequest(f"bad batch: {e}") from e
    return batch


def _encode_grads(grads: Gradients) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    return {name: (g.values, g.rows if isinstance(g, SparseGradient) else None) for name, g in grads.items()}


def _decode_grads(reply: RunStepReply) -> Gradients:
    return {name: DenseGradient(values) if rows is None else SparseGradient(rows, values)
            for name, (values, rows) in reply.grads.items()}


class StepService:
    """``RunStep`` on a worker task: runs a named step on a batch slice.

    Its client's channels to the ps tasks carry ``token`` and use ``tls`` (``None``: plain text).
    """

    def __init__(self, config: TrainConfig, cluster: ClusterSpec, task_index: int, *, token: str | None,
                 tls: TlsConfig | None = None) -> None:
        self.config, self.cluster, self.task_index, self.token, self.tls = config, cluster, task_index, token, tls
        self.allowed = tuple(BUILTIN_STEPS) + tuple(config.sync.allowed_steps)
        self._lock = threading.Lock()
        self._state: tuple[Model, ParameterClient] | None = None

    def _connected(self) -> tuple[Model, ParameterClient]:
        with self._lock:
            if self._state is None:
                model, variables = build_model(self.config, self.cluster)
                client = ParameterClient(
                    self.cluster, variables.placements(), client_name=f"/job:worker/task:{self.task_index}",
                    config=ConnectConfig(connect_timeout=self.config.cluster.connect_timeout,
                                         rpc_timeout=self.config.cluster.rpc_timeout,
                                         save_timeout=self.config.cluster.save_timeout, token=self.token, tls=self.tls,
                                         transport=self.config.cluster.transport),
                    failover_timeout=self.config.cluster.ps_failover_timeout)
                client.connect()
                self._state = (model, client)
            return self._state

    def run_step(self, frame: Frame) -> Reply:
        request = RunStepRequest.from_frame(frame)
        fn = _resolve(request.step_fn, self.allowed)
        batch = _batch_from(request)
        model, client = self._connected()
        try:
            out = fn(model, client, batch)
            push = client.push_detailed(out.grads, examples=batch.num_examples, loss=out.loss,
                                        read_step=out.read_step) if request.push else None
        except RpcError as e:  # a ps task failed: the client's error to act on, told in one line (no traceback)
            log.warning("/job:worker/task:%d: RunStep: %s", self.task_index, e)
            raise PreconditionFailed(str(e)) from e
        if push is not None:
            reply = RunStepReply(out.loss, out.read_step, push.step, out.outputs)
        else:
            reply = RunStepReply(out.loss, out.read_step, None, out.outputs, _encode_grads(out.grads))
        wire = reply.to_frame()
        return wire.meta, wire.arrays

    def handlers(self) -> dict[str, Callable[[Frame], Reply]]:
        return {RunStepRequest.METHOD: self.run_step}


class Session:
    """A client's connection to one worker task: ``Session("grpc://host:port")``.

    :meth:`run` blocks until the worker finished the step; :meth:`run_async`
    returns a handle whose ``result()`` blocks.
    """

    def __init__(self, target: str, *, task: str | None = None, config: ConnectConfig | None = None) -> None:
        address = target.removeprefix("grpc://")
        self.task = task or target
        self._channel = TaskChannel(self.task, address, WORKER_SERVICE, config or ConnectConfig())

    def connect(self, timeout: float | None = None) -> None:
        self._channel.wait_ready(timeout)

    def run_async(self, step_fn: str, batch: Batch, *, push: bool) -> Callable[[], tuple[RunStepReply, Gradients]]:
        request = _request(step_fn, batch, push).to_frame()
        call = self._channel.call_async(RunStepRequest.METHOD, request.meta, request.arrays)

        def result() -> tuple[RunStepReply, Gradients]:
            reply = RunStepReply.from_frame(call.result())
            return reply, _decode_grads(reply)

        return result

    def run(self, step_fn: str, batch: Batch, *, push: bool) -> tuple[RunStepReply, Gradients]:
        """Runs ``step_fn`` on ``batch`` on this worker; see :class:`StepService`."""
        return self.run_async(step_fn, batch, push=push)()

    def reconnect(self) -> None:
        """A fresh channel to the worker (after it failed: a restarted worker is tried at the next call)."""
        self._channel.reconnect()

    def close(self) -> None:
        self._channel.close()


def average_gradients(all_grads: Sequence[Gradients], weights: Sequence[int] | None = None) -> Gradients:
    """Mean of the workers' gradients; sparse rows summed over workers, then divided by their number.

    ``weights`` (the examples of each worker's slice): each gradient, the mean over its slice, counts by its
    share of the batch, so the result is the gradient of one process on the whole batch (an epoch's last batch
    splits unevenly); equal weights, or none, give the plain mean.
    """
    n = len(all_grads)
    shares = None
    if weights is not None and len(set(weights)) > 1:
        shares = [float(w) / float(sum(weights)) for w in weights]

    def combined(arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        values = [np.asarray(a, np.float64) for a in arrays]
        return values if shares is None else [v * (share * n) for v, share in zip(values, shares, strict=True)]

    out: dict[str, DenseGradient | SparseGradient] = {}
    for name in all_grads[0]:
        parts = [g[name] for g in all_grads]
        if isinstance(parts[0], DenseGradient):
            total = np.sum(combined([p.values for p in parts]), axis=0)
            out[name] = DenseGradient((total / n).astype(np.float32))
            continue
        rows = np.concatenate([p.rows for p in parts if isinstance(p, SparseGradient)])
        values = np.concatenate(combined([p.values for p in parts]))
        uniq, inverse = unique_inverse(rows)
        summed = np.zeros((uniq.size, *values.shape[1:]), np.float64)
        np.add.at(summed, inverse, values)
        out[name] = SparseGradient(uniq, (summed / n).astype(np.float32))
    return out
