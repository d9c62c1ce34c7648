"""The launcher's run-end tests' cluster (test_run_end_once, test_end_not_written): one ps task (nothing listens on
its port) and one running task process (its own group), which a late signal must still stop."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from psflow.launch.processes import LocalCluster, TaskProcess


@contextlib.contextmanager
def one_worker_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """(Module docstring) The cluster, its files under ``tmp_path``; the task process is killed on leaving."""
    cluster = LocalCluster.create(1, 1, str(tmp_path))
    log = open(tmp_path / "worker-0.log", "w")
    popen = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], process_group=0)
    cluster.tasks.append(TaskProcess("worker", 0, popen, str(tmp_path / "worker-0.log"), log))
    try:
        yield cluster
    finally:
        if popen.poll() is None:
            popen.kill()
        popen.wait(timeout=10)
        log.close()
