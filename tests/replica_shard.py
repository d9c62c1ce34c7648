"""An in-process replicated shard for unit tests (tests/unit/ps/replication/): each member a real
ParameterService with its ShardReplication, joined by InProcessChannel (the same handlers and dispatch as
over the network, no sockets; ``latency`` delays each Replicate call to a member as a network would). A
member can be cut off (every call to it fails UNAVAILABLE) and each Replicate call a member receives is
kept, so a test can replay a prefix of the primary's entries onto a fresh member. ``message_limit`` refuses a
Replicate call whose arrays exceed it, as a carrier refuses a message over its limit (and the members split
entries to fit: ``chunk_bytes``). ``held_requests`` and ``held_replies`` hold up one call in the network: a
request reaches whichever process serves the member when it is let go, as at a restarted task's address.
``lost_replies`` loses the replies of calls that were served, as a caller whose deadline passed sees them.
``after_reply`` names the members served as psflow's TCP carrier serves (work left for after a reply runs
after it; ``after_reply_held`` keeps it until the test runs it)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.protocol import (
    LeaveRequest,
    PromoteRequest,
    PushReply,
    PushRequest,
    RegisterRequest,
    ReplicaEntry,
    ReplicaStatusReply,
    ReplicaStatusRequest,
    ReplicateRequest,
)
from psflow.ps.replication import ReplicationConfig, ShardReplication
from psflow.ps.replication.after_acked import AfterAcked
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc import after_reply
from psflow.rpc.api import DeadlineExceededError, Handler, InvalidArgumentError, RpcError, TaskUnavailableError
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel

PRIMARY = "/job:ps/task:0"
WORKERS = ("/job:worker/task:0", "/job:worker/task:1")


def backup(i: int) -> str:
    return f"/job:ps_backup/task:{i}"


def assert_same_state(a: ParameterService, b: ParameterService) -> None:
    """``b`` holds ``a``'s state bit for bit: every partition's value, slots, average and dynamic-table rows,
    global_step and the worker ledger (what a backup must hold of its primary's)."""
    for part in a.store.partitions():
        other = b.store.get(part.key)
        if part.table is not None:
            assert other.table is not None, part.key
            mine, theirs = part.table.snapshot(), other.table.snapshot()
            assert sorted(mine) == sorted(theirs), part.key
            for name in mine:
                assert mine[name].shape == theirs[name].shape, (part.key, name)
                assert mine[name].tobytes() == theirs[name].tobytes(), (part.key, name)
            continue
        assert part.value.tobytes() == other.value.tobytes(), part.key
        assert sorted(part.slots) == sorted(other.slots), part.key
        for name, slot in part.slots.items():
            assert slot.tobytes() == other.slots[name].tobytes(), (part.key, name)
        assert (part.average is None) == (other.average is None), part.key
        if part.average is not None and other.average is not None:
            assert part.average.tobytes() == other.average.tobytes(), part.key
    assert a.global_step is not None and b.global_step is not None and a.global_step.value == b.global_step.value
    assert a.workers.replica_state() == b.workers.replica_state()


class _Done:
    def __init__(self, outcome: Frame | RpcError) -> None:
        self._outcome = outcome

    def result(self) -> Frame:
        if isinstance(self._outcome, RpcError):
            raise self._outcome
        return self._outcome


class Link:
    """A channel to one member that fails while the member is cut off, and records its Replicate entries."""

    def __init__(self, shard: InProcessShard, task: str) -> None:
        self.task, self.address, self._shard = task, "in-process", shard

    def wait_ready(self, timeout: float | None = None) -> None:
        """Returns at once."""

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> _Done:
        if self.task in self._shard.cut:
            return _Done(TaskUnavailableError(f"{self.task} is cut off (test)"))
        if method == ReplicateRequest.METHOD:
            size = sum(a.nbytes for a in (arrays or {}).values())
            limit = self._shard.message_limit
            if limit is not None and size > limit:
                return _Done(InvalidArgumentError(f"{self.task}: request of {size} bytes exceeds {limit} (test)"))
            self._shard.calls[self.task] = self._shard.calls.get(self.task, 0) + 1
            request = ReplicateRequest.from_frame(Frame(dict(meta or {}), dict(arrays or {})))
            self._shard.received.setdefault(self.task, []).extend(request.entries)
            if self._shard.latency.get(self.task):
                time.sleep(self._shard.latency[self.task])  # a network's round trip
        held, reply_held = (held_calls.get((self.task, method)) for held_calls in (self._shard.held_requests,
                                                                                     self._shard.held_replies))
        if self._shard.lost_replies.get((self.task, method)):
            self._shard.lost_replies[(self.task, method)] -= 1
            self._serve(method, meta, arrays)  # served; the caller never hears of it
            return _Done(DeadlineExceededError(f"{self.task}: {method}: no reply within the deadline (test)"))
        if held is None and reply_held is None:
            return self._serve(method, meta, arrays)
        with self._shard.holding_call():
            if held is not None:  # the request is held up: whichever process serves the task then serves it
                held.wait(30.0)
            done = self._serve(method, meta, arrays)
            if reply_held is not None:  # served; its reply is held up
                reply_held.wait(30.0)
            return done

    def _serve(self, method: str, meta: Mapping[str, Any] | None, arrays: Mapping[str, np.ndarray] | None) -> _Done:
        if self.task not in self._shard.after_reply:
            return self._serve_now(method, meta, arrays)
        with after_reply.collecting() as work:  # as psflow's TCP carrier serves it
            done = self._serve_now(method, meta, arrays)
        if self._shard.after_reply_held:
            self._shard.after_reply_work.setdefault(self.task, []).extend(work)
        else:
            after_reply.run(work, self.task, method)
        return done

    def _serve_now(self, method: str, meta: Mapping[str, Any] | None,
                   arrays: Mapping[str, np.ndarray] | None) -> _Done:
        try:
            return _Done(InProcessChannel(self.task, self._shard.handlers[self.task]).call(method, meta, arrays))
        except RpcError as e:
            return _Done(e)

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def close(self) -> None:
        """Nothing to close."""


def layout(sync: SyncConfig, dynamic: Mapping[str, Any] | None = None,
           optimizer: OptimizerSpec | None = None) -> RegisterRequest:
    """w (20 x 4, sparse pushes), b (4,), and with ``dynamic`` a dynamic table emb (dim 3)."""
    vs = VariableSet(replica_device_setter(cluster=ClusterSpec({"ps": ["127.0.0.1:1"]})))
    vs.get_variable("w", (20, 4), initializer={"name": "random_normal", "stddev": 0.1, "seed": 1})
    vs.get_variable("b", (4,))
    if dynamic is not None:
        vs.get_variable("emb", (0, 3), dynamic=dict(dynamic), initializer={"name": "random_normal", "stddev": 0.1,
                                                                              "seed": 2})
    return RegisterRequest(tuple(vs.placements()), optimizer or OptimizerSpec("adagrad", {"learning_rate": 0.1}),
                           sync, WORKERS[0], chief=True)


class InProcessShard:
    """Shard 0 with ``backups`` ps_backup members; :meth:`start` makes the ps task primary of a fresh shard."""

    def __init__(self, backups: int = 1, replica_timeout: float = 5.0, message_limit: int | None = None,
                 chunk_bytes: int | None = None, run_end: bool = False) -> None:
        #: With ``run_end``: each member serves ``Done`` for :data:`WORKERS`, composed as psflow.server does
        #: (its run-over work waits for the last Done's entry: AfterAcked); ``run_over`` records (member, what).
        self.run_end = run_end
        self.run_over: list[tuple[str, str]] = []
        self.members = (PRIMARY, *(backup(i) for i in range(backups)))
        self.cluster = ClusterSpec({"ps": ["127.0.0.1:1"],
                                    "ps_backup": [f"127.0.0.1:{2 + i}" for i in range(backups)]})
        self.cut: set[str] = set()
        #: Member -> seconds each Replicate call to it takes before it is served (none: at once).
        self.latency: dict[str, float] = {}
        self.received: dict[str, list[ReplicaEntry]] = {}
        #: Member -> Replicate calls it accepted; the limit on a Replicate call's array bytes (None: none).
        self.calls: dict[str, int] = {}
        self.message_limit, self.chunk_bytes = message_limit, chunk_bytes
        #: (member, method) -> an event: a call of that method to that member that starts while the key is here
        #: waits for the event (30 s at most) before it is served (``held_requests``) or, served, before its
        #: reply returns (``held_replies``); ``holding`` counts such calls until each returned.
        self.held_requests: dict[tuple[str, str], threading.Event] = {}
        self.held_replies: dict[tuple[str, str], threading.Event] = {}
        self.holding = 0
        self._holding_lock = threading.Lock()
        #: (member, method) -> how many of the next such calls are served and their replies lost: the caller
        #: gets DEADLINE_EXCEEDED, as when its deadline passed while the call was served.
        self.lost_replies: dict[tuple[str, str], int] = {}
        #: Members whose calls are served as psflow's TCP carrier serves them: the work a handler leaves for
        #: after its reply (psflow.rpc.after_reply) runs once the call returned, or, while ``after_reply_held``,
        #: waits in ``after_reply_work`` until :meth:`run_after_reply`.
        self.after_reply: set[str] = set()
        self.after_reply_held = False
        self.after_reply_work: dict[str, list[Callable[[], None]]] = {}
        self.services: dict[str, ParameterService] = {}
        self.replicas: dict[str, ShardReplication] = {}
        self.handlers: dict[str, dict[str, Handler]] = {}
        self.replica_timeout = replica_timeout
        for member in self.members:
            self.add(member)

    def add(self, member: str) -> ShardReplication:
        """A fresh process of ``member`` (empty service, new incarnation), reachable at once."""
        after = AfterAcked()
        service = ParameterService(0, holds_global_step=True, training_workers=list(WORKERS) if self.run_end else None,
                                   on_run_over=lambda what: after.run(lambda: self.run_over.append((member, what))))
        chunking = {} if self.chunk_bytes is None else {"chunk_bytes": self.chunk_bytes}
        replica = ShardReplication(ReplicationConfig(self.cluster, member, 0, replica_timeout=self.replica_timeout,
                                                     status_timeout=1.0, **chunking), service,
                                   connect=lambda other: Link(self, other))
        old = self.replicas.get(member)
        if old is not None:
            old.stop()
        self.services[member], self.replicas[member] = service, replica
        self.handlers[member] = replica.handlers(service.handlers())
        if self.run_end:
            self.handlers[member]["Done"] = after.wrap(self.handlers[member]["Done"])
        return replica

    def start(self, member: str = PRIMARY) -> None:
        self.replicas[member].start()

    @contextlib.contextmanager
    def holding_call(self) -> Iterator[None]:
        """Counts a held call in :attr:`holding` until it is served and its reply let go."""
        with self._holding_lock:
            self.holding += 1
        try:
            yield
        finally:
            with self._holding_lock:
                self.holding -= 1

    def run_after_reply(self, member: str) -> int:
        """Runs the work ``member``'s handlers left for after their replies (held); returns how many."""
        work = self.after_reply_work.pop(member, [])
        after_reply.run(work, member, "held")
        return len(work)

    def call(self, member: str, method: str, frame: Frame) -> Frame:
        return Link(self, member).call(method, frame.meta, frame.arrays)

    def status(self, member: str) -> ReplicaStatusReply:
        return ReplicaStatusReply.from_frame(self.call(member, ReplicaStatusRequest.METHOD, Frame({})))

    def wait(self, what: Callable[[], bool], description: str, limit: float = 10.0) -> None:
        deadline = time.monotonic() + limit
        while not what():
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {limit} s: {description}")
            time.sleep(0.01)

    def wait_view(self, primary: str = PRIMARY, backups: tuple[str, ...] | None = None, limit: float = 10.0) -> None:
        want = tuple(m for m in self.members if m != primary) if backups is None else backups

        def ready() -> bool:
            view = self.replicas[primary].view.view
            return view.role == "primary" and set(view.backups) == set(want) and all(
                self.replicas[b].has_state for b in want)
        self.wait(ready, f"{primary} primary with backups {want}", limit)

    def register(self, request: RegisterRequest, member: str = PRIMARY) -> None:
        self.call(member, RegisterRequest.METHOD, request.to_frame())

    def push(self, member: str, request: PushRequest) -> PushReply:
        return PushReply.from_frame(self.call(member, PushRequest.METHOD, request.to_frame()))

    def leave(self, member: str, worker: str, acked: int, incarnation: int | None = None) -> None:
        self.call(member, LeaveRequest.METHOD, LeaveRequest(worker, acked, incarnation).to_frame())

    def promote(self, member: str, expected_epoch: int) -> ReplicaStatusReply:
        frame = self.call(member, PromoteRequest.METHOD, PromoteRequest(0, expected_epoch, WORKERS[0]).to_frame())
        return ReplicaStatusReply.from_frame(frame)

    def stop(self) -> None:
        for replica in self.replicas.values():
            replica.stop()
