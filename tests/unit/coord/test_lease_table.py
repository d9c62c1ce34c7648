"""LeaseTable (the embedded backend's state) and FenceGuard, with a fake clock; no sockets."""

from __future__ import annotations

import pytest

from psflow.coord import CoordinationConfig, FencedError, backend_names, create_backend
from psflow.coord.fence import FenceGuard
from psflow.coord.lease_table import LeaseTable
from psflow.rpc.api import InvalidRequest, PreconditionFailed
from psflow.rpc.framing import Frame


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_table(wall_ms: int = 5) -> tuple[LeaseTable, FakeClock]:
    clock = FakeClock()
    return LeaseTable("/job:ps/task:0", clock=clock, wall_ms=lambda: wall_ms), clock


def test_one_holder_at_a_time_and_expiry_hands_over_with_a_higher_epoch() -> None:
    table, clock = make_table()
    a = table.campaign("chief", "a", "a#1", 2.0)
    assert a["granted"] and a["epoch"] == 5  # floor: the wall clock in ms
    b = table.campaign("chief", "b", "b#1", 2.0)
    assert not b["granted"] and b["leader"] == "a" and b["retry_after"] == pytest.approx(2.0)
    clock.now += 1.0
    table.renew("chief", "a#1", 5, 2.0)           # renewed at t+1: lives until t+3
    clock.now += 1.5
    assert not table.campaign("chief", "b", "b#1", 2.0)["granted"]
    clock.now += 0.6                              # t+3.1: expired
    assert table.leader("chief") is None
    b = table.campaign("chief", "b", "b#1", 2.0)
    assert b["granted"] and b["epoch"] == 6
    with pytest.raises(PreconditionFailed, match="lost .*held by 'b' at epoch 6"):
        table.renew("chief", "a#1", 5, 2.0)


def test_expired_lease_is_not_renewed_even_if_free() -> None:
    table, clock = make_table()
    table.campaign("chief", "a", "a#1", 1.0)
    clock.now += 1.0
    with pytest.raises(PreconditionFailed, match="now free"):
        table.renew("chief", "a#1", 5, 1.0)


def test_campaign_by_the_holder_is_idempotent_and_resign_frees() -> None:
    table, _ = make_table()
    first = table.campaign("chief", "a", "a#1", 1.0)
    assert table.campaign("chief", "a", "a#1", 1.0)["epoch"] == first["epoch"]
    assert table.resign("chief", "a#1", 999) == {"released": False}
    assert table.resign("chief", "a#1", first["epoch"]) == {"released": True}
    assert table.resign("chief", "a#1", first["epoch"]) == {"released": False}
    assert table.campaign("chief", "b", "b#1", 1.0)["epoch"] == first["epoch"] + 1


def test_epochs_follow_the_wall_clock_across_a_restart() -> None:
    old, _ = make_table(wall_ms=1000)
    assert old.campaign("chief", "a", "a#1", 1.0)["epoch"] == 1000
    new, _ = make_table(wall_ms=2000)             # ps task 0 restarted later: no reuse of old epochs
    assert new.campaign("chief", "b", "b#1", 1.0)["epoch"] == 2000


def test_elections_are_independent() -> None:
    table, _ = make_table()
    assert table.campaign("chief", "a", "a#1", 1.0)["granted"]
    assert table.campaign("evaluator", "b", "b#1", 1.0)["granted"]


@pytest.mark.parametrize("meta", [
    {}, {"election": "", "candidate": "a", "holder": "h", "ttl": 1.0},
    {"election": "a/b", "candidate": "a", "holder": "h", "ttl": 1.0},
    {"election": "c", "candidate": 3, "holder": "h", "ttl": 1.0},
    {"election": "c", "candidate": "a", "holder": "h", "ttl": 0.0},
    {"election": "c", "candidate": "a", "holder": "h", "ttl": True},
    {"election": "c", "candidate": "a", "holder": "h", "ttl": 1e9},
])
def test_malformed_requests_are_invalid(meta: dict[str, object]) -> None:
    table, _ = make_table()
    with pytest.raises(InvalidRequest):
        table.handlers()["Campaign"](Frame(meta=dict(meta)))


def test_fence_guard_records_the_highest_and_refuses_lower() -> None:
    guard = FenceGuard("/job:ps/task:1")
    guard.check(5, holder="a")
    guard.check(5, holder="a")                    # same leader writes again
    guard.check(7, holder="b")
    with pytest.raises(FencedError, match=r"ps/task:1: write from a with epoch 5 refused: 'chief' is fenced at epoch 7 \(by b\)"):
        guard.check(5, holder="a")
    guard.check(1, scope="other")                 # scopes are independent
    assert guard.highest() == 7 and guard.highest("other") == 1
    with guard.hold(7, holder="b"):
        pass
    with pytest.raises(FencedError):
        with guard.hold(6):
            pytest.fail("a fenced write must not run")


