"""Shard 0's lease table replicated with the shard (issue 28, psflow/ps/replication/leases.py): a lease the
primary grants is held by its backups' tables at the same epoch before the candidate hears of it; a promoted
backup renews it for its holder and refuses it to anyone else while it lives; a joining member's snapshot
carries the table; a member that is not the primary, or a deposed one, changes nothing and names the primary.
In-process members (tests/replica_shard.py), no sockets."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
from replica_shard import PRIMARY, InProcessShard, Link, backup

from psflow.coord import CampaignTimeoutError, CoordinationConfig
from psflow.coord.embedded import EmbeddedBackend
from psflow.coord.lease_table import NOT_PRIMARY, LeaseTable
from psflow.ps.control_routes import ControlRouter
from psflow.ps.failover import ShardRouter
from psflow.rpc.api import FailedPreconditionError, Handler, TaskUnavailableError
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.final_duties import take_final_duties
from psflow.train.recovery import Leadership

pytestmark = pytest.mark.timeout(60)

TTL = 30.0  # no lease expires during a test by itself


class Leases:
    """Each member's lease table, served through its replication as psflow.server serves it."""

    def __init__(self, shard: InProcessShard) -> None:
        self.shard = shard
        self.tables: dict[str, LeaseTable] = {}
        self.handlers: dict[str, dict[str, Handler]] = {}
        for member in shard.members:
            self.serve(member)

    def serve(self, member: str) -> None:
        """(again after ``shard.add(member)``: a new process of it)"""
        # No wall-clock floor under the epochs (a new one is the last + 1): an epoch then says where it came
        # from, and no test depends on how many milliseconds passed between two campaigns (one did, under load).
        self.tables[member] = LeaseTable(member, wall_ms=lambda: 0)
        self.handlers[member] = self.shard.replicas[member].serve_leases(self.tables[member])

    def call(self, member: str, method: str, **meta: Any) -> dict[str, Any]:
        return dict(InProcessChannel(member, self.handlers[member]).call(method, meta).meta)

    def backend(self, first: str = PRIMARY, *, ttl: float = TTL, promotes: bool = False,
                clock: Callable[[], float] = time.monotonic) -> EmbeddedBackend:
        """The client the workers use, whose calls reach the members' handlers (UNAVAILABLE while cut off);
        ``promotes``: it gets a backup promoted over a dead primary as a worker's does (its own router to the
        members' parameter services; a member silent for 0.3 s of ``clock`` is gone)."""
        members = tuple((m, f"address-of-{m}") for m in self.shard.members)
        config = CoordinationConfig("embedded", f"address-of-{first}", lease_ttl=ttl, members=members)
        promote = None
        if promotes:
            router = ShardRouter(self.shard.cluster, lambda task, address: Link(self.shard, task),
                                 client_name="/job:worker/task:0 (chief election)", failover_timeout=0.3,
                                 status_timeout=1.0, clock=clock)
            control = ControlRouter(router)
            promote = lambda reached: control.primary(0, reached)  # noqa: E731
        return EmbeddedBackend(config, connect=lambda task, address: _Channel(self, task), promote=promote)

    def campaign(self, member: str, candidate: str) -> dict[str, Any]:
        return self.call(member, "Campaign", election="chief", candidate=candidate, holder=f"{candidate}#1", ttl=TTL)

    def renew(self, member: str, candidate: str, epoch: int) -> dict[str, Any]:
        return self.call(member, "Renew", election="chief", holder=f"{candidate}#1", epoch=epoch, ttl=TTL)


class _Channel:
    def __init__(self, leases: Leases, task: str) -> None:
        self.leases, self.task, self.address = leases, task, f"address-of-{task}"

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        if self.task in self.leases.shard.cut:
            raise TaskUnavailableError(f"{self.task} is cut off (test)")
        return InProcessChannel(self.task, self.leases.handlers[self.task]).call(method, meta, arrays)

    def close(self) -> None:
        """Nothing to close."""


@pytest.fixture
def leases(make_shard: Callable[..., InProcessShard]) -> Leases:
    shard = make_shard(backups=1)
    served = Leases(shard)
    shard.start()
    shard.wait_view()
    return served


