"""Two ``psflow train`` runs on one ``--output`` (issue 25, item 3): the second is refused at once, naming the first,
before it writes anything there or starts a task; the first completes undisturbed.

Before: the second overwrote cluster.json, the first waited 60 s on a ps task that was not there, then "port in use".
The first run is paused (SIGSTOP to its launcher: alive, holding the directory) while the second tries, so the
test does not depend on how fast either runs; its tasks go on meanwhile.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import A9A, REPO, run_cli, wait_until
from test_checkpoint_safety import kill_task, task_pids

from psflow.checkpoint.lock import RUN_LOCK_NAME

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ARGS = ("--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "1", "--batch-size", "256", "--quiet")
LAUNCHER_FILES = ("cluster.json", "config.json", RUN_LOCK_NAME)  # what a second launcher would have written first


def test_a_second_run_on_one_output_is_refused_naming_the_first_which_completes(tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = subprocess.Popen([sys.executable, "-m", "psflow", "train", *ARGS, "--epochs", "2", "--output", str(out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                             stdin=subprocess.DEVNULL, start_new_session=True)
    stopped = False
    try:
        wait_until(lambda: first.poll() is not None or ((out / "cluster.json").exists() and (out / "config.json").exists()),
                   "the first run wrote its cluster.json")
        assert first.poll() is None, first.communicate()[1][-3000:]
        holder = json.loads((out / RUN_LOCK_NAME).read_text())
        assert (holder["pid"], holder["host"]) == (first.pid, socket.gethostname())
        os.kill(first.pid, signal.SIGSTOP)  # alive and holding the directory, whatever the machine's speed
        stopped = True
        before = {name: ((out / name).read_bytes(), (out / name).stat().st_mtime_ns) for name in LAUNCHER_FILES}
        second = run_cli("train", *ARGS, "--epochs", "1", "--output", str(out), timeout=120)
        assert second.returncode == 1, second.stderr[-3000:]
        (refusal,) = [line for line in second.stderr.splitlines() if "error" in line]  # one line
        assert refusal.startswith(f"psflow train: error: run directory {out} is in use by run {holder['run_id']} "
                                  f"(pid {first.pid} on {holder['host']}, since {holder['since_text']}): this run ("), refusal
        assert "give this run another --output" in refusal and "Traceback" not in second.stderr
        assert "workers, run directory" not in second.stderr  # refused before it announced, let alone started, a run
        in_process = run_cli("train", *ARGS, "--epochs", "1", "--in-process", "--output", str(out), timeout=120)
        assert in_process.returncode == 1 and f"is in use by run {holder['run_id']}" in in_process.stderr, \
            in_process.stderr[-3000:]
        after = {name: ((out / name).read_bytes(), (out / name).stat().st_mtime_ns) for name in LAUNCHER_FILES}
        assert after == before  # nothing of the first run's overwritten
        os.kill(first.pid, signal.SIGCONT)
        stopped = False
        _, stderr = first.communicate(timeout=240)
        assert first.returncode == 0, stderr[-3000:]
    finally:
        if first.poll() is None:
            if stopped:
                os.kill(first.pid, signal.SIGCONT)
            os.killpg(first.pid, signal.SIGKILL)
            first.communicate(timeout=30)
        for pid in task_pids(out):
            kill_task(pid)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["examples"] == 2 * sum(1 for _ in open(A9A)), metrics  # both epochs, every record once
    assert json.loads((out / "config.json").read_text())["run_id"] == holder["run_id"]
    assert not (out / RUN_LOCK_NAME).exists()  # released when the run ended
    # The directory is free again: a later run may reuse it.
    again = run_cli("train", *ARGS, "--epochs", "1", "--output", str(out), timeout=200)
    assert again.returncode == 0, again.stderr[-3000:]
    assert not (out / RUN_LOCK_NAME).exists()
