"""TrainConfig in groups (issue 27, item 7): each group checks its own fields, the config the rules across
groups; the JSON is nested and reads back equal; flat() and with_() take the flags' names."""

from __future__ import annotations

import dataclasses
import json

import pytest

from psflow.train.config import (
    FLAT_FIELDS,
    CheckpointSettings,
    ClusterSettings,
    ConfigError,
    DataSettings,
    SyncSettings,
    TrainConfig,
)

pytestmark = pytest.mark.timeout(30)


def test_json_is_nested_and_reads_back_equal() -> None:
    config = TrainConfig.flat(train=("a", "b"), features=("x:categorical",), format="tfrecord", devices=("cpu",),
                              allowed_steps=("m:f",), checkpoint_dir="/tmp/ck", sync_timeout=5.0, mode="sync", model="fm",
                              optimizer="adam", learning_rate_schedule={"schedule": "constant"}, run_id="r1")
    data = json.loads(config.to_json())
    assert data["data"]["train"] == ["a", "b"] and data["checkpoint"]["dir"] == "/tmp/ck"
    assert data["sync"]["timeout"] == 5.0 and data["model"]["name"] == "fm" and data["run_id"] == "r1"
    assert "epochs" not in data  # no flat copy beside the groups
    assert TrainConfig.from_json(config.to_json()) == config


def test_flat_maps_each_name_to_its_group() -> None:
    config = TrainConfig.flat(epochs=3, num_ps=1, mode="sync", save_checkpoints_steps=7, optimizer="sgd")
    assert (config.data.epochs, config.cluster.num_ps, config.sync.mode) == (3, 1, "sync")
    assert (config.checkpoint.save_steps, config.optimizer.name) == (7, "sgd")
    assert TrainConfig.flat() == TrainConfig()
    # every flat name lands on a field of its group
    for name, (group, key) in FLAT_FIELDS.items():
        assert key in {f.name for f in dataclasses.fields(getattr(TrainConfig(), group))}, name


def test_flat_and_with_refuse_an_unknown_name_naming_it() -> None:
    with pytest.raises(TypeError, match="'epoch'"):
        TrainConfig.flat(epoch=3)
    with pytest.raises(TypeError, match="'bogus'"):
        TrainConfig().with_(bogus=1)


def test_with_changes_only_what_it_names_and_checks_again() -> None:
    config = TrainConfig.flat(num_features=8, partitions=2, batch_size=16)
    changed = config.with_(epochs=4, partitions=4)
    assert (changed.data.epochs, changed.cluster.partitions, changed.data.batch_size) == (4, 4, 16)
    assert config.data.epochs == 1  # frozen: the original is untouched
    with pytest.raises(ConfigError, match=r"--partitions \(9\) exceeds --num-features \(8\)"):
        config.with_(partitions=9)


def test_each_group_checks_its_own_fields() -> None:
    with pytest.raises(ConfigError, match="--batch-size must be >= 1"):
        DataSettings(batch_size=0)
    with pytest.raises(ConfigError, match="--transport must be grpc or tcp"):
        ClusterSettings(transport="udp")
    with pytest.raises(ConfigError, match="not both"):
        CheckpointSettings(save_secs=1.0, save_steps=2)
    with pytest.raises(ConfigError, match="--replication must be"):
        SyncSettings(replication="mirrored")
    with pytest.raises(ConfigError, match="--mode ssp needs between-graph replication"):
        SyncSettings(mode="ssp", replication="in-graph")


def test_the_config_checks_the_rules_across_groups() -> None:
    # the sync mode's rules need the number of workers (cluster), checked by the config
    with pytest.raises(ConfigError, match=r"^--replicas-to-aggregate 5 exceeds --workers \(2\)"):
        TrainConfig.flat(mode="sync", num_workers=2, replicas_to_aggregate=5)
    with pytest.raises(ConfigError, match="--partitions"):
        TrainConfig(data=DataSettings(num_features=2), cluster=ClusterSettings(partitions=3))


def test_the_ps_failover_timeout_is_a_cluster_setting_from_its_flag_and_checked() -> None:
    from psflow.cli.main import build_parser
    from psflow.cli.training import config_from_args

    args = build_parser().parse_args(["train", "--train", "x", "--ps-replicas", "1", "--ps-failover-timeout", "4.5"])
    assert config_from_args(args).cluster.ps_failover_timeout == 4.5
    assert TrainConfig().cluster.ps_failover_timeout == 10.0  # the lease ttl's default; under --liveness-timeout's 30
    with pytest.raises(ConfigError, match=r"--ps-failover-timeout must be within \(0, 3600\] s, got 0"):
        ClusterSettings(ps_failover_timeout=0)


def test_in_graph_sync_refuses_backups_and_an_averaging_it_would_not_do() -> None:
    """In-graph sync pushes the mean of every worker's slice, once per step (docs/replication.md): asked for backups
    (--replicas-to-aggregate below --workers) or another --averaging, it trained on every slice, averaged, without
    a word (3 workers, --replicas-to-aggregate 2: 3 x 512 examples per step)."""
    in_graph = {"mode": "sync", "num_workers": 3, "replication": "in-graph"}
    TrainConfig.flat(**in_graph)
    TrainConfig.flat(**in_graph, replicas_to_aggregate=3, averaging="replicas")  # what it does: allowed
    with pytest.raises(ConfigError, match=r"^--replicas-to-aggregate 2 \(backup workers\) needs between-graph "
                                          r"replication: in-graph sync averages all 3 workers' slices every step$"):
        TrainConfig.flat(**in_graph, replicas_to_aggregate=2)
    with pytest.raises(ConfigError, match=r"^--averaging per_row needs between-graph replication: in-graph sync "
                                          r"weights each worker's slice by its examples \(replicas\)$"):
        TrainConfig.flat(**in_graph, averaging="per_row")
    TrainConfig.flat(mode="sync", num_workers=3, replicas_to_aggregate=2, averaging="sparse_sum")  # between-graph


def test_in_graph_replication_refuses_a_sync_timeout_it_would_not_honour() -> None:
    """An in-graph step waits for a failed worker (--connect-timeout) and runs its slice again; it never goes on
    without a slice, so --sync-timeout and --on-timeout had no effect there and said nothing (any --mode)."""
    for mode in ("sync", "async"):
        in_graph = {"mode": mode, "num_workers": 2, "replication": "in-graph"}
        TrainConfig.flat(**in_graph)  # the defaults: allowed
        with pytest.raises(ConfigError, match=r"^--sync-timeout 5 is for between-graph replication: an in-graph "
                                              r"step waits for a failed worker up to --connect-timeout and runs its "
                                              r"slice again, never without it$"):
            TrainConfig.flat(**in_graph, sync_timeout=5)
        with pytest.raises(ConfigError, match=r"^--on-timeout proceed is for between-graph replication: an in-graph "
                                              r"step waits for a failed worker up to --connect-timeout and runs its "
                                              r"slice again, never without it$"):
            TrainConfig.flat(**in_graph, on_timeout="proceed")
    TrainConfig.flat(mode="sync", num_workers=2, sync_timeout=5, on_timeout="proceed")  # between-graph