def test_a_granted_lease_is_in_the_backups_table_at_the_same_epoch_before_the_reply(leases: Leases) -> None:
    granted = leases.campaign(PRIMARY, "w0")
    assert granted["granted"]
    held = leases.tables[backup(0)].leader("chief")
    assert held is not None and (held["candidate"], held["epoch"]) == ("w0", granted["epoch"])
    assert leases.tables[backup(0)].export() == leases.tables[PRIMARY].export()
    leases.call(PRIMARY, "Resign", election="chief", holder="w0#1", epoch=granted["epoch"])
    assert leases.tables[backup(0)].leader("chief") is None


def test_a_promoted_backup_renews_the_holders_lease_and_refuses_it_to_another_worker(leases: Leases) -> None:
    epoch = leases.campaign(PRIMARY, "w0")["epoch"]
    leases.shard.cut.add(PRIMARY)  # the primary is gone: a client promotes the backup
    leases.shard.promote(backup(0), 1)
    assert leases.renew(backup(0), "w0", epoch) == {"epoch": epoch, "ttl": TTL}
    refused = leases.campaign(backup(0), "w1")
    assert not refused["granted"] and (refused["leader"], refused["epoch"]) == ("w0", epoch)
    leases.call(backup(0), "Resign", election="chief", holder="w0#1", epoch=epoch)
    assert leases.campaign(backup(0), "w1")["epoch"] == epoch + 1  # the epochs go on from the replicated ones


def test_a_member_that_is_not_the_primary_changes_nothing_and_names_the_primary(leases: Leases) -> None:
    reply = leases.campaign(backup(0), "w1")
    assert reply[NOT_PRIMARY] and reply["primary"] == PRIMARY
    assert leases.tables[backup(0)].leader("chief") is None and leases.tables[PRIMARY].leader("chief") is None
    assert leases.call(backup(0), "Leader", election="chief")["primary"] == PRIMARY


def test_a_joining_members_snapshot_carries_the_table(leases: Leases) -> None:
    epoch = leases.campaign(PRIMARY, "w0")["epoch"]
    shard = leases.shard
    shard.add(backup(0))  # a new process of the backup: empty, it rebuilds from the primary's snapshot
    leases.serve(backup(0))
    assert leases.tables[backup(0)].leader("chief") is None
    shard.start(backup(0))
    shard.wait_view()
    held = leases.tables[backup(0)].leader("chief")
    assert held is not None and (held["candidate"], held["epoch"]) == ("w0", epoch)


def test_a_deposed_primary_refuses_coordination_writes(leases: Leases) -> None:
    epoch = leases.campaign(PRIMARY, "w0")["epoch"]
    shard = leases.shard
    shard.cut.add(PRIMARY)  # cut off: a client promotes the backup...
    shard.promote(backup(0), 1)
    shard.cut.discard(PRIMARY)  # ...and the old primary is back, still believing it is primary
    renewed = leases.renew(PRIMARY, "w0", epoch)  # its entry is refused by the new primary: it learns it is deposed
    assert renewed[NOT_PRIMARY] and renewed["primary"] == backup(0), renewed
    taken = leases.campaign(PRIMARY, "w1")
    assert taken[NOT_PRIMARY] and taken["primary"] == backup(0), taken
    assert leases.renew(backup(0), "w0", epoch)["epoch"] == epoch  # the lease lives on at the new primary
    with pytest.raises(FailedPreconditionError, match="lost"):
        leases.renew(backup(0), "w1", epoch + 1)


def test_the_client_follows_shard_0s_primary_and_keeps_its_lease_across_the_promotion(leases: Leases) -> None:
    chief, other = leases.backend(), leases.backend(first=backup(0))
    try:
        lease = chief.campaign("w0", timeout=5.0)
        assert other.leader() is not None  # asked the backup first: it named the primary
        leases.shard.cut.add(PRIMARY)  # the primary dies; a worker's data client promotes the backup
        leases.shard.promote(backup(0), 1)
        renewed = chief.renew(lease)  # the primary is unreachable: the call goes on to the new one
        assert renewed.epoch == lease.epoch and chief.is_held(renewed)
        with pytest.raises(CampaignTimeoutError, match="still led by 'w0'"):
            other.campaign("w1", timeout=0.3)
        leases.shard.cut.discard(PRIMARY)
        leases.shard.add(PRIMARY)  # the old primary restarted: it rebuilds from the new one, the table with it
        leases.serve(PRIMARY)
        leases.shard.start(PRIMARY)
        leases.shard.wait_view(backup(0), (PRIMARY,))
        restarted = leases.backend()  # asks the restarted ps task first: it names the new primary
        assert restarted.renew(renewed).epoch == lease.epoch
        restarted.close()
    finally:
        chief.close()
        other.close()


