"""A replicated shard no member answered for at the run's end (metrics.json ``shards_unread``, the three totals
None: psflow.launch.run_end.with_unread_shards) is in status.json too, and ``psflow status`` and the page say it
was not read: status.json had the totals None and no word of why, and both showed no replication line at all."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_replication_figures import member
from test_status_page_replicas import NODE, _render

from psflow.cli.status import render_status
from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.launch.run_end import with_unread_shards
from psflow.status.collector import StatusCollector
from psflow.status.final_snapshot import final_snapshot

pytestmark = pytest.mark.timeout(60)

ERROR = "every member of shard 1 exited after training, none restarted (/job:ps/task:1 was killed by signal SIGKILL)"
PS_STATS = [member("/job:ps/task:0", 0, "primary", 1, applied=31, acknowledged=31, global_step=61, examples=7808),
            {"task": "/job:ps/task:1", "ready": False, "exited": True, "error": ERROR, "unread_shard": 1}]


def test_status_json_names_the_unread_shard_and_both_texts_say_it(tmp_path: Path) -> None:
    final = with_unread_shards(final_snapshot(phase="finished", ps_stats=PS_STATS, wall_seconds=2.0), PS_STATS)
    assert final["shards_unread"] == [{"shard": 1, "task": "/job:ps/task:1", "error": ERROR}]
    assert final["updates_lost"] is None and [s["shard"] for s in final["shards"]] == [0]
    ports = free_ports(5)  # nobody serves them
    cluster = ClusterSpec({"ps": [f"127.0.0.1:{p}" for p in ports[:2]], "worker": [f"127.0.0.1:{ports[2]}"],
                           "ps_backup": [f"127.0.0.1:{p}" for p in ports[3:]]})
    collector = StatusCollector(cluster, token="t", timeout=0.2, run_dir=str(tmp_path))
    try:
        snapshot = collector.finish(final)
    finally:
        collector.stop()
    assert snapshot["shards_unread"] == final["shards_unread"]
    assert (snapshot["pushes_acknowledged"], snapshot["pushes_applied"], snapshot["updates_lost"]) == (None, None, None)
    said = f"shard 1: not read at the run's end ({ERROR}): pushes acknowledged, applied and updates lost not known"
    assert said in render_status(snapshot).splitlines()
    if NODE is not None:  # the page (status.js under Node, as test_status_page_replicas)
        shown = _render({k: snapshot[k] for k in ("pushes_acknowledged", "pushes_applied", "updates_lost", "shards",
                                                   "shards_unread")})
        assert shown["hidden"] is False and said in shown["lines"], shown  # type: ignore[operator]
