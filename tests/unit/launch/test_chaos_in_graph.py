"""Chaos faults name an in-graph run's client (issue 26, item 7): ``kill:client:0``, and ``kill:chief`` is the
client, the run's chief. Pure logic, no processes."""

from __future__ import annotations

import signal
from dataclasses import dataclass

import pytest

from psflow.cluster import ClusterSpec
from psflow.launch.chaos import ChaosInjector
from psflow.launch.chaos_plan import IN_GRAPH_CLIENT, ChaosError, ChaosPlan, DutyHolder

CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
PIDS = {("ps", 0): 40, ("worker", 0): 42, ("worker", 1): 43, IN_GRAPH_CLIENT: 50}


@dataclass
class FakeTask:
    name: str
    pid: int


def _injector(specs: list[str], sent: list[tuple[int, int]], *, client: bool) -> ChaosInjector:
    return ChaosInjector(ChaosPlan.parse(specs), CLUSTER, lambda job, i: FakeTask(f"/job:{job}/task:{i}", PIDS[(job, i)]),
                         send=lambda pid, sig: sent.append((pid, sig)), holder=lambda: DutyHolder(*IN_GRAPH_CLIENT),
                         client=client)


def test_the_client_is_a_target_of_an_in_graph_run_only() -> None:
    with pytest.raises(ChaosError, match=r"kill:client:0@step=5.*'client'"):
        ChaosPlan.parse(["kill:client:0@step=5"]).resolve(CLUSTER)
    assert [entry[1:] for entry in ChaosPlan.parse(["kill:client:0@step=5"]).resolve(CLUSTER, client=True)] == \
        [("client", 0)]
    with pytest.raises(ChaosError, match="kill:client:1@step=5"):  # one client, task 0
        ChaosPlan.parse(["kill:client:1@step=5"]).resolve(CLUSTER, client=True)


def test_the_chief_of_an_in_graph_run_is_its_client() -> None:
    assert ChaosPlan.parse(["kill:chief@step=1"]).resolve(CLUSTER, client=True)[0][1:] == ("client", 0)
    # Worker 0 is not the chief there: a fault on it and one on the chief at one step are two processes ...
    ChaosPlan.parse(["kill:worker:0@step=1", "kill:chief@step=1"]).resolve(CLUSTER, client=True)
    # ... and the client named twice in one round is refused.
    with pytest.raises(ChaosError, match="both name /job:client/task:0"):
        ChaosPlan.parse(["kill:client:0@step=1", "kill:chief@step=1"]).resolve(CLUSTER, client=True)


def test_kill_client_and_kill_chief_hit_the_clients_process() -> None:
    sent: list[tuple[int, int]] = []
    injector = _injector(["kill:client:0@step=10", "stop:worker:1@step=10", "kill:chief@step=20"], sent, client=True)
    assert [f.task for f in injector.poll(10)] == ["/job:client/task:0", "/job:worker/task:1"]
    assert sent == [(50, signal.SIGKILL), (43, signal.SIGSTOP)]
    for fault in injector.injected:  # as the launcher records it: both tasks back, global_step moving at 12
        fault.recovered_at_step = 12
    assert injector.poll(21) == [] and [f.task for f in injector.poll(22)] == ["/job:client/task:0"]
    assert sent[-1] == (50, signal.SIGKILL)


def test_a_stop_of_the_client_is_refused_naming_why() -> None:
    # The client is outside the cluster's hang detection (it serves no Ping): a stopped client was never killed, the
    # run sat at its step forever (seen: in-graph, --liveness-timeout 3, global_step 40, 0 examples/s).
    for spec in ("stop:client:0@step=5", "stop:chief@step=5"):
        with pytest.raises(ChaosError, match=rf"{spec}.*no hang detection.*kill:client:0"):
            ChaosPlan.parse([spec]).resolve(CLUSTER, client=True)
    # A stop of a worker of the same run still resolves; the client's kill too.
    assert [e[1:] for e in ChaosPlan.parse(["stop:worker:1@step=5", "kill:client:0@step=5"]).resolve(
        CLUSTER, client=True)] == [("worker", 1), ("client", 0)]
