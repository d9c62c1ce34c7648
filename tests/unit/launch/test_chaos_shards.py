"""Chaos on replicated ps shards (issue 28): ``kill:ps:N`` hits shard N's current primary, ``kill:ps-backup:N``
one of its backups, read from recorded ``ReplicaStatus`` answers; ``ps-backup`` without --ps-replicas is refused."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

import pytest

from psflow.cluster import ClusterSpec
from psflow.launch.chaos import ChaosInjector
from psflow.launch.chaos_plan import ChaosError, ChaosPlan
from psflow.launch.shard_targets import shard_target

pytestmark = pytest.mark.timeout(60)

REPLICATED = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3"],
                          "ps_backup": ["127.0.0.1:4", "127.0.0.1:5"]})
PLAIN = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3"]})
PIDS = {("ps", 0): 40, ("ps", 1): 41, ("worker", 0): 42, ("ps_backup", 0): 50, ("ps_backup", 1): 51}


def status(task: str, shard: int, role: str, epoch: int, *, backups: tuple[str, ...] = (),
           has_state: bool = True, primary: str | None = None) -> dict[str, Any]:
    """A ReplicaStatus answer as a member gives it."""
    return {"task": task, "shard": shard, "role": role, "epoch": epoch, "backups": list(backups),
            "primary": task if role == "primary" else primary, "has_state": has_state, "applied_seq": 0,
            "incarnation": 1, "lag": {}}


# Shard 0 after one failover: its backup was promoted at epoch 2; the restarted ps task 0 is its backup again.
AFTER_FAILOVER = [
    status("/job:ps/task:0", 0, "backup", 2, primary="/job:ps_backup/task:0"),
    status("/job:ps_backup/task:0", 0, "primary", 2, backups=("/job:ps/task:0",)),
]
FRESH = [
    status("/job:ps/task:1", 1, "primary", 1, backups=("/job:ps_backup/task:1",)),
    status("/job:ps_backup/task:1", 1, "backup", 1, primary="/job:ps/task:1"),
]


def test_the_target_is_the_current_primary_or_a_backup_of_its_view() -> None:
    assert shard_target("ps", 1, FRESH) == "/job:ps/task:1"
    assert shard_target("ps-backup", 1, FRESH) == "/job:ps_backup/task:1"
    assert shard_target("ps", 0, AFTER_FAILOVER) == "/job:ps_backup/task:0"   # ps:0 is no longer ps task 0
    assert shard_target("ps-backup", 0, AFTER_FAILOVER) == "/job:ps/task:0"
    # A deposed primary that has not heard yet still says primary, at the old epoch: the newer one is hit.
    stale = status("/job:ps/task:0", 0, "primary", 1, backups=("/job:ps_backup/task:0",))
    assert shard_target("ps", 0, [stale, AFTER_FAILOVER[1]]) == "/job:ps_backup/task:0"


def test_no_target_while_a_failover_is_under_way_or_the_view_has_no_backup() -> None:
    primary_dead = [status("/job:ps_backup/task:0", 0, "backup", 1, primary="/job:ps/task:0")]
    assert shard_target("ps", 0, primary_dead) is None
    empty = [status("/job:ps/task:0", 0, "primary", 3, has_state=False)]  # every replica lost: restarted empty
    assert shard_target("ps", 0, empty) is None
    joining = [status("/job:ps_backup/task:0", 0, "primary", 2),            # its backup rebuilds: not in the view
               status("/job:ps/task:0", 0, "joining", 2, primary="/job:ps_backup/task:0")]
    assert shard_target("ps-backup", 0, joining) is None
    silent_backup = [FRESH[0]]  # the view's backup did not answer (being restarted)
    assert shard_target("ps-backup", 1, silent_backup) is None


@dataclass
class FakeTask:
    name: str
    pid: int


def _injector(specs: list[str], sent: list[tuple[int, int]], answers: list[str | None]) -> ChaosInjector:
    """An injector on REPLICATED whose member() answers from ``answers`` (the last answer repeats)."""
    def member(job: str, shard: int) -> str | None:
        return answers.pop(0) if len(answers) > 1 else answers[0]

    return ChaosInjector(ChaosPlan.parse(specs), REPLICATED,
                         lambda job, i: FakeTask(f"/job:{job}/task:{i}", PIDS[(job, i)]),
                         send=lambda pid, sig: sent.append((pid, sig)), member=member)


def test_kill_ps_hits_the_member_named_when_it_fires_and_waits_through_a_failover() -> None:
    sent: list[tuple[int, int]] = []
    injector = _injector(["kill:ps:0@step=100"], sent, [None, "/job:ps_backup/task:0"])
    assert injector.poll(100) == [] and injector.pending() == 1  # nobody is primary at this moment
    (fired,) = injector.poll(101)
    assert (fired.task, fired.pid) == ("/job:ps_backup/task:0", 50)
    assert sent == [(50, signal.SIGKILL)]


def test_a_round_never_hits_one_member_twice() -> None:
    sent: list[tuple[int, int]] = []
    # Both faults resolve to ps task 0 at first (a stale answer): the second waits for another target.
    injector = _injector(["kill:ps:0@step=10", "stop:ps-backup:0@step=10"], sent,
                         ["/job:ps/task:0", "/job:ps/task:0", "/job:ps_backup/task:0"])
    assert [f.task for f in injector.poll(10)] == ["/job:ps/task:0"]
    assert [f.task for f in injector.poll(11)] == ["/job:ps_backup/task:0"]
    assert sent == [(40, signal.SIGKILL), (50, signal.SIGSTOP)]


def test_ps_backup_without_replicas_is_refused_naming_the_flag() -> None:
    with pytest.raises(ChaosError, match=r"kill:ps-backup:N needs --ps-replicas"):
        ChaosPlan.parse(["kill:ps-backup:0@step=5"]).resolve(PLAIN)
    with pytest.raises(ChaosError, match=r"no ps shard 2 \(shards 0-1\)"):
        ChaosPlan.parse(["kill:ps-backup:2@step=5"]).resolve(REPLICATED)


def test_without_replicas_kill_ps_is_the_ps_task_as_before() -> None:
    sent: list[tuple[int, int]] = []
    asked: list[tuple[str, int]] = []

    def member(job: str, shard: int) -> str | None:
        asked.append((job, shard))
        return None

    injector = ChaosInjector(ChaosPlan.parse(["kill:ps:1@step=5"]), PLAIN,
                             lambda job, i: FakeTask(f"/job:{job}/task:{i}", PIDS[(job, i)]),
                             send=lambda pid, sig: sent.append((pid, sig)), member=member)
    (fired,) = injector.poll(5)
    assert fired.task == "/job:ps/task:1" and sent == [(41, signal.SIGKILL)] and asked == []


def test_every_replica_of_a_shard_in_one_round_is_resolved_before_either_is_killed() -> None:
    # kill:ps:0 and kill:ps-backup:0 at one step (the all-lost drill): once the primary is killed, its backup is
    # no longer "a backup of the primary's view" (no primary answers), so each target is read before any signal.
    sent: list[tuple[int, int]] = []
    alive = {40: "/job:ps/task:0", 50: "/job:ps_backup/task:0"}

    def member(job: str, shard: int) -> str | None:
        if 40 not in alive:  # the primary is gone: no member says primary, so no target for either fault
            return None
        return "/job:ps/task:0" if job == "ps" else "/job:ps_backup/task:0"

    def send(pid: int, sig: int) -> None:
        sent.append((pid, sig))
        alive.pop(pid, None)

    injector = ChaosInjector(ChaosPlan.parse(["kill:ps:0@step=300", "kill:ps-backup:0@step=300"]), REPLICATED,
                             lambda job, i: FakeTask(f"/job:{job}/task:{i}", PIDS[(job, i)]), send=send,
                             member=member)
    assert [f.task for f in injector.poll(300)] == ["/job:ps/task:0", "/job:ps_backup/task:0"]
    assert sent == [(40, signal.SIGKILL), (50, signal.SIGKILL)] and injector.pending() == 0


def test_a_round_of_shard_faults_fires_none_until_every_one_has_its_target() -> None:
    # The backup did not answer its status in time at the first poll: firing the primary's kill alone would leave
    # the backup's fault without a target (no member says primary after the kill), so the round waits.
    sent: list[tuple[int, int]] = []
    answers = {"ps": ["/job:ps/task:0"], "ps-backup": [None, "/job:ps_backup/task:0"]}

    def member(job: str, shard: int) -> str | None:
        said = answers[job]
        return said.pop(0) if len(said) > 1 else said[0]

    injector = ChaosInjector(ChaosPlan.parse(["kill:ps:0@step=300", "kill:ps-backup:0@step=300"]), REPLICATED,
                             lambda job, i: FakeTask(f"/job:{job}/task:{i}", PIDS[(job, i)]),
                             send=lambda pid, sig: sent.append((pid, sig)), member=member)
    assert injector.poll(300) == [] and sent == []
    assert [f.task for f in injector.poll(301)] == ["/job:ps/task:0", "/job:ps_backup/task:0"]
