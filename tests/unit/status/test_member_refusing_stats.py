"""The pollers of a replicated run's members (the status collector, the chaos thread's reading) once a member
without its shard's state refuses ``Stats`` (FAILED_PRECONDITION naming the primary:
psflow/ps/replication/control_calls.py), and how a joining member shows.

* A refusal is an answer: the member is up and its channel works. Both pollers took every RpcError for a dead
  channel and replaced it by a fresh one (``TaskChannel.reconnect``), so a member rebuilding from its primary got
  a new connection at every poll: every second from the status page, every 5 ms from the chaos thread (a rebuild
  takes seconds: hundreds of connections to a process busy applying its snapshot). A channel whose call failed
  (no answer) is still replaced.
* A joining member answers no ``Stats`` of its own; its primary's ``lag`` names it (the Join's sender, from the
  snapshot on), outside the view's backups. The status snapshot, metrics.json, the page, ``psflow status`` and
  /metrics show it per shard as joining (with what is queued for it), where they said ``no backup`` and nothing
  of it (issue 28: per shard, who is which).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from replica_shard import PRIMARY, InProcessShard, backup, layout
from test_replication_figures import member
from test_status_page_replicas import NODE, _render

from psflow.cli.status import render_status
from psflow.cluster import ClusterSpec
from psflow.launch.fault_recovery import poll_reading
from psflow.launch.ports import free_ports
from psflow.ps.protocol import ReplicateRequest
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import FailedPreconditionError, RpcError, TaskUnavailableError
from psflow.rpc.framing import Frame
from psflow.status.collector import StatusCollector
from psflow.status.replication import replication_view
from psflow.status.server import prometheus_text

pytestmark = pytest.mark.timeout(60)

PS0, PS1, B0, B1 = "/job:ps/task:0", "/job:ps/task:1", "/job:ps_backup/task:0", "/job:ps_backup/task:1"

# Shard 0 failed over: ps_backup:0 promoted (epoch 2), the restarted ps:0 joining it (in its lag, not in the view).
PRIMARY0 = member(B0, 0, "primary", 2, applied=700, acknowledged=700, lag={PS0: {"entries": 35, "seconds": 0.25}},
                  global_step=1340)
PRIMARY1 = member(PS1, 1, "primary", 1, applied=640, acknowledged=640, backups=(B1,),
                  lag={B1: {"entries": 2, "seconds": 0.004}})
BACKUP1 = member(B1, 1, "backup", 1, applied=640, acknowledged=640, primary=PS1)


class _Call:
    def __init__(self, answer: dict[str, Any] | RpcError) -> None:
        self._answer = answer

    def result(self) -> Frame:
        if isinstance(self._answer, RpcError):
            raise self._answer
        return Frame(self._answer)


class _Member:
    """A member's channel: its Stats answer (or error), and how often the poller replaced it."""

    def __init__(self, task: str, answer: dict[str, Any] | RpcError) -> None:
        self.task, self.answer, self.reconnects = task, answer, 0

    def call_async(self, method: str, meta: Any = None, *, timeout: float | None = None) -> _Call:
        assert method == "Stats", method
        return _Call(self.answer)

    def call(self, method: str, meta: Any = None, *, timeout: float | None = None) -> Frame:
        return self.call_async(method, meta, timeout=timeout).result()

    def reconnect(self) -> None:
        self.reconnects += 1

    def close(self) -> None:
        pass


def _members() -> dict[str, _Member]:
    refusal = FailedPreconditionError(f"{PS0}: not the primary of shard 0 (joining): the primary is {B0}")
    return {PS0: _Member(PS0, refusal), PS1: _Member(PS1, PRIMARY1), B0: _Member(B0, PRIMARY0),
            B1: _Member(B1, TaskUnavailableError(f"{B1}: connection refused"))}


def test_the_chaos_threads_reading_keeps_a_refusing_members_channel() -> None:
    members = _members()
    for _ in range(3):
        reading = poll_reading(list(members.values()), replicated=True)
        assert reading is not None and reading.step == 1340 and reading.in_view == {B0, PS1, B1}, reading
    assert members[PS0].reconnects == 0  # before: 3, a new connection at every poll (every 5 ms)
    assert members[B1].reconnects == 3  # no answer: a fresh channel, as before


