"""``psflow train --ps-replicas 1`` as the launcher runs it (issue 28): the backup tasks are started, logged,
reported and ended with the run; the run's files carry the replication figures. No fault: the failovers are
tests/integration/test_replicated_training.py's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import A9A, A9A_T, run_cli
from test_train_cli import leftover_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_an_undisturbed_replicated_run_ends_0_with_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--ps", "2",
                "--workers", "2", "--epochs", "1", "--batch-size", "256", "--log-every", "10", "--ps-replicas", "1",
                "--output", str(out), timeout=200)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "2 ps (+ 2 ps backups) + 2 workers" in r.stderr
    cluster = json.loads((out / "cluster.json").read_text())
    assert len(cluster["ps_backup"]) == 2
    for name in ("ps_backup-0", "ps_backup-1"):
        assert "serving" in (out / "logs" / f"{name}.log").read_text(errors="replace"), name

    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["examples"] == 32561 and metrics["eval"]["auc"] > 0.85
    assert metrics["updates_lost"] == 0
    assert metrics["pushes_applied"] == metrics["pushes_acknowledged"] > 0, metrics
    assert [s["primary"] for s in metrics["shards"]] == ["/job:ps/task:0", "/job:ps/task:1"]
    assert [[b["task"] for b in s["backups"]] for s in metrics["shards"]] == [
        ["/job:ps_backup/task:0"], ["/job:ps_backup/task:1"]]
    assert [s["task"] for s in metrics["ps"]] == ["/job:ps/task:0", "/job:ps/task:1"]  # the primaries' Stats

    status = json.loads((out / "status.json").read_text())
    assert (status["updates_lost"], status["pushes_applied"]) == (0, metrics["pushes_applied"])
    states = {t["task"]: t["state"] for t in status["tasks"]}
    assert states["/job:ps_backup/task:0"] == states["/job:ps_backup/task:1"] == "finished", states
    prom = (out / "metrics.prom").read_text()
    assert "psflow_updates_lost 0.0" in prom
    assert 'psflow_shard_primary{shard="1",task="/job:ps/task:1"} 1.0' in prom
    assert leftover_processes(str(out)) == []
