"""ParameterClient: a worker's view of the variables on the ps tasks (the ps side's client).

The client sends :mod:`psflow.ps.protocol` messages; which task gets which
partitions is :mod:`psflow.ps.plans`' job, the wait for the chief's
initialization :mod:`psflow.ps.registration`'s, and the carrier is the one
``ConnectConfig.transport`` names (:func:`psflow.rpc.registry.open_channel`).

Per call, at most one RPC goes to each ps task: the variables (and partitions) a task holds travel
together, and the RPCs to different tasks are in flight at the same time.

Guarantees:
    * :meth:`ParameterClient.pull` returns values for exactly the ids asked for, in the order asked,
      fetched only from the partitions holding them.
    * :meth:`ParameterClient.push` returns after every ps task that holds a pushed variable applied its
      part; the returned global_step is the value this push produced (unique across all workers). In an
      unreplicated cluster a push is never retried: retrying could apply it twice.
    * Replicated shards (a ``ps_backup`` job, :mod:`psflow.cluster.replicas`): shard k's calls go to its
      current primary (``channels[k]``). A push call carries a ``push_id`` (one more per call) and each
      shard's ``acked`` count; a call that fails over is resent, same ``push_id``, to the failed shards'
      new primaries only (:mod:`psflow.ps.failover`), which apply a push at most once: exactly once.
    * :meth:`ParameterClient.register` is idempotent; it goes to ps task 0 first, which decides whether
      this client's layout agrees with the registered one (so two clients never split the tasks).

Not thread-safe: one client per training thread, and no call of another thread on it (a call from another
thread waits behind the training thread's on the tcp carrier, one call at a time per connection, and with
replicated shards it would share the router's failover state). Code off the training thread opens a client or
channels of its own: a chief's save (:func:`psflow.checkpoint.bounded_save.save_client`), its save notices
(:mod:`psflow.checkpoint.save_notice`), the chief election (:mod:`psflow.ps.control_routes`). On given in-process
channels (a run in one process) a save uses the client itself: :meth:`~ParameterClient.call`, ``call_async`` and
``ps_stats`` change no client state and run in the calling thread on the ps tasks' handlers, which serve concurrent
calls as over the network.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import ps_replicas
from psflow.gradients import DenseGradient, SparseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariablePlacement
from psflow.ps.failover import ShardRouter
from psflow.ps.plans import ClientError, Planner, PullPlan
from psflow.ps.protocol import (
    DoneRequest,
    LeaveRequest,
    PullReply,
    PullRequest,
    PushReply,
    PushRequest,
    ReaderPositionsReply,
    ReaderPositionsRequest,
    RegisterRequest,
    Request,
    StatsReply,
    StepTag,
    WorkerTag,
)
from psflow.ps.push_calls import (
    OrderedPushes,
    PendingPushPull,
    PushResult,
    acks_later,
    push_pull_calls,
    push_pull_replies,
    push_requests,
)
from psflow.ps.push_numbers import PushNumbers
from psflow.ps.registration import next_attempt, register_layout
from psflow.ps.report_done import send_done
from psflow.ps.rows_first import read_rows
from psflow.ps.sync import SyncConfig
from psflow.ps.task_calls import TaskCalls
from psflow.rpc.api import PARAMETER_SERVICE, Channel, ConnectConfig, PendingReply
from psflow.rpc.framing import Frame
from psflow.rpc.registry import open_channel

__all__ = ["ParameterClient", "ClientError", "PushResult", "PendingPushPull"]

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
        failover_timeout: float | None = None,
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
                :class:`~psflow.rpc.inprocess.InProcessChannel` for a run in one process
                (never replicated). Calls on channels opened here send many partitions stacked in a few
                arrays (:mod:`psflow.ps.protocol.stacking`); on given ones, one array per partition.
            failover_timeout: (replicated shards) seconds a shard member may answer nothing before this
                client takes it as gone (:class:`~psflow.ps.failover.ShardRouter`; default 10 s).

        Raises:
            ConfigError: ``config.transport`` names no carrier, or asks for what it
                cannot do (TLS over tcp).
            ClusterError: the cluster's ``ps_backup`` job does not fit its ``ps`` job.
        """
        self.sync = sync or SyncConfig()
        #: global_step read by the latest pull (the step its values belong to).
        self.last_pull_step: int | None = None
        self._step_hint: int | None = None  # the newest global_step heard of: the tables' clock off ps task 0
        #: This process, sent with pushes: an earlier process's are refused (psflow.ps.service, Incarnations).
        self.incarnation = time.time_ns()
        self._ordered = OrderedPushes(client_name)  # several pushes in flight (psflow.ps.push_order)
        self.cluster = cluster
        self._plans = Planner(layout, client_name=client_name)
        self.layout = self._plans.layout  #: Every variable's placement, by name.
        self.client_name = client_name
        self.config = config or ConnectConfig()
        ps = cluster.task_indices("ps")
        self.step_task = min(ps)
        #: Replicated shards: each shard's primary, this process's push numbers (None: unreplicated).
        self.router: ShardRouter | None = None
        self.pushes: PushNumbers | None = None
        if channels is None and ps_replicas(cluster):
            self.router = ShardRouter(cluster, self._open_member, client_name=client_name, config=self.config,
                                      failover_timeout=failover_timeout)
            self.pushes = PushNumbers(max(ps) + 1)
        #: ps task (shard) -> the channel its calls go to (a replicated shard: its current primary's).
        self.channels: dict[int, Channel] = (
            dict(channels) if channels is not None else self.router.channels if self.router is not None else {
                i: self._open_member(f"/job:ps/task:{i}", cluster.task_address("ps", i)) for i in ps})
        self._calls = TaskCalls(self.channels, self.router, self.pushes, client_name=client_name)
        # Channels this client opened (a carrier: its frames are encoded) carry a push's and a pull's many
        # partitions stacked in a few arrays (psflow.ps.protocol.stacking); given ones (in-process: frames
        # passed as they are, where stacking would only copy) one array per partition.
        self._stack = channels is None

    def _open_member(self, task: str, address: str) -> Channel:
        return open_channel(self.config.transport, task, address, PARAMETER_SERVICE, self.config)

    # ---- set-up ------------------------------------------------------------
    def connect(self, timeout: float | None = None) -> None:
        """Waits until every ps task is up (bounded; see ConnectConfig); replicated shards: until each
        shard has a primary, which its calls then go to (after a failover, not ``/job:ps/task:k``).

        Raises:
            TaskUnavailableError: a task did not come up in time (names it).
        """
        self._calls.wait_ready(timeout, connect_timeout=self.config.connect_timeout)

    def register(self, optimizer: OptimizerSpec, *, chief: bool = False, defer_ready: bool = False,
                 ready_timeout: float | None = None) -> bool:
        """Registers the layout and optimizer on every ps task (ps 0 first).

        Only the chief initializes (see :mod:`psflow.ps.service`, ``Register``).
        A non-chief client blocks until the chief has initialized (or
        restored) every ps task, asking again every 0.02 s times the number of
        workers that wait (the cluster's other workers) for about a second,
        then with exponential backoff (``backoff_initial`` .. ``backoff_max``;
        :func:`psflow.ps.registration.ready_waits`); it never sleeps a fixed time.

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
            TaskUnavailableError: the ps tasks were not ready in time (non-chief), or one stayed unreachable
                that long (a dead task is waited for, the chief's call's too: its restart answers).
        """
        request = RegisterRequest(tuple(self.layout.values()), optimizer, self.sync, self.client_name, chief,
                                  defer_ready, self.incarnation, attempt=next_attempt() if chief else None)
        limit = self.config.connect_timeout if ready_timeout is None else ready_timeout
        workers = self.cluster.num_tasks("worker") if "worker" in self.cluster.jobs else 1
        return register_layout(self.channels, self.step_task, request, self.config, limit, call=self.call_async,
                               askers=workers - 1)

    # ---- data path ---------------------------------------------------------
    def pull(self, requests: Mapping[str, np.ndarray | None], *, create: bool = False,
             averages: bool = False, require_ready: bool = False) -> dict[str, np.ndarray]:
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
            require_ready: (evaluation) refused by a ps task not ready through it (:mod:`psflow.ps.ready_read`).

        Returns:
            variable name -> array of ``len(ids)`` rows (or the whole variable).

        Raises:
            ClientError: unknown variable; PlacementError: ids out of range;
            RpcError: a ps task refused or failed.
        """
        plan = self._pull_plan(requests)
        pulls = {t: PullRequest(parts, create, averages, self._step_hint, stack=self._stack,
                                require_ready=require_ready) for t, parts in plan.per_task.items()}
        return self._assemble(plan, {t: PullReply.from_frame(frame) for t, frame in self._calls.gather(pulls).items()})

    def _pull_plan(self, requests: Mapping[str, np.ndarray | None]) -> PullPlan:
        # In sync and ssp mode the task holding global_step is always asked: its reply carries the
        # step the values belong to. In async mode a lookup goes only to the tasks holding the ids.
        return self._plans.pull(requests, always=self.step_task if self.sync.mode != "async" else None)

    def _assemble(self, plan: PullPlan, replies: Mapping[int, PullReply]) -> dict[str, np.ndarray]:
        step_reply = replies.get(self.step_task)
        step = step_reply.step if step_reply is not None and self.step_task in plan.per_task else None
        self.last_pull_step = step
        self._hear_step(step)
        return self._plans.assemble(plan, replies, task_name=lambda shard: self.channels[shard].task)

    def push(
        self,
        grads: Mapping[str, DenseGradient | SparseGradient],
        *,
        examples: int = 0,
        loss: float | None = None,
        position: str | None = None,
        generation: int | None = None,
    ) -> int:
        """Sends gradients; returns the global_step they produced (see :meth:`push_detailed`)."""
        return self.push_detailed(grads, examples=examples, loss=loss, position=position, generation=generation).step

    def push_detailed(
        self,
        grads: Mapping[str, DenseGradient | SparseGradient],
        *,
        examples: int = 0,
        loss: float | None = None,
        read_step: int | None = None,
        clock: int | None = None,
        position: str | None = None,
        generation: int | None = None,
    ) -> PushResult:
        """Sends gradients; the ps tasks apply their optimizer to them.

        Asynchronous mode: blocks until every owning ps task applied its part.
        Sync mode: the push goes to every ps task (so each counts one
        contribution per worker per step) tagged with ``read_step``, and
        blocks until the step is applied (or the gradient is found stale).
        SSP mode: blocks while this worker is more than ``staleness`` steps
        ahead of the slowest live one. Never retried (a replicated shard's failed over: resent, applied once).

        Args:
            grads: variable name -> gradient.
            examples: examples this gradient was computed from (for rates).
            loss: the batch's loss (for progress lines).
            read_step: the step of the parameters the gradient was computed
                from (default: :attr:`last_pull_step`); required in sync mode.
            clock: this worker's completed iterations, including this one (ssp).
            position: this worker's reader position just after the pushed batch
                (ReaderPosition JSON): the task holding global_step records it with
                the push's examples, and checkpoints resume from it (None: not sent).
            generation: the restore generation this worker trains in: every ps task
                refuses the push, before applying anything, if the cluster was
                restored to another one since (None: not checked).

        Returns:
            See :class:`PushResult`.

        Raises:
            ClientError, PlacementError: bad names, shapes or rows (nothing sent).
            RpcError: a ps task refused or failed (in sync mode: the step
                timed out, naming the missing workers).
        """
        per_task = self._push_requests(grads, examples, loss, read_step, clock, position, generation)
        replies = self._calls.gather(per_task, timeout=self._push_timeout(), pushed=per_task)
        return self._push_result({t: PushReply.from_frame(frame) for t, frame in replies.items()})

    def push_pull(
        self,
        grads: Mapping[str, DenseGradient | SparseGradient],
        requests: Mapping[str, np.ndarray | None],
        *,
        examples: int = 0,
        loss: float | None = None,
        read_step: int | None = None,
        clock: int | None = None,
        position: str | None = None,
        generation: int | None = None,
    ) -> tuple[PushResult, dict[str, np.ndarray]]:
        """Pushes this step's gradients and pulls the next step's rows in one RPC per ps task.

        Each ps task applies the push first and then reads the rows, so the
        values are exactly what a :meth:`push_detailed` followed by a
        :meth:`pull` would return (no extra staleness), with half the round
        trips. Same blocking, ordering and errors as those two calls; the pull
        part is validated before anything is applied. Never retried (but failed over). The pull
        is a training lookup (``create=True``, see :meth:`pull`); ``position`` and
        ``generation`` tag the push as in :meth:`push_detailed`.

        Returns:
            The push's result and the pulled values (as :meth:`pull` returns them).
        """
        result, values = self.send_push_pull(grads, requests, examples=examples, loss=loss, read_step=read_step,
                                             clock=clock, position=position, generation=generation).result()
        return result, values if values is not None else {}

    def send_push_pull(self, grads: Mapping[str, DenseGradient | SparseGradient],
                       requests: Mapping[str, np.ndarray | None] | None, *, examples: int = 0, loss: float | None = None,
                       read_step: int | None = None, clock: int | None = None, position: str | None = None,
                       generation: int | None = None, ordered: bool = False, ack_later: bool = False
                       ) -> PendingPushPull:
        """:meth:`push_pull` (``requests`` None: :meth:`push_detailed`), sent but not waited for.

        Returns at once, with the calls in flight (a request that cannot be built raises here, nothing
        sent); :meth:`PendingPushPull.result` waits for them (blocks, raises as :meth:`push_pull`) and
        must be called exactly once. Unordered (the default), before this client makes another call: a ps
        task's connection may serve one call at a time (the TCP carrier), and the order of one client's
        pushes to a ps task is the order their replies were collected in.

        ``ordered``: several may be in flight (a carrier whose channels carry concurrent calls: gRPC; an
        unreplicated cluster); each call to a ps task carries the next number of this process's sequence
        to that task (``seq``; a pull-only half too) and the ps task applies them in that order, nothing
        after a refused one (:mod:`psflow.ps.push_order`). Collect them in the order sent.

        ``ack_later`` (ignored unless :attr:`acks_later`): :meth:`PendingPushPull.rows` returns the rows before
        the push is acknowledged, :meth:`~PendingPushPull.result` collects that (``TaskCalls.send_acked``).

        Raises:
            ClientError: ``ordered`` with replicated ps shards or before :meth:`start_ordered`; bad names,
                shapes or rows (as :meth:`push_detailed`). Nothing is sent then.
        """
        if ordered:
            self._ordered.check(replicated=self.router is not None)
        plan = self._pull_plan(requests) if requests is not None else None
        pushes = self._push_requests(grads, examples, loss, read_step, clock, position, generation)
        calls: dict[int, Request] = dict(pushes) if plan is None else push_pull_calls(
            pushes, plan.per_task, step_hint=self._step_hint, client_name=self.client_name,
            replicated=self.pushes is not None, stack=self._stack)
        later = ack_later and plan is not None and self.acks_later
        calls = self._ordered.number(calls, self.incarnation) if ordered else acks_later(calls) if later else calls
        timeout = self._push_timeout()
        sent = self._calls.send_all(calls, timeout=timeout)

        def finish() -> tuple[PushResult, dict[str, np.ndarray] | None]:
            pushed, pulled = push_pull_replies(calls, pushes, self._calls.collect(calls, sent, timeout=timeout,
                                                                                  pushed=pushes))
            result = self._push_result(pushed)  # (its step heard before the pull's: as push_detailed, then pull)
            return result, None if plan is None else self._assemble(plan, pulled)

        def read(pushed: dict[int, PushReply], pulled: dict[int, PullReply]) -> dict[str, np.ndarray] | None:
            self._push_result(pushed)  # (its step heard before the pull's)
            return None if plan is None else self._assemble(plan, pulled)

        def rows() -> tuple[dict[str, np.ndarray] | None, Callable[[], PushResult]]:
            return read_rows(calls, sent, pushes, self._calls, read=read, result=self._push_result, timeout=timeout,
                             client_name=self.client_name)

        return PendingPushPull(self.client_name, rows=rows) if later else PendingPushPull(self.client_name, finish)

    @property
    def acks_later(self) -> bool:
        """Whether ``send_push_pull(ack_later=True)`` gets rows before the acknowledgement: replicated, async."""
        return self.pushes is not None and self.sync.mode == "async"

    def start_ordered(self) -> None:
        """Starts a new sequence of ordered pushes (``send_push_pull(ordered=True)``), numbered from 0 on every
        ps task: the ps tasks refuse the older sequence's pushes from then on. Call it before the first
        ordered push, and again once none of the previous sequence's is in flight (a training loop that
        starts over, e.g. after a recovery)."""
        self._ordered.start()

    # ---- request building --------------------------------------------------
    def _push_requests(self, grads: Mapping[str, DenseGradient | SparseGradient], examples: int, loss: float | None,
                       read_step: int | None, clock: int | None, position: str | None,
                       generation: int | None) -> dict[int, PushRequest]:
        """Each ps task's push: its partitions' gradients and the worker's and step's tags; the task holding
        global_step also gets the step's counts and the reader position."""
        read_step = self.last_pull_step if read_step is None else read_step
        mode = self.sync.mode
        if mode == "sync" and read_step is None:
            raise ClientError(f"{self.client_name}: a sync push needs the step its parameters were pulled at")
        per_task = self._plans.push(grads, list(self.channels) if mode == "sync" else [self.step_task])
        out = push_requests(per_task, self.step_task, WorkerTag(self.client_name, self.incarnation, generation, position),
                            StepTag(read_step, clock, read_step if mode == "sync" else None, self._step_hint),
                            examples, loss, stack=self._stack)
        # Replicated shards: this call's push_id, each shard's acknowledged count.
        return out if self.pushes is None else self.pushes.number(out)

    @property
    def acked(self) -> dict[int, int]:
        """(Replicated shards) shard -> how many of this client process's pushes it acknowledged."""
        return dict(self.pushes.acked) if self.pushes is not None else {}

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

    def call_async(self, task: int, request: Request, *, timeout: float | None = None) -> PendingReply:
        """Sends ``request`` (a :mod:`psflow.ps.protocol` message) to ps task ``task`` (default deadline:
        ``rpc_timeout``); the reply is read with the request's reply class. Not retried; a replicated shard's
        call that fails over is resent to its new primary (:meth:`~psflow.ps.failover.ShardRouter.call`)."""
        return self._calls.call_async(task, request, timeout=timeout)

    def call(self, task: int, request: Request, *, timeout: float | None = None) -> Frame:
        """:meth:`call_async`, waited for.

        Raises:
            RpcError: the task refused or failed (names it).
        """
        return self.call_async(task, request, timeout=timeout).result()

    def reader_positions(self) -> dict[str, str]:
        """Every client's recorded reader position (JSON), from the task holding global_step; claims
        this client's incarnation there first (pushes of an earlier process are refused from then on)."""
        request = ReaderPositionsRequest(self.client_name, self.incarnation)
        reply = self._calls.call_one(self.step_task, request.METHOD, request.to_frame().meta)
        return dict(ReaderPositionsReply.from_frame(reply).positions)

    def leave(self) -> None:
        """Tells every ps task this worker is done (sync/ssp stop waiting for it); a replicated shard also
        hears how many of this process's pushes it acknowledged (``acked``, the final count, every shard's
        ``acked_all``, and the process)."""
        pushes = self.pushes
        if pushes is None:
            self._calls.gather({t: LeaveRequest(self.client_name) for t in self.channels})
            return
        counts = pushes.counts()
        self._calls.gather({t: LeaveRequest(self.client_name, pushes.acked.get(t, 0), self.incarnation, counts)
                            for t in self.channels})

    def report_done(self, *, checkpoint_dir: bool = False, final_checkpoint: str | None = None,
                    attempts: int = 3, worker: str | None = None) -> list[str]:
        """Tells every ps task this worker's session ended normally (``Done``, :mod:`psflow.ps.run_end`);
        ``worker``: the training worker it is for (default this client's name); ``checkpoint_dir``: the run
        checkpoints; ``final_checkpoint``: its final checkpoint's name (the ps tasks' exit line names it).
        Blocks for at most ``attempts`` rounds of 5 s calls; never raises; returns the ps tasks that did not
        hear it (:func:`psflow.ps.report_done.send_done`)."""
        meta = DoneRequest(worker or self.client_name, self.incarnation, checkpoint_dir,
                           final_checkpoint).to_frame().meta
        return send_done(self.client_name, self.channels, meta, attempts=attempts,
                         reroute=self.router.reroute if self.router is not None else None)

    # ---- control -----------------------------------------------------------
    def stats(self, task: int | None = None, *, timeout: float | None = None) -> dict[str, Any]:
        """State and counters of one ps task (default: the one holding global_step), by name (for display;
        :meth:`ps_stats` gives them typed)."""
        return self.ps_stats(task, timeout=timeout).as_dict()

    def ps_stats(self, task: int | None = None, *, timeout: float | None = None) -> StatsReply:
        """State and counters of one ps task (default: the one holding global_step); ``timeout`` bounds the
        call, a replicated shard's wait for a new primary included (default: ``rpc_timeout``, and the
        failover wait)."""
        task = self.step_task if task is None else task
        return StatsReply.from_frame(self._calls.call_one(task, "Stats", timeout=timeout))

    def global_step(self) -> int:
        """The current global_step."""
        step = self.ps_stats().global_step
        if step is None:
            raise ClientError(f"{self.client_name}: {self.channels[self.step_task].task} holds no global_step")
        return step

    def shutdown_servers(self) -> None:
        """Asks every ps task to stop serving; errors are logged, not raised."""
        self._calls.shutdown()

    def close(self) -> None:
        """Closes every channel (a replicated cluster's: to every member); idempotent."""
        self._calls.close()

