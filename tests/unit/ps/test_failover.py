"""The client's side of a replicated shard's failover (psflow/ps/failover.py, issue 28): which member is the
primary, when a backup is promoted or dropped, when every replica is lost, and that an unreplicated client
never resends. Fake members here stand for the routing decisions only; the real members meet the client in
tests/integration/test_replicated_training.py."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from psflow.cluster import ClusterSpec
from psflow.gradients import DenseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.failover import ShardRouter
from psflow.ps.primary_choice import decide
from psflow.ps.protocol import (
    PullReply,
    PushPullReply,
    PushReply,
    PushRequest,
    RegisterReply,
    SetReadyReply,
    SetReadyRequest,
    StepTag,
    WorkerTag,
)
from psflow.ps.protocol.replication import DropBackupRequest, PromoteRequest, ReplicaStatusReply
from psflow.ps.push_numbers import PushNumbers
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import (
    ConnectConfig,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    RpcError,
    TaskUnavailableError,
)
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)

P0, B0 = "/job:ps/task:0", "/job:ps_backup/task:0"
P1, B1 = "/job:ps/task:1", "/job:ps_backup/task:1"
CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "ps_backup": ["127.0.0.1:3", "127.0.0.1:4"]})


def status(task: str, role: str, epoch: int, *, primary: str | None = None, backups: tuple[str, ...] = (),
           has_state: bool = True) -> ReplicaStatusReply:
    return ReplicaStatusReply(task, 0, role, epoch, primary, backups, 0, has_state, 1)


# ---- decide: the rules alone ------------------------------------------------------------------------------
def test_the_primary_holding_the_state_at_the_highest_epoch_wins_over_a_deposed_one_that_does_not_know_yet() -> None:
    statuses = {P0: status(P0, "primary", 1, primary=P0, backups=(B0,)),   # cut off, not told yet
                B0: status(B0, "primary", 2, primary=B0)}
    d = decide((P0, B0), statuses, known=(P0, 1), unreachable_error=True)
    assert (d.action, d.task, d.epoch) == ("route", B0, 2)


def test_a_dead_primary_gets_its_first_backup_holding_the_state_promoted_at_the_views_epoch() -> None:
    statuses = {P0: None, B0: status(B0, "backup", 1, primary=P0)}
    d = decide((P0, B0), statuses, known=(P0, 1), unreachable_error=True, gone={P0})
    assert (d.action, d.task, d.epoch) == ("promote", B0, 1)
    # Restarted empty (it rebuilds: joining), its backup is promoted all the same: it said it is not primary.
    statuses[P0] = status(P0, "joining", 0, has_state=False)
    assert decide((P0, B0), statuses, known=(P0, 1), unreachable_error=True).action == "promote"


def test_a_primary_that_is_only_slow_to_answer_is_never_promoted_over() -> None:
    # No status within the deadline, but no proof it is gone (no refused connection, not silent for the bound).
    statuses = {P0: None, B0: status(B0, "backup", 1, primary=P0)}
    for unreachable in (True, False):
        assert decide((P0, B0), statuses, known=(P0, 1), unreachable_error=unreachable).action == "wait"


def test_a_backup_that_does_not_hold_the_state_is_never_promoted() -> None:
    statuses = {P0: None, B0: status(B0, "joining", 1, primary=P0, has_state=False)}
    d = decide((P0, B0), statuses, known=(P0, 1), unreachable_error=True, gone={P0})
    assert d.action == "wait"   # nobody to promote, nobody primary: ask again


def test_every_replica_lost_routes_to_the_empty_primary_for_todays_checkpoint_path() -> None:
    # Both members restarted empty; member 0 made itself primary of a fresh view.
    statuses = {P0: status(P0, "primary", 1, primary=P0, backups=(B0,), has_state=False),
                B0: status(B0, "joining", 0, has_state=False)}
    d = decide((P0, B0), statuses, known=(B0, 2), unreachable_error=True)
    assert (d.action, d.task, d.epoch, d.has_state) == ("route", P0, 1, False)


def test_a_backup_unreachable_from_here_too_is_dropped_only_after_an_unreachable_error() -> None:
    statuses = {P0: status(P0, "primary", 1, primary=P0, backups=(B0,)), B0: None}
    d = decide((P0, B0), statuses, known=(P0, 1), unreachable_error=True, gone={B0})
    assert (d.action, d.task, d.epoch, d.primary) == ("drop", B0, 1, P0)
    # A refusal (FAILED_PRECONDITION) from the primary it knew is the request's own error: no drop.
    assert decide((P0, B0), statuses, known=(P0, 1), unreachable_error=False, gone={B0}).action == "route"
    # A backup that is only slow to answer is not dropped: ask again.
    assert decide((P0, B0), statuses, known=(P0, 1), unreachable_error=True).action == "wait"


# ---- ShardRouter over fake members ------------------------------------------------------------------------
@dataclass
class Member:
    """A fake shard member: its status (None: down) and the calls it got."""

    task: str
    state: ReplicaStatusReply | None
    calls: list[str] = field(default_factory=list)
    metas: list[Mapping[str, Any]] = field(default_factory=list)
    replies: list[Any] = field(default_factory=list)  # what its next data calls answer (Frame or RpcError)
    timeouts: list[float | None] = field(default_factory=list)  # the deadline of each call it got


class Done:
    def __init__(self, value: Frame | RpcError) -> None:
        self.value = value

    def result(self) -> Frame:
        if isinstance(self.value, RpcError):
            raise self.value
        return self.value


class FakeShards:
    """Every member of CLUSTER's shards; Promote and DropBackup change the views as the ps side would."""

    def __init__(self) -> None:
        self.members = {t: Member(t, None) for t in (P0, B0, P1, B1)}
        #: Members that answer nothing (a stopped process, a cut link): every call times out.
        self.stalled: set[str] = set()

    def set(self, task: str, role: str | None, epoch: int = 1, *, primary: str | None = None,
            backups: tuple[str, ...] = (), has_state: bool = True) -> None:
        self.members[task].state = None if role is None else status(task, role, epoch, primary=primary,
                                                                    backups=backups, has_state=has_state)

    def open(self, task: str, address: str) -> FakeChannel:
        return FakeChannel(self, self.members[task], address)

    def answer(self, member: Member, method: str, meta: Mapping[str, Any]) -> Frame | RpcError:
        member.calls.append(method)
        member.metas.append(meta)
        if member.task in self.stalled:
            return DeadlineExceededError(f"{member.task}: {method}: DEADLINE_EXCEEDED")
        s = member.state
        if s is None:
            return TaskUnavailableError(f"{member.task}: {method}: UNAVAILABLE: failed to connect to all addresses; "
                                        "last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: "
                                        "Connection refused")
        if method == "ReplicaStatus":
            return s.to_frame()
        if method == PromoteRequest.METHOD:
            if s.role != "backup" or s.epoch != meta["expected_epoch"]:
                return FailedPreconditionError(f"{member.task}: at epoch {s.epoch}")
            self.set(member.task, "primary", s.epoch + 1, primary=member.task)
            return self.members[member.task].state.to_frame()  # type: ignore[union-attr]
        if method == DropBackupRequest.METHOD:
            self.set(member.task, "primary", s.epoch + 1, primary=member.task,
                     backups=tuple(b for b in s.backups if b != meta["backup"]))
            return self.members[member.task].state.to_frame()  # type: ignore[union-attr]
        if member.replies:
            return member.replies.pop(0)  # type: ignore[no-any-return]
        if s.role != "primary":
            return FailedPreconditionError(f"{member.task}: not the primary")
        return PushReply(step=7).to_frame()


