"""Where a worker's chief election goes (psflow.train.duties.coordination_config): ps task 0's lease table; with
replicated ps shards, every member of shard 0, whose primary serves the table (issue 28)."""

from __future__ import annotations

import pytest

from psflow.cluster import ClusterSpec
from psflow.train.config import TrainConfig
from psflow.train.duties import coordination_config

pytestmark = pytest.mark.timeout(30)


def test_an_unreplicated_run_asks_ps_task_0_alone() -> None:
    cluster = ClusterSpec({"ps": ["h0:1", "h1:1"], "worker": ["w:1"]})
    config = coordination_config(TrainConfig(), cluster, token=None)
    assert (config.backend, config.address, config.members) == ("embedded", "h0:1", ())


def test_a_replicated_run_asks_shard_0s_members_in_member_order() -> None:
    cluster = ClusterSpec({"ps": ["h0:1", "h1:1"], "ps_backup": ["b0:1", "b1:1", "b2:1", "b3:1"], "worker": ["w:1"]})
    config = coordination_config(TrainConfig(), cluster, token=None)
    assert config.address == "h0:1"
    assert config.members == (("/job:ps/task:0", "h0:1"), ("/job:ps_backup/task:0", "b0:1"),
                              ("/job:ps_backup/task:2", "b2:1"))
