"""A signal to ``psflow train`` between two starts of its cluster (a port taken before training: every task stopped,
the cluster started again on new ports, :mod:`psflow.launch.port_retry`) is the launcher's, as anywhere else in the
run: the run ends interrupted (metrics.json ``phase`` interrupted, exit status 128 + n) and its locks are released.

Before, leaving the first start's cluster put the caller's handlers back until the next one was entered: a SIGTERM
there killed the launcher (SIG_DFL: exit status -15, 143 in a shell) with no report, no metrics.json, and run.lock
and checkpoint.lock left naming a dead process. ``signal_between_starts/sitecustomize.py`` takes ps task 0's first
port and sends the SIGTERM as the launcher says it starts again. Real ``psflow train`` processes, a9a.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from support import A9A, REPO, run_bounded

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_a_sigterm_between_two_starts_ends_the_run_interrupted(tmp_path: Path) -> None:
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    hook = Path(__file__).parent / "signal_between_starts"
    env = dict(os.environ, PSFLOW_TEST_SIGNAL_BETWEEN_STARTS="1",
               PYTHONPATH=os.pathsep.join([str(REPO), str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124",
                     "--ps", "1", "--workers", "2", "--batch-size", "64", "--max-steps", "20",
                     "--checkpoint-dir", str(ckpt), "--output", str(out), "--no-status", "--quiet"],
                    timeout=250, cwd=REPO, env=env)
    assert r.returncode == 128 + signal.SIGTERM, (r.returncode, r.stderr[-3000:])
    assert "was taken by another process; starting the cluster again on new ports" in r.stderr, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "interrupted" and metrics["interrupted"] == "SIGTERM", metrics
    assert "interrupted by SIGTERM" in r.stderr, r.stderr[-3000:]
    assert metrics["exit_code"] == 143 and metrics["tasks"] == [], metrics  # the next start's tasks: none started
    assert not (out / "run.lock").exists() and not (ckpt / "checkpoint.lock").exists()
