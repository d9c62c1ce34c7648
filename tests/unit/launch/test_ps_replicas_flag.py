"""--ps-replicas (issue 28): the flag's checks, the cluster it makes, and where the backups go."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from psflow.cli.main import main
from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import ps_replicas, shard_members
from psflow.launch.processes import LocalCluster, TaskHosts
from psflow.launch.resilience import ResilienceConfig
from psflow.train.config import ConfigError

pytestmark = pytest.mark.timeout(60)

A9A = Path(__file__).resolve().parents[3] / "data" / "a9a" / "a9a"


def test_a_negative_count_is_refused_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match="--ps-replicas -1"):
        ResilienceConfig(ps_replicas=-1)
    assert ResilienceConfig().ps_replicas == 0


@pytest.mark.parametrize(("flags", "message"), [
    (["--ps-replicas", "-1"], "--ps-replicas -1: want a whole number >= 0"),
    (["--ps-replicas", "1", "--in-process"], "--ps-replicas 1 needs a cluster of processes"),
    # 2 in flight keep one call per shard in flight (a failed-over one is resent alone); 3 or more would not
    (["--ps-replicas", "1", "--steps-in-flight", "3", "--transport", "grpc"],
     "--steps-in-flight 3 is not supported with --ps-replicas 1: use 1 or 2"),
])
def test_psflow_train_refuses_before_anything_starts(flags: list[str], message: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    code = main(["train", "--train", str(A9A), "--num-features", "124", "--output", str(out), *flags])
    assert code == 1
    assert message in capsys.readouterr().err
    assert not out.exists()  # refused before the run directory was made


def test_the_cluster_gains_a_backup_job_of_ps_times_n_tasks(tmp_path: Path) -> None:
    lc = LocalCluster.create(2, 3, str(tmp_path), ps_replicas=2)
    try:
        cluster = ClusterSpec.from_json((tmp_path / "cluster.json").read_text())
        assert cluster == lc.cluster
        assert ps_replicas(cluster) == 2 and cluster.num_tasks("ps_backup") == 4
        assert shard_members(cluster, 1) == ("/job:ps/task:1", "/job:ps_backup/task:1", "/job:ps_backup/task:3")
        addresses = [cluster.task_address(job, i) for job in cluster.jobs for i in cluster.task_indices(job)]
        assert len(set(addresses)) == 2 + 3 + 4  # every task its own port
    finally:
        lc.stop_all()


def test_an_unreplicated_cluster_is_as_before(tmp_path: Path) -> None:
    lc = LocalCluster.create(2, 2, str(tmp_path))
    try:
        assert set(json.loads((tmp_path / "cluster.json").read_text())) == {"ps", "worker"}
    finally:
        lc.stop_all()


def _hosts(placement: TaskHosts, num_ps: int, replicas: int) -> list[str]:
    return [placement.host("ps_backup", j) for j in range(num_ps * replicas)]


def test_backups_go_to_other_hosts_than_their_primary() -> None:
    hosts = {("ps", 0): "10.0.0.1", ("ps", 1): "10.0.0.2", ("worker", 0): "10.0.0.3", ("worker", 1): "10.0.0.4"}
    prefixes = {key: ("ip", "netns", "exec", f"ns-{host}") for key, host in hosts.items()}
    placed = TaskHosts(hosts, prefixes).with_backups(2, 2)
    backups = _hosts(placed, 2, 2)
    for j, host in enumerate(backups):
        shard = j % 2
        assert host != placed.host("ps", shard), (j, backups)
    assert backups[0] != backups[2] and backups[1] != backups[3]  # a shard's two backups apart as well
    for j, host in enumerate(backups):  # the prefix that enters the host's namespace goes with it
        assert placed.prefix("ps_backup", j) == ["ip", "netns", "exec", f"ns-{host}"]


def test_one_host_keeps_every_backup_there_and_explicit_places_win() -> None:
    single = TaskHosts({("ps", 0): "10.0.0.1", ("worker", 0): "10.0.0.1"}).with_backups(1, 2)
    assert _hosts(single, 1, 2) == ["10.0.0.1", "10.0.0.1"]
    assert _hosts(TaskHosts().with_backups(2, 1), 2, 1) == ["127.0.0.1", "127.0.0.1"]
    given = TaskHosts({("ps", 0): "a", ("worker", 0): "b", ("ps_backup", 0): "a"}).with_backups(1, 1)
    assert given.host("ps_backup", 0) == "a"
    plain = TaskHosts({("ps", 0): "a"})
    assert plain.with_backups(1, 0) is plain


def test_psflow_server_refuses_a_backup_job_that_is_not_n_per_shard(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3"],
                                   "ps_backup": ["127.0.0.1:4", "127.0.0.1:5", "127.0.0.1:6"]}))
    code = main(["server", "--cluster", str(cluster), "--job", "ps_backup", "--task", "0", "--insecure"])
    assert code == 1
    err = capsys.readouterr().err
    assert "'ps_backup' has 3 task(s), not a multiple of job 'ps''s 2" in err, err