@dataclass
class FakeChannel:
    shards: FakeShards
    member: Member
    address: str

    @property
    def task(self) -> str:
        return self.member.task

    def wait_ready(self, timeout: float | None = None) -> None:
        pass

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Done:
        self.member.timeouts.append(timeout)
        return Done(self.shards.answer(self.member, method, meta or {}))

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def close(self) -> None:
        pass


class Clock:
    """The router's clock for silences, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def router(shards: FakeShards, clock: Clock | None = None) -> ShardRouter:
    return ShardRouter(CLUSTER, shards.open, client_name="/job:worker/task:0",
                       config=ConnectConfig(backoff_initial=0.001), failover_timeout=10.0, wait_timeout=5.0,
                       clock=clock or Clock())


def healthy() -> FakeShards:
    shards = FakeShards()
    shards.set(P0, "primary", 1, primary=P0, backups=(B0,))
    shards.set(B0, "backup", 1, primary=P0)
    shards.set(P1, "primary", 1, primary=P1, backups=(B1,))
    shards.set(B1, "backup", 1, primary=P1)
    return shards


def test_at_connect_each_shard_routes_to_its_primary_and_learns_the_epoch() -> None:
    shards = healthy()
    shards.set(P1, "deposed", 1, has_state=False)   # shard 1 failed over before this client started
    shards.set(B1, "primary", 2, primary=B1)
    r = router(shards)
    assert r.resolve(0) and r.resolve(1)
    assert r.routes == {0: (P0, 1), 1: (B1, 2)} and r.channels[1].task == B1
    assert r.failovers == 0  # learnt, not followed
    assert not r.resolve(0, TaskUnavailableError("late"))  # nothing changed: the error is the request's own


def test_a_dead_primary_is_replaced_by_its_promoted_backup_and_a_second_client_does_not_promote_again() -> None:
    shards = healthy()
    first, second = router(shards), router(shards)
    first.resolve(0), second.resolve(0)
    shards.set(P0, None)
    assert first.resolve(0, TaskUnavailableError("down"))
    assert first.routes[0] == (B0, 2) and first.channels[0].task == B0 and first.failovers == 1
    assert shards.members[B0].calls.count(PromoteRequest.METHOD) == 1
    assert second.resolve(0, TaskUnavailableError("down"))   # it finds the new primary: no Promote
    assert second.routes[0] == (B0, 2) and shards.members[B0].calls.count(PromoteRequest.METHOD) == 1


def test_a_backup_unreachable_from_the_client_too_is_dropped_and_the_request_resent() -> None:
    shards = healthy()
    r = router(shards)
    r.resolve(0)
    shards.set(B0, None)
    assert r.resolve(0, TaskUnavailableError(f"{P0}: backup {B0} did not acknowledge"))
    assert r.routes[0] == (P0, 2) and shards.members[P0].state.backups == ()  # type: ignore[union-attr]


def test_no_member_to_serve_the_shard_raises_naming_the_shard_and_what_each_member_said() -> None:
    shards = healthy()
    r = router(shards)
    r.resolve(0)
    shards.set(P0, None)
    shards.set(B0, "joining", 0, has_state=False)
    with pytest.raises(TaskUnavailableError, match=rf"no member of ps shard 0 can serve it .*{P0}: no answer; "
                                                   rf"{B0}: joining at epoch 0, empty"):
        r.resolve(0, TaskUnavailableError("down"), timeout=0.05)


def test_gather_resends_the_failed_shard_only_and_keeps_the_others_reply() -> None:
    shards = healthy()
    r = router(shards)
    r.resolve(0), r.resolve(1)
    shards.set(P0, None)
    sent: list[int] = []

    def send(shard: int) -> Done:
        sent.append(shard)
        return r.channels[shard].call_async("Push")

    replies = r.gather({0: send(0), 1: send(1)}, send)
    assert sorted(replies) == [0, 1] and sent == [0, 1, 0]
    assert shards.members[B0].calls.count("Push") == 1 and shards.members[P1].calls.count("Push") == 1


def test_a_call_with_its_own_deadline_stops_waiting_for_a_shard_without_a_primary_by_then() -> None:
    # The launcher's status reads (every 2 s, in the loop that also restarts dead tasks) must not wait the
    # router's whole wait_timeout for a shard whose every member is dead: that held a restart back ~60 s.
    shards = healthy()
    r = ShardRouter(CLUSTER, shards.open, client_name="launcher", config=ConnectConfig(backoff_initial=0.001),
                    failover_timeout=10.0, wait_timeout=3600.0, clock=Clock())  # a hang here: the test's timeout
    r.resolve(0)
    shards.set(P0, None)
    shards.set(B0, None)
    with pytest.raises(TaskUnavailableError):
        r.call(0, lambda t: r.channels[t].call_async("Stats"), wait=0.05).result()


def test_gather_raises_an_error_that_is_not_a_failover_without_asking_the_members() -> None:
    shards = healthy()
    r = router(shards)
    r.resolve(0)
    shards.members[P0].replies.append(InvalidArgumentError("bad gradient"))
    before = len(shards.members[B0].calls)
    with pytest.raises(InvalidArgumentError, match="bad gradient"):
        r.gather({0: r.channels[0].call_async("Push")}, lambda t: r.channels[t].call_async("Push"))
    assert len(shards.members[B0].calls) == before
    # A refusal by the primary it knew, at the epoch it knew, is raised too (after one round of statuses).
    shards.members[P0].replies.append(FailedPreconditionError("generation 3 was restored"))
    with pytest.raises(FailedPreconditionError, match="generation 3"):
        r.gather({0: r.channels[0].call_async("Push")}, lambda t: r.channels[t].call_async("Push"))


def test_push_numbers_tag_every_shard_of_a_call_with_one_push_id_and_each_shards_acknowledged_count() -> None:
    numbers = PushNumbers(3)
    request = PushRequest((), WorkerTag("/job:worker/task:0", 5), StepTag())
    first = numbers.number({0: request, 1: request})
    assert {s: (r.worker.push_id, r.worker.acked) for s, r in first.items()} == {0: (1, 0), 1: (1, 0)}
    numbers.acknowledged([0])
    second = numbers.number({0: request, 1: request})
    assert {s: (r.worker.push_id, r.worker.acked) for s, r in second.items()} == {0: (2, 1), 1: (2, 0)}
    # Every shard's count goes to each: shard 2, which this call does not reach, included.
    assert {s: r.worker.acked_all for s, r in second.items()} == {0: (1, 0, 0), 1: (1, 0, 0)}
    assert request.worker.push_id is None  # the caller's request is left as it was


# ---- ParameterClient ----------------------------------------------------------------------------------------
def _layout(cluster: ClusterSpec) -> VariableSet:
    vs = VariableSet(replica_device_setter(cluster=cluster))
    vs.get_variable("w", (2,))  # ps task 0
    return vs


def test_an_unreplicated_client_sends_a_failed_push_once_and_raises() -> None:
    cluster = ClusterSpec({"ps": ["127.0.0.1:1"]})
    shards = FakeShards()
    shards.set(P0, "unreplicated", 0)
    shards.members[P0].replies.append(TaskUnavailableError(f"{P0}: down"))
    client = ParameterClient(cluster, _layout(cluster).placements(), client_name="/job:worker/task:0",
                             channels={0: shards.open(P0, "127.0.0.1:1")})
    assert client.router is None and client.pushes is None
    with pytest.raises(TaskUnavailableError):
        client.push({"w": DenseGradient(np.ones(2, np.float32))})
    assert shards.members[P0].calls == ["Push"]


def test_a_replicated_push_is_resent_to_the_new_primary_with_its_push_id_and_counted_once_acknowledged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shards = healthy()
    monkeypatch.setattr("psflow.ps.client.open_channel", lambda transport, task, address, service, config:
                        shards.open(task, address))
    client = ParameterClient(CLUSTER, _layout(CLUSTER).placements(), client_name="/job:worker/task:0",
                             config=ConnectConfig(backoff_initial=0.001), failover_timeout=10.0)
    client.connect()
    grads = {"w": DenseGradient(np.ones(2, np.float32))}
    client.push(grads)
    client.push(grads)
    shards.set(P0, None)  # dies: the third push fails there
    client.push(grads)
    pushes = [(m["push_id"], m["acked"], m.get("shard_epoch")) for m in shards.members[P0].metas if "push_id" in m]
    assert pushes == [(1, 0, 1), (2, 1, 1), (3, 2, 1)]
    resent = [(m["push_id"], m["acked"], m.get("shard_epoch")) for m in shards.members[B0].metas if "push_id" in m]
    assert resent == [(3, 2, 2)]               # the same push_id, at the new primary's epoch
    assert client.acked == {0: 3} and client.channels[0].task == B0
    client.leave()
    assert shards.members[B0].metas[-1] == {"worker": "/job:worker/task:0", "acked": 3,  # this process's count
                                            "incarnation": client.incarnation, "acked_all": [3, 0]}  # every shard's


def _two_shard_client(shards: FakeShards, monkeypatch: pytest.MonkeyPatch) -> ParameterClient:
    """A replicated client over ``shards`` with ``w`` on shard 0 and ``b`` on shard 1, connected."""
    monkeypatch.setattr("psflow.ps.client.open_channel", lambda transport, task, address, service, config:
                        shards.open(task, address))
    vs = VariableSet(replica_device_setter(cluster=CLUSTER))
    vs.get_variable("w", (2,))
    vs.get_variable("b", (1,))
    client = ParameterClient(CLUSTER, vs.placements(), client_name="/job:worker/task:0",
                             config=ConnectConfig(backoff_initial=0.001), failover_timeout=10.0)
    client.connect()
    assert {name: [p.task for p in placed.partitions] for name, placed in client.layout.items()} == {"w": [0], "b": [1]}
    return client


def test_a_push_that_fails_for_good_on_one_shard_is_counted_acknowledged_by_the_shards_that_replied(
        monkeypatch: pytest.MonkeyPatch) -> None:
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    grads = {"w": DenseGradient(np.ones(2, np.float32)), "b": DenseGradient(np.ones(1, np.float32))}
    shards.members[P0].replies.append(InvalidArgumentError("bad gradient"))  # not a failover: raised
    with pytest.raises(InvalidArgumentError, match="bad gradient"):
        client.push(grads)
    # Shard 1 applied it and said so: its count has it (else updates_lost would miss a push that shard lost later).
    assert client.acked == {1: 1}
    client.push(grads)
    acked = [(m["push_id"], m["acked"]) for m in shards.members[P1].metas if "push_id" in m]
    assert acked == [(1, 0), (2, 1)] and client.acked == {0: 1, 1: 2}


def test_a_push_pull_sends_a_plain_pull_to_a_shard_it_pushes_nothing_to(monkeypatch: pytest.MonkeyPatch) -> None:
    # A pull-only shard got an empty push without a push_id, which a replicated primary counted as a push applied
    # (pushes_applied above pushes_acknowledged) and recorded as an entry every backup had to acknowledge.
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    shards.members[P0].replies.append(PushPullReply(PushReply(step=8), PullReply(8, {})).to_frame())
    shards.members[P1].replies.append(PullReply(None, {"b/part_0": np.full(1, 3.0, np.float32)}).to_frame())
    result, values = client.push_pull({"w": DenseGradient(np.ones(2, np.float32))}, {"b": None})
    assert result.step == 8 and values["b"].tolist() == [3.0]
    assert shards.members[P1].calls[-1] == "Pull" and shards.members[P0].calls[-1] == "PushPull"
    assert client.acked == {0: 1}


# ---- when a primary counts as gone (issue 28: a slow answer never promotes a backup) ------------------------
def test_a_silent_primary_is_promoted_over_only_once_it_answered_nothing_for_the_failover_timeout() -> None:
    shards, clock = healthy(), Clock()
    r = router(shards, clock)
    r.resolve(0)
    clock.now += 60.0  # idle time between calls is no silence: it starts with the first call left unanswered
    shards.stalled.add(P0)  # SIGSTOPped, or its link cut: every call times out
    for _ in range(2):
        with pytest.raises(TaskUnavailableError, match=r"no member of ps shard 0 can serve it"):
            r.resolve(0, DeadlineExceededError("late"), timeout=0)
        clock.now += 9.9 / 2
    assert PromoteRequest.METHOD not in shards.members[B0].calls and r.routes[0] == (P0, 1)
    clock.now += 0.2  # 10.1 s without an answer
    assert r.resolve(0, DeadlineExceededError("late"), timeout=0)
    assert r.routes[0] == (B0, 2) and shards.members[B0].calls.count(PromoteRequest.METHOD) == 1


def test_a_primary_that_answers_again_starts_its_silence_over() -> None:
    shards, clock = healthy(), Clock()
    r = router(shards, clock)
    r.resolve(0)
    shards.stalled.add(P0)
    with pytest.raises(TaskUnavailableError):
        r.resolve(0, DeadlineExceededError("late"), timeout=0)
    clock.now += 9.0
    shards.stalled.discard(P0)
    assert not r.resolve(0, DeadlineExceededError("late"), timeout=0)  # it answers: the error is the call's own
    shards.stalled.add(P0)
    clock.now += 9.0
    with pytest.raises(TaskUnavailableError):
        r.resolve(0, DeadlineExceededError("late"), timeout=0)
    assert PromoteRequest.METHOD not in shards.members[B0].calls


def test_a_refusal_by_a_primary_this_client_never_reached_does_not_promote_its_backup() -> None:
    # The flake seen under load: at connect time the worker's channel to ps task 0 still held the refusal of a
    # connection made before that task listened, while its backup already held the fresh shard's state; the
    # worker took the primary for dead and promoted the backup, with the primary alive.
    shards, clock = healthy(), Clock()
    shards.set(P0, None)
    r = router(shards, clock)
    with pytest.raises(TaskUnavailableError):
        r.resolve(0, timeout=0)
    assert PromoteRequest.METHOD not in shards.members[B0].calls
    shards.set(P0, "primary", 1, primary=P0, backups=(B0,))
    assert r.resolve(0) and r.routes[0] == (P0, 1)
    # Once it answered, a refused connection is proof: its process is gone.
    shards.set(P0, None)
    assert r.resolve(0, TaskUnavailableError("down"), timeout=0) and r.routes[0] == (B0, 2)


def test_a_backup_that_is_only_slow_is_not_dropped_until_it_answered_nothing_for_the_failover_timeout() -> None:
    shards, clock = healthy(), Clock()
    r = router(shards, clock)
    r.resolve(0)
    shards.stalled.add(B0)
    error = TaskUnavailableError(f"{P0}: shard 0: backup {B0} did not acknowledge entry 9 within 5 s")
    with pytest.raises(TaskUnavailableError):
        r.resolve(0, error, timeout=0)
    assert DropBackupRequest.METHOD not in shards.members[P0].calls
    clock.now += 10.1
    assert r.resolve(0, error, timeout=0) and r.routes[0] == (P0, 2)
    assert shards.members[P0].calls.count(DropBackupRequest.METHOD) == 1


def test_a_push_that_timed_out_counts_as_silence_from_when_it_was_sent() -> None:
    shards, clock = healthy(), Clock()
    r = router(shards, clock)
    r.resolve(0)
    shards.stalled.add(P0)

    class TimesOut:
        def result(self) -> Frame:  # waited for rpc_timeout: 60 s without an answer
            clock.now += 60.0
            raise DeadlineExceededError(f"{P0}: Push: DEADLINE_EXCEEDED")

    replies = r.gather({0: TimesOut()}, lambda shard: r.channels[shard].call_async("Push"))
    assert sorted(replies) == [0] and r.routes[0] == (B0, 2)
    assert shards.members[B0].calls.count(PromoteRequest.METHOD) == 1


def test_a_call_answered_after_a_silence_ends_it() -> None:
    shards, clock = healthy(), Clock()
    r = router(shards, clock)
    r.resolve(0)
    shards.stalled.add(P0)
    with pytest.raises(TaskUnavailableError):
        r.resolve(0, DeadlineExceededError("late"), timeout=0)
    shards.stalled.discard(P0)
    r.gather({0: r.channels[0].call_async("Push")}, lambda shard: r.channels[shard].call_async("Push"))
    clock.now += 30.0  # idle: no silence
    shards.stalled.add(P0)
    with pytest.raises(TaskUnavailableError):
        r.resolve(0, DeadlineExceededError("late"), timeout=0)
    assert PromoteRequest.METHOD not in shards.members[B0].calls and r.routes[0] == (P0, 1)


def test_a_refused_connection_reads_as_refused_over_either_carrier() -> None:
    import socket

    from psflow.ps.failover import refused
    from psflow.rpc.tcp import TcpChannel

    # gRPC's words for a dead process's address ...
    assert refused(TaskUnavailableError(f"{P0}: Push: UNAVAILABLE: failed to connect to all addresses; last error: "
                                        "UNKNOWN: ipv4:127.0.0.1:9: Failed to connect to remote host: Connection refused"))
    assert not refused(DeadlineExceededError(f"{P0}: Push: DEADLINE_EXCEEDED: Deadline Exceeded"))

    # ... and the tcp carrier's, whose task no longer answers over gRPC either (a port nothing listens on).
    class Gone:
        task = P0

        def call(self, method: str, meta: Mapping[str, Any] | None = None, arrays: Any = None, *,
                 timeout: float | None = None) -> Frame:
            raise TaskUnavailableError(f"{P0}: {method}: UNAVAILABLE")

        def close(self) -> None:
            pass

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    channel = TcpChannel(P0, "127.0.0.1", port, ConnectConfig(connect_timeout=2.0), discovery=Gone())  # type: ignore[arg-type]
    with pytest.raises(TaskUnavailableError) as caught:
        channel.call("Push", {}, timeout=2.0)
    channel.close()
    assert refused(caught.value), caught.value


def test_a_primary_caught_just_before_it_took_the_shard_is_asked_again_before_its_backup_is_promoted() -> None:
    # Seen under load at a run's start: one round of statuses read ps task 0 still "joining at epoch 0" and, a moment
    # later, its backup already holding the fresh shard's state at epoch 1 (the members are asked in parallel, so
    # a round is no snapshot). The primary's answer predates the backup's: it is asked once more.
    shards = FakeShards()
    shards.set(B0, "backup", 1, primary=P0)
    shards.set(P1, "primary", 1, primary=P1, backups=(B1,))
    shards.set(B1, "backup", 1, primary=P1)
    answers = [status(P0, "joining", 0, has_state=False), status(P0, "primary", 1, primary=P0, backups=(B0,))]
    original = shards.answer

    def answer(member: Member, method: str, meta: Mapping[str, Any]) -> Frame | RpcError:
        if member.task == P0 and method == "ReplicaStatus":
            member.calls.append(method)
            return (answers.pop(0) if len(answers) > 1 else answers[0]).to_frame()
        return original(member, method, meta)

    shards.answer = answer  # type: ignore[method-assign]
    r = router(shards)
    assert r.resolve(0) and r.routes[0] == (P0, 1)
    assert PromoteRequest.METHOD not in shards.members[B0].calls


def test_a_sync_push_waiting_for_its_step_outlasts_the_step_timeout_so_the_wait_never_starts_a_failover(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The ps task answers a sync push by --sync-timeout at the latest (the step applied, or refused naming the
    # missing workers); the client's deadline is --rpc-timeout beyond it, so a long aggregation is never a failure.
    shards = healthy()
    monkeypatch.setattr("psflow.ps.client.open_channel", lambda transport, task, address, service, config:
                        shards.open(task, address))
    client = ParameterClient(CLUSTER, _layout(CLUSTER).placements(), client_name="/job:worker/task:0",
                             config=ConnectConfig(rpc_timeout=7.0), sync=SyncConfig("sync", 2, 2, timeout=30.0))
    client.connect()
    client.push_detailed({"w": DenseGradient(np.ones(2, np.float32))}, read_step=0)
    assert shards.members[P0].timeouts[-1] == shards.members[P1].timeouts[-1] == 37.0
    assert client.router is not None and client.router.failover_timeout == 10.0
    assert not any(m.calls.count("ReplicaStatus") > 1 for m in shards.members.values())  # no failover was started


def test_a_push_the_serving_primary_failed_as_unavailable_is_sent_to_it_again_never_raised() -> None:
    """A backup slow to acknowledge (alive: it answers its status) makes the primary fail the push as
    UNAVAILABLE; the primary still serves, so the push goes to it again (its push_id makes it apply once)
    instead of ending the worker, and nobody is promoted or dropped."""
    shards = healthy()
    r = router(shards)
    r.resolve(0)
    shards.members[P0].replies.append(TaskUnavailableError(f"{P0}: backup {B0} of shard 0 did not acknowledge "
                                                           "entry 12 within 5 s"))
    replies = r.gather({0: r.channels[0].call_async("Push")}, lambda t: r.channels[t].call_async("Push"))
    assert sorted(replies) == [0]
    assert shards.members[P0].calls.count("Push") == 2 and r.routes[0] == (P0, 1)
    assert PromoteRequest.METHOD not in shards.members[B0].calls
    assert DropBackupRequest.METHOD not in shards.members[P0].calls


# ---- the other calls a worker or the chief makes to a shard fail over too ---------------------------------------
def test_a_register_whose_shard_primary_died_goes_to_the_promoted_backup(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose Register was sent to a dead primary exited 1 (``Register: UNAVAILABLE``) although its router
    could promote the backup: Register is idempotent, so it is resent there like a push."""
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    shards.set(P1, None)  # died after this client reached it: its host refuses the connection
    ready = RegisterReply(created=False, ready=True, init_count=1).to_frame()
    shards.members[P0].replies.append(ready)
    shards.members[B1].replies.append(ready)
    assert client.register(OptimizerSpec("sgd", {"learning_rate": 0.1})) is False
    assert shards.members[B1].calls[-1] == "Register" and client.channels[1].task == B1
    assert client.router is not None and client.router.routes[1] == (B1, 2)


def test_a_call_of_the_chief_to_a_dead_primary_goes_to_the_promoted_backup(monkeypatch: pytest.MonkeyPatch) -> None:
    # SetReady, BeginRestore, LoadShard, SaveShard, Fence, CheckpointStatus: ParameterClient.call / call_async.
    shards = healthy()
    client = _two_shard_client(shards, monkeypatch)
    shards.set(P1, None)
    shards.members[B1].replies.append(SetReadyReply().to_frame())
    assert client.call(1, SetReadyRequest("/job:worker/task:0")).meta == {"ready": True}
    assert shards.members[B1].calls[-1] == "SetReady"
    # A refusal that is not a failover's is the call's own, raised as before.
    shards.members[B1].replies.append(InvalidArgumentError("not registered"))
    with pytest.raises(InvalidArgumentError, match="not registered"):
        client.call_async(1, SetReadyRequest("/job:worker/task:0")).result()
