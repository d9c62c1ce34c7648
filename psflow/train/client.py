"""ParameterClient: a worker's view of the variables on the ps tasks.

Per call, at most one RPC goes to each ps task: the variables (and
partitions) a task holds travel together, and the RPCs to different tasks are
in flight at the same time.

Guarantees:
    * :meth:`ParameterClient.pull` returns values for exactly the ids asked
      for, in the order asked, fetched only from the partitions holding them.
    * :meth:`ParameterClient.push` returns after every ps task that holds a
      pushed variable applied its part; the returned global_step is the value
      this push produced (unique across all workers). A push is never retried:
      retrying could apply it twice.
    * :meth:`ParameterClient.register` is idempotent; it goes to ps task 0
      first, which decides whether this client's layout agrees with the
      registered one (so two clients never split the tasks between them).

Not thread-safe: one client per training thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psflow.cluster import ClusterSpec
from psflow.data.unique import scan_ids
from psflow.errors import PsError
from psflow.gradients import DenseGradient, SparseGradient
from psflow.placement import PlacementError, RoutedRows, VariablePlacement
from psflow.ps.optimizers import OptimizerSpec
from psflow.ps.protocol import (
    DoneRequest,
    GradPart,
    LeaveRequest,
    PullReply,
    PullRequest,
    PushPullReply,
    PushPullRequest,
    PushReply,
    PushRequest,
    ReaderPositionsReply,
    ReaderPositionsRequest,
    RegisterReply,
    RegisterRequest,
    Request,
    StatsReply,
    StepTag,
    WorkerTag,
)
from psflow.ps.store import partition_key
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import (
    PARAMETER_SERVICE,
    Channel,
    ConnectConfig,
    DeadlineExceededError,
    PendingReply,
    RpcError,
    TaskUnavailableError,
    gather,
)
from psflow.rpc.framing import Frame
from psflow.rpc.registry import open_channel

__all__ = ["ParameterClient", "ClientError", "PushResult"]

log = logging.getLogger(__name__)


class ClientError(PsError, ValueError):
    """A call names an unknown variable or passes arrays of the wrong shape."""


#: Scatter marker: the partition's answer holds every requested id, in request order.
_IN_ORDER = slice(None)


def _covers(routes: Sequence[RoutedRows], ids: np.ndarray) -> bool:
    """True if one partition holds all of ``ids`` (its positions are then 0..n-1, ascending)."""
    return len(routes) == 1 and routes[0].positions.size == ids.shape[0]


def _ids(placement: VariablePlacement, ids: Any, what: str) -> np.ndarray:
    """``ids`` as int64; a dynamic table's ids must already be int64 (a cast could change them silently)."""
    if placement.is_dynamic:
        arr = np.asarray(ids)
        if arr.dtype != np.int64:
            raise PlacementError(f"dynamic table {placement.var.name!r}: {what} ids must be int64 (any value; view uint64 "
                                 f"hashes as int64), got {arr.dtype}")
        return arr
    return np.asarray(ids, dtype=np.int64)


def _check_table_gradient(client: str, placement: VariablePlacement, rows: np.ndarray, values: np.ndarray) -> None:
    """Raises ClientError, naming the table, unless ``values`` holds one finite row of the table's width per id."""
    name, dim = placement.var.name, placement.var.shape[1]
    if values.shape != (rows.shape[0], dim):
        raise ClientError(f"{client}: dynamic table {name!r}: sparse gradient for {rows.shape[0]} ids must have shape "
                          f"({rows.shape[0]}, {dim}); got {values.shape}")
    finite = np.isfinite(values).all(axis=1)
    if not finite.all():
        raise ClientError(f"{client}: dynamic table {name!r}: the gradient of id {int(rows[np.flatnonzero(~finite)[0]])} "
                          f"is not finite")


