"""status.json that cannot be written (a full disk, a removed or read-only run directory) is said, as a WARNING naming
the file and the OSError, once while the writes keep failing (the collector writes it at every sample and at the
run's end), and again should they fail after one succeeded. Before, a DEBUG line only: the user's status file (and
whatever reads it) silently stayed stale."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.status.collector import STATUS_FILE, StatusCollector
from psflow.status.final_snapshot import final_snapshot

pytestmark = pytest.mark.timeout(60)


def test_a_status_json_write_failure_is_a_warning_once_per_failing_stretch(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    run_dir = tmp_path / "run"  # not there: every write fails (FileNotFoundError)
    ports = free_ports(2)  # nobody serves them
    cluster = ClusterSpec({"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]})
    final = final_snapshot(phase="finished", ps_stats=[{"task": "/job:ps/task:0", "global_step": 20, "examples": 2560}],
                           wall_seconds=2.0)
    path = str(run_dir / STATUS_FILE)
    collector = StatusCollector(cluster, token="t", timeout=0.2, run_dir=str(run_dir))
    caplog.set_level(logging.DEBUG, logger="psflow.status.collector")
    try:
        collector.finish(final)
        collector.finish(final)  # a second failing write: not said again

        def warnings() -> list[str]:
            return [r.getMessage() for r in caplog.records
                    if r.name == "psflow.status.collector" and r.levelno == logging.WARNING]

        assert len(warnings()) == 1, caplog.text
        assert path in warnings()[0] and "No such file or directory" in warnings()[0], warnings()
        run_dir.mkdir()
        collector.finish(final)  # written
        assert (run_dir / STATUS_FILE).exists() and len(warnings()) == 1
        shutil.rmtree(run_dir)
        collector.finish(final)  # failing again after a write succeeded: said again
        assert len(warnings()) == 2, caplog.text
    finally:
        collector.stop()
