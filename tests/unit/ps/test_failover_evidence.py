"""What proves a shard member gone to a client (psflow/ps/member_evidence.py, through psflow/ps/failover.py's
ShardRouter): silence before a member ever answered, and what a save's router inherits from the data client's.

Fake members and a clock moved by hand (tests/unit/ps/test_failover.py's); real members meet a save's client in
tests/integration/test_ps_replication_fresh_client.py.
"""

from __future__ import annotations

import pytest
from test_failover import B0, CLUSTER, P0, Clock, FakeShards, healthy

from psflow.ps.control_routes import ControlRouter
from psflow.ps.failover import ShardRouter
from psflow.ps.protocol.replication import PromoteRequest
from psflow.rpc.api import ConnectConfig, DeadlineExceededError, TaskUnavailableError

pytestmark = pytest.mark.timeout(60)

REFUSED = TaskUnavailableError(f"{P0}: Stats: UNAVAILABLE: failed to connect to all addresses; last error: UNKNOWN: "
                               "ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused")


def router(shards: FakeShards, clock: Clock, *, name: str = "/job:worker/task:0") -> ShardRouter:
    """failover_timeout 10 s, the start timeout (connect_timeout) 60 s."""
    return ShardRouter(CLUSTER, shards.open, client_name=name,
                       config=ConnectConfig(backoff_initial=0.001, connect_timeout=60.0), failover_timeout=10.0,
                       wait_timeout=5.0, clock=clock)


def fresh_shard_slow_primary() -> FakeShards:
    """ps:0 not listening yet (every call refused); its backup not joined yet (it holds nothing before its primary
    started the fresh shard and took it into its view)."""
    shards = healthy()
    shards.set(P0, None)
    shards.set(B0, "backup", 0, has_state=False)
    return shards


def started(shards: FakeShards) -> None:
    """ps:0 started the fresh shard at epoch 1 with ps_backup:0 in its view."""
    shards.set(P0, "primary", 1, primary=P0, backups=(B0,))
    shards.set(B0, "backup", 1, primary=P0)


# ---- bug 1: a slow-starting primary is not yet up, not silent -------------------------------------------------
def test_a_primary_that_never_answered_is_not_promoted_over_after_the_failover_timeout() -> None:
    # Seen beside CPU hogs (load ~20): the launcher's router asked ps:0 from its start, ps:0 took 11.5-12 s to serve
    # (over --ps-failover-timeout 10 s); its backup, joined to it at epoch 1, was promoted to epoch 2 66 ms after
    # ps:0 became the fresh shard's primary, before any training.
    shards, clock = fresh_shard_slow_primary(), Clock()
    r = router(shards, clock, name="launcher")
    for _ in range(12):
        with pytest.raises(TaskUnavailableError, match="no member of ps shard 0 can serve it"):
            r.resolve(0, timeout=0)
        clock.now += 1.0
    started(shards)
    shards.stalled.add(P0)  # listening now, but too slow for a 2 s status deadline (the busy machine)
    for _ in range(3):
        with pytest.raises(TaskUnavailableError):
            r.resolve(0, timeout=0)
        clock.now += 1.0
    assert PromoteRequest.METHOD not in shards.members[B0].calls, "promoted over a primary that never answered"
    assert r.gone(P0) is None
    shards.stalled.discard(P0)
    assert r.resolve(0) and r.routes[0] == (P0, 1)


def test_a_primary_that_never_answered_counts_as_gone_once_silent_for_the_start_timeout() -> None:
    shards, clock = fresh_shard_slow_primary(), Clock()
    r = router(shards, clock)
    with pytest.raises(TaskUnavailableError):
        r.resolve(0, timeout=0)
    clock.now += 59.9
    assert r.gone(P0) is None
    clock.now += 0.2
    assert r.gone(P0) == "never answered in 60.1 s"