@dataclass
class _PullPlan:
    """One pull, split by ps task: what to ask each task and how to put the answers back."""

    per_task: dict[int, list[tuple[str, np.ndarray | None]]]  # ps task -> (partition key, local rows or None)
    # (name, partition key, positions): None = a whole variable, IN_ORDER = every id, in order, from this partition
    scatter: list[tuple[str, str, np.ndarray | slice | None]] = field(default_factory=list)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    empty: list[str] = field(default_factory=list)  # lookups of no ids: no partition is asked, the answer is empty


@dataclass(frozen=True)
class _Whole:
    """A whole variable's request fields (:attr:`ParameterClient._whole`)."""

    task: int
    key: str
    num_rows: int
    row_shape: tuple[int, ...]
    dtype: np.dtype[Any]
    shape: tuple[int, ...]  # (num_rows, *row_shape)


@dataclass(frozen=True)
class PushResult:
    """What a push produced.

    Attributes:
        step: the global_step value this push produced (async, ssp), or the
            step its aggregated update produced (sync).
        accepted: False when the gradient was stale and dropped (sync).
        completed: True for the one push per step that owns ``step`` (in sync
            mode: the push that completed the aggregation; otherwise always).
        min_clock: the slowest live worker's clock when this one was let go (ssp).
    """

    step: int
    accepted: bool = True
    completed: bool = True
    min_clock: int | None = None