def test_registry_names_and_unknown_backend() -> None:
    assert backend_names() == ["embedded", "zookeeper"]
    with pytest.raises(ValueError, match="unknown coordination backend 'etcd' .known: embedded, zookeeper"):
        create_backend(CoordinationConfig("etcd", "127.0.0.1:1"))
    with pytest.raises(ValueError, match="address is required"):
        CoordinationConfig("embedded", "")


def test_importing_psflow_coord_imports_no_backend_library() -> None:
    import subprocess
    import sys

    code = "import sys, psflow.coord; print('kazoo' in sys.modules, 'psflow.coord.zookeeper' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True).stdout
    assert out.split() == ["False", "False"]


# ---- the table's state as shard 0's replication carries it (issue 28) -----------------------------------

def test_a_loaded_table_holds_the_same_lease_epoch_and_counter() -> None:
    table, _ = make_table()
    a = table.campaign("chief", "a", "a#1", 2.0)
    copy, clock = make_table(wall_ms=0)  # another host: its wall clock is no floor here
    copy.load(table.export())
    assert copy.leader("chief") == {"candidate": "a", "epoch": a["epoch"], "remaining": pytest.approx(2.0)}
    assert copy.renew("chief", "a#1", a["epoch"], 2.0)["epoch"] == a["epoch"]
    assert not copy.campaign("chief", "b", "b#1", 2.0)["granted"]
    copy.resign("chief", "a#1", a["epoch"])
    assert copy.campaign("chief", "b", "b#1", 2.0)["epoch"] == a["epoch"] + 1  # the counter went on


def test_loading_replaces_the_whole_table() -> None:
    table, _ = make_table()
    table.campaign("chief", "a", "a#1", 2.0)
    other, _ = make_table()
    other.campaign("other", "x", "x#1", 2.0)
    other.load(table.export())
    assert other.leader("other") is None and other.leader("chief") is not None


def test_restarting_the_expiries_gives_every_lease_its_whole_ttl_from_now() -> None:
    table, clock = make_table()
    table.campaign("chief", "a", "a#1", 2.0)
    clock.now += 1.5
    table.restart_expiries()
    clock.now += 1.9  # 3.4 s after the grant, 1.9 s after the restart: still held
    assert not table.campaign("chief", "b", "b#1", 2.0)["granted"]
    clock.now += 0.2
    assert table.campaign("chief", "b", "b#1", 2.0)["granted"]


def test_restarting_the_expiries_revives_no_expired_lease() -> None:
    """A backup's lease expired by its own clock (no renewal carried for a ttl: the holder's own view, which ends
    a ttl after it sent its last renewal, ended before) stays expired when the backup is promoted: before, the
    promotion gave it a whole ttl again, and its holder's renewal of a lease it considered lost was granted."""
    table, clock = make_table()
    table.campaign("chief", "a", "a#1", 2.0)
    clock.now += 2.5
    table.restart_expiries()
    assert table.leader("chief") is None
    with pytest.raises(PreconditionFailed, match="now free"):
        table.renew("chief", "a#1", 5, 2.0)


def test_an_exported_table_holds_no_expired_lease() -> None:
    table, clock = make_table()
    table.campaign("chief", "a", "a#1", 2.0)
    clock.now += 2.5
    copy, _ = make_table()
    copy.load(table.export())
    assert copy.leader("chief") is None
    assert copy.campaign("chief", "b", "b#1", 2.0)["epoch"] == 6  # after a's epoch 5


@pytest.mark.parametrize("state", [None, [], {"grants": {"chief": {"epoch": "x"}}}, {"grants": [], "last_epoch": {}}])
def test_a_malformed_state_is_refused_naming_the_table(state: object) -> None:
    table, _ = make_table()
    with pytest.raises(ValueError, match="/job:ps/task:0"):
        table.load(state)


def test_a_fence_merged_from_another_members_refuses_what_that_member_refused() -> None:
    primary, backup = FenceGuard("/job:ps/task:0"), FenceGuard("/job:ps_backup/task:0")
    primary.check(6, holder="b#1")
    backup.check(3, scope="other", holder="x#1")
    backup.merge(primary.export())
    with pytest.raises(FencedError, match="fenced at epoch 6 \\(by b#1\\)"):
        backup.check(5, holder="a#1")
    assert backup.highest("other") == 3  # a scope the export lacks stays
    backup.merge({"chief": [4, "a#1"]})  # never lowered
    assert backup.highest() == 6


@pytest.mark.parametrize("state", [None, [], {"chief": 5}, {"chief": ["5", "h"]}])
def test_a_malformed_fence_state_is_refused_naming_the_task(state: object) -> None:
    with pytest.raises(ValueError, match="/job:ps/task:0"):
        FenceGuard("/job:ps/task:0").merge(state)