def test_a_client_that_never_reached_a_dead_primary_promotes_its_backup_after_the_failover_timeout() -> None:
    # A worker restarted (or a client started) after shard 0's primary died, nobody having promoted its backup yet:
    # the backup holds the variables in a view under ps:0, so ps:0 was up (it started the shard and took the backup
    # in); its silence since this client saw that counts against --ps-failover-timeout (10 s), not against
    # --connect-timeout (60 s) as a start would.
    shards, clock = healthy(), Clock()
    shards.set(P0, None)  # SIGKILLed before this client started
    r = router(shards, clock, name="/job:worker/task:1")
    with pytest.raises(TaskUnavailableError):
        r.resolve(0, timeout=0)
    clock.now += 9.9
    assert r.gone(P0) is None
    with pytest.raises(TaskUnavailableError):
        r.resolve(0, timeout=0)
    clock.now += 0.2
    assert r.gone(P0) == f"answered nothing for 10.1 s since {B0}'s view named it (it never answered here)"
    assert r.resolve(0, timeout=0) and r.routes[0] == (B0, 2)


def test_once_a_primary_answered_its_silence_counts_from_the_first_call_left_unanswered_after_that() -> None:
    shards, clock = fresh_shard_slow_primary(), Clock()
    r = router(shards, clock)
    with pytest.raises(TaskUnavailableError):
        r.resolve(0, timeout=0)
    clock.now += 30.0  # 30 s not yet up: no silence of a member that answered
    started(shards)
    assert r.resolve(0) and r.routes[0] == (P0, 1)
    shards.stalled.add(P0)
    with pytest.raises(TaskUnavailableError):
        r.resolve(0, DeadlineExceededError("late"), timeout=0)
    clock.now += 9.9
    assert r.gone(P0) is None
    clock.now += 0.2
    assert r.resolve(0, DeadlineExceededError("late"), timeout=0) and r.routes[0] == (B0, 2)


# ---- bug 2: a save's router starts from what the data client's knows ----------------------------------------
def test_a_save_router_started_at_the_data_routers_view_takes_a_refusal_of_a_primary_it_reached_as_proof() -> None:
    # The data client reached ps:0, which then died; nobody promoted its backup yet. A save's router (a twin started
    # at the data router's routes) gets a refusal from ps:0: proof, since the data client had reached that process,
    # so it promotes at once rather than waiting for another client's promotion or --ps-failover-timeout.
    shards, clock = healthy(), Clock()
    data = router(shards, clock)
    assert data.resolve(0) and data.routes[0] == (P0, 1)
    shards.set(P0, None)  # SIGKILLed: its address refuses connections
    save = data.twin("/job:worker/task:0 (save)")
    save.start_at(data)
    assert save.routes[0] == (P0, 1)
    assert save.resolve(0, REFUSED, timeout=0), "the save's router waited for a promotion by somebody else"
    assert save.routes[0] == (B0, 2) and shards.members[B0].calls.count(PromoteRequest.METHOD) == 1
    assert save.gone(P0) == "refused the connection"


def test_a_save_router_inherits_a_silence_the_data_router_is_counting() -> None:
    shards, clock = healthy(), Clock()
    data = router(shards, clock)
    data.resolve(0)
    shards.stalled.add(P0)
    with pytest.raises(TaskUnavailableError):
        data.resolve(0, DeadlineExceededError("late"), timeout=0)
    clock.now += 10.1
    save = data.twin("save")
    save.start_at(data)
    assert save.gone(P0) == "answered nothing for 10.1 s"
    assert data.gone(P0) == "answered nothing for 10.1 s"  # the data router's own evidence is untouched


# ---- the chief election's router (ControlRouter, a twin made at the worker's start) ----------------------------
def test_a_twin_starts_from_the_evidence_of_the_router_it_was_made_from() -> None:
    # psflow/train/worker.py makes the election's router (data.twin) right after the data client connected, so the
    # data client reached every primary; a primary that died later, nobody having promoted yet: its refusal is proof
    # to the twin's first call (the election's promotion, a new chief's fence), not a start to wait out.
    shards, clock = healthy(), Clock()
    data = router(shards, clock)
    assert data.resolve(0) and data.routes[0] == (P0, 1)
    control = ControlRouter(data.twin("/job:worker/task:0 (chief election)"))
    shards.set(P0, None)  # SIGKILLed: its address refuses connections
    assert control.primary(0) == B0, "the twin took the dead primary it had never reached itself for one starting"
    assert shards.members[B0].calls.count(PromoteRequest.METHOD) == 1