class ParameterClient:
    """Connects a client (worker, chief or launcher) to every ps task."""

    def __init__(
        self,
        cluster: ClusterSpec,
        layout: Sequence[VariablePlacement],
        *,
        client_name: str,
        config: ConnectConfig | None = None,
        sync: SyncConfig | None = None,
        channels: Mapping[int, Channel] | None = None,
    ) -> None:
        """Opens channels to the ps tasks (lazily; see :meth:`connect`).

        Args:
            cluster: the cluster; its ``ps`` job holds the variables.
            layout: every variable's placement, as the model declared them.
            client_name: this client's task name, used in logs and errors.
            config: timeouts, backoff and token.
            sync: how updates are coordinated (default: asynchronous).
            channels: ps task -> channel, to use instead of channels of the carrier
                ``config.transport`` names (:func:`psflow.rpc.registry.open_channel`), e.g.
                :class:`~psflow.rpc.inprocess.InProcessChannel` for a run in one process.

        Raises:
            ConfigError: ``config.transport`` names no carrier, or asks for what it
                cannot do (TLS over tcp).
        """
        self.sync = sync or SyncConfig()
        #: global_step read by the latest pull (the step its values belong to).
        self.last_pull_step: int | None = None
        # The newest global_step this client heard of (pulls and pushes): sent with its requests as
        # "step_hint", the clock of the dynamic tables on ps tasks that do not hold global_step.
        self._step_hint: int | None = None
        #: ReaderPosition JSON sent with each push to the task holding global_step
        #: (the chief records it in checkpoints; None: not sent).
        self.reader_position: str | None = None
        #: The cluster's restore generation this client trains in (sent with each push; a ps task
        #: refuses pushes of another generation, see psflow.ps.service). None: not sent.
        self.generation: int | None = None
        #: This client's process, sent with every push and ReaderPositions request: a ps task refuses
        #: pushes of an earlier process of the same client (psflow.ps.service, Incarnations).
        self.incarnation = time.time_ns()
        self.cluster = cluster
        self.layout = {p.var.name: p for p in layout}
        # Whole (unpartitioned, static, non-scalar) variables, the common case: the fields a request needs,
        # computed once instead of on each of the ~100 lookups and gradients of a step.
        self._whole: dict[str, _Whole] = {}
        for p in layout:
            if len(p.partitions) == 1 and p.var.shape and not p.is_dynamic:
                key = partition_key(p.var.name, 0)
                self._whole[p.var.name] = _Whole(p.partitions[0].task, key, p.num_rows, tuple(p.var.shape[1:]),
                                                 np.dtype(p.var.dtype), (p.num_rows, *p.var.shape[1:]))
        self.client_name = client_name
        self.config = config or ConnectConfig()
        ps = cluster.task_indices("ps")
        self.step_task = min(ps)
        self.channels: dict[int, Channel] = dict(channels) if channels is not None else {
            i: open_channel(self.config.transport, f"/job:ps/task:{i}", cluster.task_address("ps", i),
                            PARAMETER_SERVICE, self.config)
            for i in ps
        }

    # ---- set-up ------------------------------------------------------------
    def connect(self, timeout: float | None = None) -> None:
        """Waits until every ps task is up (bounded; see ConnectConfig).

        Raises:
            TaskUnavailableError: a task did not come up in time (names it).
        """
        with futures.ThreadPoolExecutor(len(self.channels)) as pool:
            for f in [pool.submit(ch.wait_ready, timeout) for ch in self.channels.values()]:
                f.result()

    def register(self, optimizer: OptimizerSpec, *, chief: bool = False, defer_ready: bool = False,
                 ready_timeout: float | None = None) -> bool:
        """Registers the layout and optimizer on every ps task (ps 0 first).

        Only the chief initializes (see :mod:`psflow.ps.service`, ``Register``).
        A non-chief client blocks until the chief has initialized (or
        restored) every ps task, asking again with exponential backoff
        (``backoff_initial`` .. ``backoff_max``); it never sleeps a fixed time.

        Args:
            optimizer: the model's optimizer.
            chief: this client is the chief: it creates the variables on
                tasks that are not ready yet.
            defer_ready: (chief) leave the tasks not ready; the chief restores
                a checkpoint and then sends ``SetReady``.
            ready_timeout: seconds a non-chief waits (default ``connect_timeout``).

        Returns:
            True if this call created the variables on ps task 0.

        Raises:
            FailedPreconditionError: another client registered a different layout.
            TaskUnavailableError: (non-chief) the ps tasks were not ready in time.
        """
        meta = RegisterRequest(tuple(self.layout.values()), optimizer, self.sync, self.client_name, chief,
                               defer_ready).to_frame().meta
        limit = self.config.connect_timeout if ready_timeout is None else ready_timeout
        deadline, wait, attempt = time.monotonic() + limit, self.config.backoff_initial, 0
        while True:
            first = RegisterReply.from_frame(self.channels[self.step_task].call(RegisterRequest.METHOD, meta))
            others = {i: ch.call_async(RegisterRequest.METHOD, meta) for i, ch in self.channels.items()
                      if i != self.step_task}
            ready = {self.step_task: first.ready}
            ready.update({i: RegisterReply.from_frame(reply).ready for i, reply in gather(others).items()})
            if chief or all(ready.values()):
                return first.created
            waiting = [self.channels[i].task for i, ok in sorted(ready.items()) if not ok]
            attempt += 1
            if time.monotonic() + wait > deadline:
                raise TaskUnavailableError(f"{self.client_name}: {', '.join(waiting)} not initialized by the chief "
                                           f"after {limit:.1f} s ({attempt} attempts)")
            if attempt % 10 == 0:
                log.info("%s: waiting for the chief to initialize %s (attempt %d)", self.client_name,
                         ", ".join(waiting), attempt)
            time.sleep(wait)
            wait = min(wait * 2, self.config.backoff_max)

    # ---- data path ---------------------------------------------------------
    def _placement(self, name: str) -> VariablePlacement:
        p = self.layout.get(name)
        if p is None:
            raise ClientError(f"{self.client_name}: unknown variable {name!r} (known: {', '.join(self.layout)})")
        return p

    def pull(self, requests: Mapping[str, np.ndarray | None], *, create: bool = False,
             averages: bool = False) -> dict[str, np.ndarray]:
        """Fetches rows (or whole variables) from the ps tasks.

        Args:
            requests: variable name -> int64 ids (global rows; any id of a
                dynamic table), or ``None`` for the whole variable.
            create: a training lookup: dynamic tables count the ids' sightings
                and create the rows of admitted ids. False (evaluation,
                prediction): nothing changes on the ps tasks; an id without a
                row reads as zeros.
            averages: read each averaged variable's moving average
                (:mod:`psflow.ps.averages`) instead of its value (evaluation).

        Returns:
            variable name -> array of ``len(ids)`` rows (or the whole variable).

        Raises:
            ClientError: unknown variable; PlacementError: ids out of range;
            RpcError: a ps task refused or failed.
        """
        plan = self._pull_plan(requests)
        calls = {t: self._send(t, PullRequest(parts, create, averages, self._step_hint))
                 for t, parts in plan.per_task.items()}
        return self._assemble(plan, {t: PullReply.from_frame(frame) for t, frame in gather(calls).items()})

    def push(
        self,
        grads: Mapping[str, DenseGradient | SparseGradient],
        *,
        examples: int = 0,
        loss: float | None = None,
    ) -> int:
        """Sends gradients; returns the global_step they produced (see :meth:`push_detailed`)."""
        return self.push_detailed(grads, examples=examples, loss=loss).step

    def push_detailed(
        self,
        grads: Mapping[str, DenseGradient | SparseGradient],
        *,
        examples: int = 0,
        loss: float | None = None,
        read_step: int | None = None,
        clock: int | None = None,
    ) -> PushResult:
        """Sends gradients; the ps tasks apply their optimizer to them.

        Asynchronous mode: blocks until every owning ps task applied its part.
        Sync mode: the push goes to every ps task (so each counts one
        contribution per worker per step) tagged with ``read_step``, and
        blocks until the step is applied (or the gradient is found stale).
        SSP mode: blocks while this worker is more than ``staleness`` steps
        ahead of the slowest live one. Never retried.

        Args:
            grads: variable name -> gradient.
            examples: examples this gradient was computed from (for rates).
            loss: the batch's loss (for progress lines).
            read_step: the step of the parameters the gradient was computed
                from (default: :attr:`last_pull_step`); required in sync mode.
            clock: this worker's completed iterations, including this one (ssp).

        Returns:
            See :class:`PushResult`.

        Raises:
            ClientError, PlacementError: bad names, shapes or rows (nothing sent).
            RpcError: a ps task refused or failed (in sync mode: the step
                timed out, naming the missing workers).
        """
        per_task = self._push_plan(grads, examples, loss, read_step, clock)
        calls = {t: self._send(t, request, timeout=self._push_timeout()) for t, request in per_task.items()}
        return self._push_result({t: PushReply.from_frame(frame) for t, frame in gather(calls).items()})

    def push_pull(
        self,
        grads: Mapping[str, DenseGradient | SparseGradient],
        requests: Mapping[str, np.ndarray | None],
        *,
        examples: int = 0,
        loss: float | None = None,
        read_step: int | None = None,
        clock: int | None = None,
    ) -> tuple[PushResult, dict[str, np.ndarray]]:
        """Pushes this step's gradients and pulls the next step's rows in one RPC per ps task.

        Each ps task applies the push first and then reads the rows, so the
        values are exactly what a :meth:`push_detailed` followed by a
        :meth:`pull` would return (no extra staleness), with half the round
        trips. Same blocking, ordering and errors as those two calls; the pull
        part is validated before anything is applied. Never retried. The pull
        is a training lookup (``create=True``, see :meth:`pull`).

        Returns:
            The push's result and the pulled values (as :meth:`pull` returns them).
        """
        plan = self._pull_plan(requests)
        pushes = self._push_plan(grads, examples, loss, read_step, clock)
        calls = {}
        for task in sorted(set(plan.per_task) | set(pushes)):
            push = pushes.get(task) or PushRequest((), WorkerTag(self.client_name))
            pull = PullRequest(plan.per_task.get(task, ()), create=True, step_hint=self._step_hint)
            calls[task] = self._send(task, PushPullRequest(push, pull), timeout=self._push_timeout())
        replies = {t: PushPullReply.from_frame(frame) for t, frame in gather(calls).items()}
        result = self._push_result({t: r.push for t, r in replies.items() if t in pushes})
        return result, self._assemble(plan, {t: r.pull for t, r in replies.items()})

    # ---- request building --------------------------------------------------
    def _pull_plan(self, requests: Mapping[str, np.ndarray | None]) -> _PullPlan:
        # In sync and ssp mode ps task 0 is always asked: its reply carries the step the
        # values belong to. In async mode a lookup goes only to the tasks holding the ids.
        plan = _PullPlan({self.step_task: []} if self.sync.mode != "async" else {})
        for name, ids in requests.items():
            fast = self._whole.get(name)
            if (fast is not None and type(ids) is np.ndarray and ids.dtype == np.int64 and ids.ndim == 1
                    and scan_ids(ids, fast.num_rows)[0] < 0):
                # A whole table, int64 ids in range: what route() would give, without building it.
                plan.shapes[name] = (ids.shape[0], *fast.row_shape)
                if not ids.shape[0]:
                    plan.empty.append(name)
                else:
                    local = ids.view()
                    local.flags.writeable = False
                    plan.per_task.setdefault(fast.task, []).append((fast.key, local))
                    plan.scatter.append((name, fast.key, _IN_ORDER))
                continue
            placement = self._placement(name)
            var = placement.var
            if ids is None:
                plan.shapes[name] = tuple(var.shape)
                for part in placement.partitions:
                    key = partition_key(name, part.index)
                    plan.per_task.setdefault(part.task, []).append((key, None))
                    plan.scatter.append((name, key, None))
                continue
            ids = _ids(placement, ids, "lookup")
            plan.shapes[name] = (ids.shape[0], *var.shape[1:])
            routes = placement.route(ids)
            if not routes:
                plan.empty.append(name)
            whole = _covers(routes, ids)
            for routed in routes:
                key = partition_key(name, routed.partition)
                plan.per_task.setdefault(routed.task, []).append((key, routed.local_rows))
                plan.scatter.append((name, key, _IN_ORDER if whole else routed.positions))
        return plan

    def _assemble(self, plan: _PullPlan, replies: Mapping[int, PullReply]) -> dict[str, np.ndarray]:
        step_reply = replies.get(self.step_task)
        step = step_reply.step if step_reply is not None and self.step_task in plan.per_task else None
        self.last_pull_step = step
        self._hear_step(step)
        parts: dict[str, np.ndarray] = {}
        for reply in replies.values():
            parts.update(reply.values)
        out: dict[str, np.ndarray] = {}
        whole: dict[str, list[np.ndarray]] = {}
        for name, key, positions in plan.scatter:
            if positions is None:
                whole.setdefault(name, []).append(parts[key])
                continue
            if isinstance(positions, slice) and parts[key].shape == plan.shapes[name]:
                # One partition answered for every id, in order: no scatter. A read-only array (a view of a
                # received frame) is copied; a writable one is the ps task's own fresh copy (in-process).
                part = parts[key]
                dtype = self.layout[name].var.dtype
                out[name] = part if part.flags.writeable and part.dtype == dtype else np.array(part, dtype=dtype)
                continue
            if name not in out:
                out[name] = np.empty(plan.shapes[name], dtype=self.layout[name].var.dtype)
            out[name][positions] = parts[key]
        for name, pieces in whole.items():
            out[name] = pieces[0].copy() if len(pieces) == 1 else np.concatenate(pieces, axis=0)
        for name in plan.empty:
            out[name] = np.empty(plan.shapes[name], dtype=self.layout[name].var.dtype)
        return out

    def _push_plan(self, grads: Mapping[str, DenseGradient | SparseGradient], examples: int, loss: float | None,
                   read_step: int | None, clock: int | None) -> dict[int, PushRequest]:
        read_step = self.last_pull_step if read_step is None else read_step
        mode = self.sync.mode
        if mode == "sync" and read_step is None:
            raise ClientError(f"{self.client_name}: a sync push needs the step its parameters were pulled at")
        targets = self.channels if mode == "sync" else (self.step_task,)
        per_task: dict[int, list[GradPart]] = {t: [] for t in targets}
        for name, grad in grads.items():
            fast = self._whole.get(name)
            if fast is not None:
                values = grad.values
                if isinstance(grad, SparseGradient):
                    rows = grad.rows
                    if (type(rows) is np.ndarray and rows.dtype == np.int64 and rows.ndim == 1
                            and type(values) is np.ndarray and values.dtype == fast.dtype
                            and scan_ids(rows, fast.num_rows)[0] < 0):
                        # A whole table's gradient, int64 rows in range (the ps checks the values' shape).
                        if rows.shape[0]:
                            local = rows.view()
                            local.flags.writeable = False
                            per_task.setdefault(fast.task, []).append((fast.key, values, local))
                        continue
                elif type(values) is np.ndarray and values.dtype == fast.dtype and values.shape == fast.shape:
                    # A whole variable's dense gradient of its dtype and shape: sent as it is (what the
                    # general path below sends too, without its cast and slice).
                    per_task.setdefault(fast.task, []).append((fast.key, values, None))
                    continue
            placement = self._placement(name)
            if isinstance(grad, DenseGradient):
                values = np.asarray(grad.values, dtype=placement.var.dtype)
                if values.shape != tuple(placement.var.shape):
                    raise ClientError(
                        f"{self.client_name}: variable {name!r} has shape {tuple(placement.var.shape)}; "
                        f"gradient has {values.shape}"
                    )
                for part in placement.partitions:
                    key = partition_key(name, part.index)
                    per_task.setdefault(part.task, []).append((key, values[part.row_start : part.row_stop], None))
                continue
            rows = _ids(placement, grad.rows, "gradient")
            values = np.asarray(grad.values, dtype=placement.var.dtype)
            if placement.is_dynamic:  # checked here, as a whole: each ps task sees only its own ids
                _check_table_gradient(self.client_name, placement, rows, values)
            routes = placement.route(rows)
            whole = _covers(routes, rows)
            for routed in routes:
                key = partition_key(name, routed.partition)
                per_task.setdefault(routed.task, []).append(
                    (key, values if whole else values[routed.positions], routed.local_rows))
        sync_tag = read_step if mode == "sync" else None
        out: dict[int, PushRequest] = {}
        others = [task for task in per_task if task != self.step_task]
        if others:  # sync mode, or variables on other tasks: the same tags for each
            tag = WorkerTag(self.client_name, self.incarnation, self.generation)
            steps = StepTag(sync_tag=sync_tag, step_hint=self._step_hint)
            out.update({task: PushRequest(per_task[task], tag, steps) for task in others})
        if self.step_task in per_task:  # it counts the step: the batch, and the reader position after it
            out[self.step_task] = PushRequest(
                per_task[self.step_task], WorkerTag(self.client_name, self.incarnation, self.generation,
                                                    self.reader_position),
                StepTag(read_step, clock, sync_tag, self._step_hint), True, int(examples),
                None if loss is None else float(loss))
        return out

    def _push_timeout(self) -> float:
        # Sync and ssp pushes may wait for other workers: allow the coordination timeout on top.
        return self.config.rpc_timeout + (self.sync.timeout if self.sync.mode != "async" else 0.0)

    def _push_result(self, replies: Mapping[int, PushReply]) -> PushResult:
        reply = replies[self.step_task]
        if reply.step is None:
            raise ClientError(f"{self.client_name}: {self.channels[self.step_task].task} returned no global_step "
                              "for a push")
        self._hear_step(reply.step)
        return PushResult(reply.step, reply.accepted, reply.completed, reply.min_clock)

    def _hear_step(self, step: int | None) -> None:
        if step is not None and (self._step_hint is None or step > self._step_hint):
            self._step_hint = step

    def _send(self, task: int, request: Request, *, timeout: float | None = None) -> PendingReply:
        frame = request.to_frame()
        return self.channels[task].call_async(request.METHOD, frame.meta, frame.arrays, timeout=timeout)

    def call_async(self, task: int, request: Request, *, timeout: float | None = None) -> PendingReply:
        """Sends ``request`` (a :mod:`psflow.ps.protocol` message) to ps task ``task`` (default deadline:
        ``rpc_timeout``); the reply is read with the request's reply class. Not retried."""
        return self._send(task, request, timeout=timeout)

    def call(self, task: int, request: Request, *, timeout: float | None = None) -> Frame:
        """:meth:`call_async`, waited for.

        Raises:
            RpcError: the task refused or failed (names it).
        """
        return self._send(task, request, timeout=timeout).result()

    def reader_positions(self) -> dict[str, str]:
        """Every client's recorded reader position (JSON), from the task holding global_step; claims
        this client's incarnation there first (pushes of an earlier process are refused from then on)."""
        request = ReaderPositionsRequest(self.client_name, self.incarnation)
        reply = self.channels[self.step_task].call(request.METHOD, request.to_frame().meta)
        return dict(ReaderPositionsReply.from_frame(reply).positions)

    def leave(self) -> None:
        """Tells every ps task this worker is done (sync/ssp stop waiting for it)."""
        request = LeaveRequest(self.client_name)
        calls = {t: ch.call_async(request.METHOD, request.to_frame().meta) for t, ch in self.channels.items()}
        gather(calls)

    def report_done(self, *, checkpoint_dir: bool = False, final_checkpoint: str | None = None,
                    attempts: int = 3) -> list[str]:
        """Tells every ps task that this worker's session ended normally (``Done``, see
        :mod:`psflow.ps.run_end`): a ps task of ``psflow server`` exits once every training worker did.
        ``checkpoint_dir``: the run checkpoints; ``final_checkpoint``: the name of its final checkpoint,
        if this worker sees it (the ps tasks' exit line names it).

        Blocks for at most ``attempts`` rounds of 5 s calls (a task that could not be reached is
        asked again after 0.5 s, 1 s, ...; one that refused is not). Never raises.

        Returns:
            The ps tasks that did not hear it, each logged as a WARNING (they keep serving until stopped).
        """
        meta = DoneRequest(self.client_name, self.incarnation, checkpoint_dir, final_checkpoint).to_frame().meta
        pending = dict(self.channels)  # ps task index -> channel, not yet answered
        errors: dict[int, RpcError] = {}
        for attempt in range(attempts):
            if attempt:
                time.sleep(0.5 * 2 ** (attempt - 1))
            calls = {t: ch.call_async(DoneRequest.METHOD, meta, timeout=5.0) for t, ch in pending.items()}
            for t, call in calls.items():
                try:
                    call.result()
                    errors.pop(t, None)
                    del pending[t]
                except (TaskUnavailableError, DeadlineExceededError) as e:  # asked again
                    errors[t] = e
                except RpcError as e:  # refused: asking again gets the same answer
                    errors[t] = e
                    del pending[t]
            if not pending:
                break
        for t, error in sorted(errors.items()):
            log.warning("%s: %s did not hear that this worker is done (%s); it serves until stopped "
                        "(psflow shutdown)", self.client_name, self.channels[t].task, error)
        return [self.channels[t].task for t in sorted(errors)]

    # ---- control -----------------------------------------------------------
    def stats(self, task: int | None = None) -> dict[str, Any]:
        """State and counters of one ps task (default: the one holding global_step), by name (for display;
        :meth:`ps_stats` gives them typed)."""
        return self.ps_stats(task).as_dict()

    def ps_stats(self, task: int | None = None) -> StatsReply:
        """State and counters of one ps task (default: the one holding global_step)."""
        return StatsReply.from_frame(self.channels[self.step_task if task is None else task].call("Stats"))

    def global_step(self) -> int:
        """The current global_step."""
        step = self.ps_stats().global_step
        if step is None:
            raise ClientError(f"{self.client_name}: {self.channels[self.step_task].task} holds no global_step")
        return step

    def shutdown_servers(self) -> None:
        """Asks every ps task to stop serving; errors are logged, not raised."""
        for ch in self.channels.values():
            try:
                ch.call("Shutdown", timeout=5.0)
            except RpcError as e:
                log.warning("%s: shutdown of %s failed: %s", self.client_name, ch.task, e)

    def close(self) -> None:
        """Closes every channel; idempotent."""
        for ch in self.channels.values():
            ch.close()
