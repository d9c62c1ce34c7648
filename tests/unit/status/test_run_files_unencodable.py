"""A run file whose value JSON cannot hold (an object ``json`` has no form for: ``TypeError``; a refused value:
``ValueError``) is reported as a file that cannot be written is: status.json's a WARNING naming the file and the error
(the collector's thread goes on sampling, the run's end goes on writing), metrics.json's and metrics.prom's returned
by ``write_run_files`` (the launcher says them), never raised out of the end's writing. Before, only an ``OSError``
was: the error went out of ``StatusCollector.finish`` and ``write_run_files`` (the run's end, after its metrics.json
was written, raised a traceback), and each sample of the collector's thread logged ``a sample failed`` with one."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from support import wait_until

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports
from psflow.launch.run_status import METRICS_FILE, METRICS_JSON, write_run_files
from psflow.status.collector import STATUS_FILE, StatusCollector
from psflow.status.final_snapshot import final_snapshot

pytestmark = pytest.mark.timeout(60)


class _Opaque:
    """A value json has no form for (``TypeError: Object of type _Opaque is not JSON serializable``)."""


def _cluster() -> ClusterSpec:
    ports = free_ports(2)  # nobody serves them
    return ClusterSpec({"ps": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]})


def _final(**extra: Any) -> dict[str, Any]:
    final = final_snapshot(phase="finished", ps_stats=[{"task": "/job:ps/task:0", "global_step": 20,
                                                        "examples": 2560}], wall_seconds=2.0)
    final.update(extra)
    return final


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "psflow.status.collector" and r.levelno >= logging.WARNING]


@pytest.mark.parametrize("value", [_Opaque(), {("a", "tuple"): 1}], ids=["object", "tuple_key"])
def test_a_status_json_json_cannot_hold_is_a_warning_naming_it(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                               value: Any) -> None:
    collector = StatusCollector(_cluster(), token="t", timeout=0.2, run_dir=str(tmp_path))
    caplog.set_level(logging.DEBUG, logger="psflow.status.collector")
    try:
        collector.finish(_final(examples=2560))  # written
        before = (tmp_path / STATUS_FILE).read_text()
        collector.finish(_final(examples=value))  # raised on HEAD
        assert (tmp_path / STATUS_FILE).read_text() == before  # the last one written stays, whole
        warned = _warnings(caplog)
        assert len(warned) == 1 and str(tmp_path / STATUS_FILE) in warned[0], warned
        assert "could not write" in warned[0] and ("JSON" in warned[0] or "keys must be" in warned[0]), warned
    finally:
        collector.stop()  # writes once more: a failure said, not raised


def test_the_collector_s_thread_goes_on_past_a_status_json_json_cannot_hold(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    collector = StatusCollector(_cluster(), token="t", timeout=0.2, interval=0.05, run_dir=str(tmp_path),
                                run={"model": _Opaque()})
    caplog.set_level(logging.DEBUG, logger="psflow.status.collector")
    collector.start()
    try:
        wait_until(lambda: len([r for r in caplog.records if "could not write" in r.getMessage()]) >= 3,
                   "three samples' writes", 30.0)
        assert collector._thread is not None and collector._thread.is_alive()
        assert not any("a sample failed" in r.getMessage() for r in caplog.records), caplog.text
        warned = _warnings(caplog)  # said once while the writes fail
        assert len(warned) == 1 and str(tmp_path / STATUS_FILE) in warned[0], warned
    finally:
        collector.stop()


def test_the_run_s_end_with_a_value_json_cannot_hold_returns_each_file_not_written(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    collector = StatusCollector(_cluster(), token="t", timeout=0.2, run_dir=str(tmp_path))
    caplog.set_level(logging.DEBUG, logger="psflow.status.collector")
    try:
        failed = write_run_files(_final(examples=_Opaque()), str(tmp_path), collector)  # raised on HEAD
        assert set(failed) <= {METRICS_JSON, METRICS_FILE} and METRICS_JSON in failed, failed
        assert failed[METRICS_JSON].startswith(f"could not write {tmp_path / METRICS_JSON}: "), failed
        assert not (tmp_path / METRICS_JSON).exists()
        assert any(str(tmp_path / STATUS_FILE) in w for w in _warnings(caplog)), caplog.text
        ok = write_run_files(_final(examples=2560), str(tmp_path), collector)  # the next end is written whole
        assert ok == {} and json.loads((tmp_path / METRICS_JSON).read_text())["examples"] == 2560
    finally:
        collector.stop()