def test_the_status_collector_keeps_a_refusing_members_channel_and_shows_it_joining() -> None:
    ports = free_ports(5)
    cluster = ClusterSpec({"ps": [f"127.0.0.1:{p}" for p in ports[:2]], "ps_backup": [f"127.0.0.1:{p}" for p in ports[2:4]],
                           "worker": [f"127.0.0.1:{ports[4]}"]})
    collector = StatusCollector(cluster, token=None, timeout=0.5)
    members = _members()
    collector._ps = {0: members[PS0], 1: members[PS1]}  # type: ignore[dict-item]
    collector._backups = {B0: members[B0], B1: members[B1]}  # type: ignore[dict-item]
    try:
        for _ in range(3):
            collector._read_ps()
        snapshot = collector._publish(time.time())
        text = prometheus_text(collector).decode()
    finally:
        collector._ps, collector._backups = {}, {}
        collector.stop()
    assert members[PS0].reconnects == 0  # before: 3, one per round (every second)
    assert members[B1].reconnects == 3
    shard0, shard1 = snapshot["shards"]
    assert (shard0["primary"], shard0["backups"]) == (B0, [])
    assert shard0["joining"] == [{"task": PS0, "lag_entries": 35, "lag_seconds": 0.25}], shard0
    assert shard1["joining"] == [], shard1
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("psflow_joining_queue_entries", (("shard", "0"), ("task", PS0)))] == 35.0
    assert not any(name == "psflow_joining_queue_entries" and ("shard", "1") in labels for name, labels in samples)
    assert ("psflow_backup_lag_entries", (("shard", "0"), ("task", PS0))) not in samples  # not a backup of the view


def test_a_joining_member_is_in_its_shards_figures_and_in_every_rendering() -> None:
    view = replication_view([PRIMARY0, PRIMARY1, BACKUP1])
    assert view is not None
    shard0, shard1 = view["shards"]
    assert shard0["joining"] == [{"task": PS0, "lag_entries": 35, "lag_seconds": 0.25}]
    assert (shard1["backups"], shard1["joining"]) == ([{"task": B1, "lag_entries": 2, "lag_seconds": 0.004}], [])
    text = render_status({"run": {"phase": "training"}, **view})
    assert (f"shard 0: primary {B0} (epoch 2), no backup, joining {PS0} (35 entries queued); "
            "0 updates lost") in text, text
    assert f"shard 1: primary {PS1} (epoch 1), backups {B1} (2 entries, 0.00 s behind); 0 updates lost" in text, text


@pytest.mark.skipif(NODE is None, reason="node is not installed")
def test_the_page_shows_a_joining_member() -> None:
    view = replication_view([PRIMARY0, PRIMARY1, BACKUP1])
    assert view is not None
    lines = _render(view)["lines"]
    assert lines[1] == f"shard 0: primary {B0} (epoch 2), no backup, joining {PS0} (35 entries queued); 0 updates lost"
    assert lines[2] == f"shard 1: primary {PS1} (epoch 1), backups {B1} (2 entries, 0.00 s behind); 0 updates lost"


def _stats(shard: InProcessShard, member: str) -> dict[str, Any]:
    """``member``'s Stats as a ps task serves it: the service's, with the ``replication`` entry the server adds
    (psflow/server.py; the in-process harness's services have none of their own)."""
    return {**dict(shard.call(member, "Stats", Frame({})).meta), "replication": shard.replicas[member].stats()}


def test_a_real_joining_member_refuses_stats_and_shows_joining_in_its_primarys(
        make_shard: Callable[..., InProcessShard]) -> None:
    """In-process members (tests/replica_shard.py): ps_backup:0 restarted, its Join served and the snapshot's
    Replicate held (it applies nothing): it refuses Stats, its primary's Stats names it in ``lag`` outside the
    view, and the shard's figures show it joining; let go, it is a backup of the view again, joining no more."""
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    joiner = backup(0)
    held = threading.Event()
    shard.add(joiner)  # a restarted process of the backup: it Joins ps:0
    shard.held_requests[(joiner, ReplicateRequest.METHOD)] = held
    try:
        shard.start(joiner)
        shard.wait(lambda: joiner in getattr(shard.replicas[PRIMARY].forwarder, "senders", {}) and shard.holding >= 1,
                   f"the Join of {joiner} served")
        with pytest.raises(FailedPreconditionError, match="not the primary of shard 0"):
            shard.call(joiner, "Stats", Frame({}))
        view = replication_view([_stats(shard, PRIMARY)])
        assert view is not None
        [figures] = view["shards"]
        assert (figures["primary"], figures["backups"]) == (PRIMARY, []), figures
        assert [j["task"] for j in figures["joining"]] == [joiner], figures
    finally:
        del shard.held_requests[(joiner, ReplicateRequest.METHOD)]
        held.set()
    shard.wait_view(limit=20.0)
    view = replication_view([_stats(shard, PRIMARY), _stats(shard, joiner)])
    assert view is not None
    [figures] = view["shards"]
    assert ([b["task"] for b in figures["backups"]], figures["joining"]) == ([joiner], []), figures
