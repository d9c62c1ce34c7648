"""A chaos fault never fires after training ended, even one whose round came due but found no target.

Seen reviewing 20f6ba1: :meth:`ChaosInjector.poll` marks a due round begun before it resolves the round's
targets; when none is found (a replicated shard's failover under way, a member slow to answer, nobody holding
the chief duties, the task being restarted) nothing fires, yet the round stays begun, and
:meth:`ChaosInjector.training_ended` kept every begun round ("a recovery under way"). Its fault then fired at
the first later poll whose target answered: after every worker had finished its data, e.g. killing the chief
or a ps shard during the final save or the evaluation, which no restore can rewind the workers for. Pure
logic, no processes.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass

import pytest

from psflow.cluster import ClusterSpec
from psflow.launch.chaos import ChaosInjector
from psflow.launch.chaos_plan import ChaosPlan, DutyHolder

pytestmark = pytest.mark.timeout(60)

REPLICATED = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3", "127.0.0.1:4"],
                          "ps_backup": ["127.0.0.1:5"]})
PLAIN = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
PIDS = {("ps", 0): 40, ("ps_backup", 0): 50, ("worker", 0): 42, ("worker", 1): 43}


@dataclass
class FakeTask:
    name: str
    pid: int


def _find(job: str, index: int) -> FakeTask:
    return FakeTask(f"/job:{job}/task:{index}", PIDS[(job, index)])


def test_a_shard_fault_due_without_a_target_is_dropped_when_training_ends(caplog: pytest.LogCaptureFixture) -> None:
    sent: list[tuple[int, int]] = []
    primary: list[str | None] = [None]  # a failover under way: no member says primary
    injector = ChaosInjector(ChaosPlan.parse(["kill:ps:0@step=100"]), REPLICATED, _find,
                             send=lambda pid, sig: sent.append((pid, sig)), member=lambda job, shard: primary[0])
    assert injector.poll(102) == []                   # due, no target now: waits
    with caplog.at_level(logging.WARNING, logger="psflow.launch"):
        assert injector.training_ended(601) == ["kill:ps:0@step=100"]
    primary[0] = "/job:ps_backup/task:0"               # the promoted primary answers, during the final save
    assert injector.poll(601) == [] and sent == []
    assert injector.pending() == 0 and injector.not_fired_count() == 1
    assert ("chaos: kill:ps:0@step=100 not fired: training ended at step 601 before any fault of its round found "
            "its target (the round came due at global_step 102") in caplog.text, caplog.text
    [_, line] = injector.summary()
    assert line.startswith("chaos:   kill:ps:0@step=100: not fired: training ended at step 601 before any fault"), line


def test_a_chief_fault_due_while_nobody_holds_the_duties_is_dropped_when_training_ends() -> None:
    sent: list[tuple[int, int]] = []
    holders: list[DutyHolder | None] = [None]
    injector = ChaosInjector(ChaosPlan.parse(["kill:chief@step=100", "kill:worker:1@step=100"]), PLAIN, _find,
                             send=lambda pid, sig: sent.append((pid, sig)), holder=lambda: holders[0])
    [fired] = injector.poll(100)                       # worker 1 is hit; the chief waits for a holder
    assert fired.task == "/job:worker/task:1"
    assert injector.training_ended(300) == []          # a round under way keeps firing its others (by design)
    holders[0] = DutyHolder("worker", 0, 7)
    assert [f.spec for f in injector.poll(300)] == ["kill:chief@step=100"]

    sent.clear()
    holders[0] = None
    injector = ChaosInjector(ChaosPlan.parse(["kill:chief@step=100"]), PLAIN, _find,
                             send=lambda pid, sig: sent.append((pid, sig)), holder=lambda: holders[0])
    assert injector.poll(100) == []                    # due, nobody holds the duties: nothing of the round fired
    assert injector.training_ended(300) == ["kill:chief@step=100"]
    holders[0] = DutyHolder("worker", 0, 8)            # the final save's holder
    assert injector.poll(300) == [] and sent == []
    assert injector.not_fired_count() == 1


def test_a_round_due_after_a_dropped_begun_one_is_not_fired_either() -> None:
    sent: list[tuple[int, int]] = []
    primary: list[str | None] = [None]
    injector = ChaosInjector(ChaosPlan.parse(["kill:ps:0@step=100", "stop:worker:1@step=150"]), REPLICATED, _find,
                             send=lambda pid, sig: sent.append((pid, sig)), member=lambda job, shard: primary[0])
    assert injector.poll(120) == []
    assert injector.training_ended(601) == ["kill:ps:0@step=100", "stop:worker:1@step=150"]
    primary[0] = "/job:ps/task:0"
    assert injector.poll(700) == [] and sent == [] and injector.not_fired_count() == 2
    assert signal.SIGSTOP not in [s for _, s in sent]