def test_a_chief_whose_lease_was_not_confirmed_stops_renewing_it_and_is_elected_again(leases: Leases) -> None:
    """The last worker confirms its lease before its final duties (psflow/train/final_duties.py). Asked while
    shard 0's primary is dead and no backup promoted yet, no member answers: it no longer acts under that lease
    and campaigns anew. Before, its backend went on renewing the old lease in the background, which the promoted
    backup serves (the table is replicated), so its own campaign was refused until it gave up (no final
    checkpoint: the run failed)."""
    ttl = 1.0
    members = tuple((m, f"address-of-{m}") for m in leases.shard.members)
    config = CoordinationConfig("embedded", f"address-of-{PRIMARY}", lease_ttl=ttl, members=members)
    backend = EmbeddedBackend(config, connect=lambda task, address: _Channel(leases, task))
    leadership = Leadership(backend, "w0")
    try:
        first = leadership.campaign(timeout=5.0)
        assert first is not None
        leases.shard.cut.add(PRIMARY)  # the primary dies; no worker's data client promoted the backup yet
        assert leadership.confirmed_lease() is None
        leases.shard.promote(backup(0), 1)
        take_final_duties(leadership, ttl, 30.0, None)  # campaigns for 30 s at most (a safety net)
        lease = leadership.lease()
        assert lease is not None and lease.epoch > first.epoch, lease
    finally:
        backend.close()


@pytest.mark.parametrize("promotes", [True, False])
def test_the_election_gets_a_backup_promoted_when_shard_0s_primary_dies_and_no_data_call_follows(
        leases: Leases, promotes: bool) -> None:
    """Issue 28's review, item 1: the primary dies after the last worker's leave() and before its final duties,
    so no data client's failover promotes the backup. The election's client promotes it the way a data client
    would (the primary proven gone: here silent for the failover timeout). Without that (``promotes=False``,
    as before) no member answers as primary and the campaign fails."""
    backend = leases.backend(promotes=promotes)
    try:
        lease = backend.campaign("w0", timeout=5.0)
        backend.resign(lease)  # its data ended: it hands the duties on
        leases.shard.cut.add(PRIMARY)  # the primary dies; no data call follows
        if not promotes:
            with pytest.raises(CampaignTimeoutError):
                backend.campaign("w1", timeout=2.0)
            return
        elected = backend.campaign("w1", timeout=30.0)  # the last worker's final campaign (30 s: a safety net)
        assert elected.epoch > lease.epoch  # the replicated table's epochs go on
        status = leases.shard.status(backup(0))
        assert (status.role, status.epoch) == ("primary", 2), status
        assert backend.renew(elected).epoch == elected.epoch
    finally:
        backend.close()


def test_the_election_promotes_nothing_while_the_primary_only_is_slow_to_answer(leases: Leases) -> None:
    """The same checks as the data path's: a primary that answers nothing is gone only after the failover
    timeout (0.3 s of the router's clock, moved by hand: the test does not race a real 0.3 s against a
    0.15 s campaign); until then the campaign is not answered and no backup is promoted. (The primary answered
    first: one that never answered is not up yet, gone only after the start timeout, tests/unit/ps/
    test_failover_evidence.py.)"""
    now = [1000.0]
    backend = leases.backend(promotes=True, clock=lambda: now[0])
    try:
        backend.resign(backend.campaign("w0", timeout=5.0))  # the primary answered
        leases.shard.cut.add(PRIMARY)
        with pytest.raises(CampaignTimeoutError):
            backend.campaign("w0", timeout=0.5)
        assert leases.shard.status(backup(0)).role == "backup"
        now[0] += 1.0  # silent for longer than the failover timeout: gone, the backup is promoted
        assert backend.campaign("w0", timeout=30.0).epoch > 0
        assert leases.shard.status(backup(0)).role == "primary"
    finally:
        leases.shard.cut.discard(PRIMARY)
        backend.close()
