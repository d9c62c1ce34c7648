"""psflow.cluster.replicas: shard membership of a replicated cluster."""

from __future__ import annotations

import pytest

from psflow.cluster.replicas import member_address, ps_replicas, shard_members, shard_of
from psflow.cluster.spec import ClusterError, ClusterSpec

pytestmark = pytest.mark.timeout(30)


def _cluster(num_ps: int, num_backups: int) -> ClusterSpec:
    jobs: dict[str, list[str]] = {"ps": [f"ps{i}:1" for i in range(num_ps)], "worker": ["w0:1"]}
    if num_backups:
        jobs["ps_backup"] = [f"b{j}:1" for j in range(num_backups)]
    return ClusterSpec(jobs)


def test_unreplicated_cluster_has_zero_replicas_and_one_member_per_shard() -> None:
    spec = _cluster(2, 0)
    assert ps_replicas(spec) == 0
    assert shard_members(spec, 1) == ("/job:ps/task:1",)
    assert shard_of("ps", 1, spec) == 1


def test_members_in_order_ps_task_then_backups_strided_by_shard_count() -> None:
    spec = _cluster(2, 4)
    assert ps_replicas(spec) == 2
    assert shard_members(spec, 0) == ("/job:ps/task:0", "/job:ps_backup/task:0", "/job:ps_backup/task:2")
    assert shard_members(spec, 1) == ("/job:ps/task:1", "/job:ps_backup/task:1", "/job:ps_backup/task:3")
    assert [shard_of("ps_backup", j, spec) for j in range(4)] == [0, 1, 0, 1]
    assert member_address(spec, "/job:ps_backup/task:3") == "b3:1"


def test_backup_count_not_a_multiple_is_refused_naming_both_counts() -> None:
    with pytest.raises(ValueError, match=r"3 task\(s\), not a multiple of job 'ps''s 2"):
        ps_replicas(_cluster(2, 3))


def test_unknown_shard_and_non_member_job_are_refused() -> None:
    spec = _cluster(2, 2)
    with pytest.raises(ClusterError, match="no shard 2"):
        shard_members(spec, 2)
    with pytest.raises(ClusterError, match="not a ps shard member"):
        shard_of("worker", 0, spec)
    with pytest.raises(ClusterError, match="no task 5"):
        shard_of("ps_backup", 5, spec)
