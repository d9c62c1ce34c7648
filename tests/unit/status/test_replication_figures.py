"""Replicated shards in a run's report (issue 28): each shard's primary answers for it, and updates_lost is
acknowledged - applied per shard, never negative; from recorded ``Stats`` replies of the ps members."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.status.collector import StatusCollector
from psflow.status.final_snapshot import final_snapshot
from psflow.status.replication import ps_members, replication_view, shard_primaries
from psflow.status.server import prometheus_text

pytestmark = pytest.mark.timeout(60)


def member(task: str, shard: int, role: str, epoch: int, *, applied: int, acknowledged: int,
           backups: tuple[str, ...] = (), lag: dict[str, Any] | None = None, **stats: Any) -> dict[str, Any]:
    primary = task if role == "primary" else stats.pop("primary", None)
    return {"task": task, **stats, "replication": {
        "shard": shard, "role": role, "epoch": epoch, "primary": primary, "backups": list(backups),
        "lag": lag or {}, "pushes_applied": applied, "pushes_acknowledged": acknowledged}}


# Shard 0's first primary was killed: its backup was promoted (epoch 2) and the restarted ps task 0 joins it.
# Shard 1 is undisturbed. Every member answered; the backups hold copies of their shard's counters.
RECORDED = [
    member("/job:ps/task:0", 0, "joining", 2, applied=0, acknowledged=0, primary="/job:ps_backup/task:0"),
    member("/job:ps/task:1", 1, "primary", 1, applied=640, acknowledged=638, backups=("/job:ps_backup/task:1",),
           lag={"/job:ps_backup/task:1": {"entries": 2, "seconds": 0.004}}),
    member("/job:ps_backup/task:0", 0, "primary", 2, applied=700, acknowledged=700, backups=("/job:ps/task:0",),
           lag={"/job:ps/task:0": [35, 0.25]}, global_step=1340, examples=65_122, loss_ema=0.33, last_loss=0.31),
    member("/job:ps_backup/task:1", 1, "backup", 1, applied=639, acknowledged=637, primary="/job:ps/task:1"),
]


def test_each_shard_is_its_primarys_reply_and_never_a_backups_copy() -> None:
    primaries = shard_primaries(RECORDED)
    assert [s["task"] for s in primaries] == ["/job:ps_backup/task:0", "/job:ps/task:1"]
    # A primary deposed by a partition still says primary, at the old epoch: the higher epoch wins.
    stale = member("/job:ps/task:0", 0, "primary", 1, applied=650, acknowledged=650)
    assert shard_primaries([stale, *RECORDED])[0]["task"] == "/job:ps_backup/task:0"
    # Mid-failover nobody says primary yet: the member at the highest epoch stands in.
    backups_only = [RECORDED[0], member("/job:ps_backup/task:0", 0, "backup", 1, applied=690, acknowledged=690)]
    assert shard_primaries(backups_only)[0]["task"] == "/job:ps/task:0"


def test_the_figures_add_up_over_the_primaries_with_each_backups_lag() -> None:
    view = replication_view(RECORDED)
    assert view is not None
    assert (view["pushes_acknowledged"], view["pushes_applied"], view["updates_lost"]) == (1338, 1340, 0)
    shard0, shard1 = view["shards"]
    assert (shard0["primary"], shard0["epoch"]) == ("/job:ps_backup/task:0", 2)
    assert shard0["backups"] == [{"task": "/job:ps/task:0", "lag_entries": 35, "lag_seconds": 0.25}]
    plain_count = member("/job:ps/task:1", 1, "primary", 1, applied=1, acknowledged=1, backups=("b",), lag={"b": 4})
    assert replication_view([plain_count])["shards"][0]["backups"] == [  # type: ignore[index]
        {"task": "b", "lag_entries": 4, "lag_seconds": None}]
    assert shard1["backups"] == [{"task": "/job:ps_backup/task:1", "lag_entries": 2, "lag_seconds": 0.004}]


def test_updates_lost_is_what_a_checkpoint_restore_of_a_whole_shard_dropped_never_negative() -> None:
    # Every replica of shard 1 died: it came back from a checkpoint holding 500 of its 638 acknowledged pushes.
    restored = member("/job:ps/task:1", 1, "primary", 3, applied=500, acknowledged=638)
    view = replication_view([RECORDED[2], restored])
    assert view is not None and view["updates_lost"] == 138
    assert [s["updates_lost"] for s in view["shards"]] == [0, 138]
    # Applied ahead of acknowledged (replies not yet seen by their workers) is no loss, and is not subtracted.
    ahead = member("/job:ps/task:1", 1, "primary", 1, applied=700, acknowledged=690)
    view = replication_view([ahead, restored | {"task": "/job:ps/task:2", "replication": {
        **restored["replication"], "shard": 2}}])
    assert view is not None and view["updates_lost"] == 138


W0, W1 = "/job:worker/task:0", "/job:worker/task:1"


def test_the_loss_is_counted_per_worker_process_from_every_shards_knowledge() -> None:
    # Every replica of shard 0 was lost and restored from a checkpoint holding worker 0's first 51 pushes (the
    # 51st applied but never acknowledged) and worker 1's first 40; worker 1 had 60 acknowledged. Since, shard 0
    # applied 10 more of worker 0's, which reported its count (60); never heard from worker 1's process, which
    # ended with it: shard 1 heard that process's count of shard 0 (60) with its last push there.
    shard0 = member("/job:ps/task:0", 0, "primary", 1, applied=101, acknowledged=60)
    shard0["replication"] |= {"acked_by_process": [[W0, 1, [60, 0]]],
                              "applied_by_process": [[W0, 1, 61], [W1, 1, 40]], "counts_exact": True}
    shard1 = member("/job:ps/task:1", 1, "primary", 1, applied=120, acknowledged=120)
    shard1["replication"] |= {"acked_by_process": [[W0, 1, [55, 60]], [W1, 1, [60, 60]]],
                              "applied_by_process": [[W0, 1, 60], [W1, 1, 60]], "counts_exact": True}
    view = replication_view([shard0, shard1])
    assert view is not None
    # Shard 0: worker 0 lost nothing (its applied 61 is ahead of its 60), worker 1 lost 20. The totals would say
    # 120 acknowledged - 101 applied = 19, and the shard's own sum, 60 - 101: nothing.
    assert [(s["pushes_acknowledged"], s["updates_lost"]) for s in view["shards"]] == [(120, 20), (120, 0)]
    assert view["updates_lost"] == 20
    # After a restore from a checkpoint without per-process counts: the totals.
    shard0["replication"]["counts_exact"] = False
    view = replication_view([shard0, shard1])
    assert view is not None and view["shards"][0]["updates_lost"] == 120 - 101


def test_an_unreplicated_run_keeps_its_replies_and_reports_no_shards() -> None:
    plain = [{"task": "/job:ps/task:0", "global_step": 10}, {"task": "/job:ps/task:1"}]
    assert shard_primaries(plain) == plain
    assert replication_view(plain) is None
    s = final_snapshot(phase="finished", ps_stats=plain, wall_seconds=1.0)
    assert "updates_lost" not in s and "shards" not in s and s["global_step"] == 10


def test_metrics_json_status_and_prometheus_carry_the_figures(tmp_path: Path) -> None:
    final = final_snapshot(phase="finished", ps_stats=RECORDED, wall_seconds=2.0,
                           extra={"replication": "between-graph"})
    assert (final["global_step"], final["examples"]) == (1340, 65_122)  # from shard 0's new primary
    assert [s["task"] for s in final["ps"]] == ["/job:ps_backup/task:0", "/job:ps/task:1"]
    assert (final["pushes_acknowledged"], final["pushes_applied"], final["updates_lost"]) == (1338, 1340, 0)
    assert final["replication"] == "between-graph"  # the run's field is not the shards' view
    assert [s["primary"] for s in final["shards"]] == ["/job:ps_backup/task:0", "/job:ps/task:1"]

    ports = free_ports(5)  # nobody serves them: every task shows as never answered
    cluster = ClusterSpec({"ps": [f"127.0.0.1:{p}" for p in ports[:2]], "worker": [f"127.0.0.1:{ports[2]}"],
                           "ps_backup": [f"127.0.0.1:{p}" for p in ports[3:]]})
    assert [name for name, _ in ps_members(cluster)] == [
        "/job:ps/task:0", "/job:ps/task:1", "/job:ps_backup/task:0", "/job:ps_backup/task:1"]
    collector = StatusCollector(cluster, token="t", timeout=0.2, run_dir=str(tmp_path))
    try:
        snapshot = collector.finish(final)
        assert snapshot["updates_lost"] == 0 and snapshot["shards"] == final["shards"]
        assert [row["task"] for row in snapshot["ps"]] == ["/job:ps_backup/task:0", "/job:ps/task:1"]
        text = prometheus_text(collector).decode()
    finally:
        collector.stop()
    from prometheus_client.parser import text_string_to_metric_families

    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("psflow_updates_lost", ())] == 0.0
    assert samples[("psflow_pushes_acknowledged_total", ())] == 1338.0
    assert samples[("psflow_shard_primary", (("shard", "0"), ("task", "/job:ps_backup/task:0")))] == 1.0
    assert samples[("psflow_backup_lag_entries", (("shard", "1"), ("task", "/job:ps_backup/task:1")))] == 2.0
    assert samples[("psflow_backup_lag_seconds", (("shard", "1"), ("task", "/job:ps_backup/task:1")))] == 0.004
