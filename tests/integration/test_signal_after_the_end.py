"""A signal that reaches ``psflow train`` after its finished run's end was written does not make the run a failure:
the launcher exits 0 (the finished run's own status), says the signal came after the end, and prints the run's
summary; metrics.json stays ``finished`` and no task outlives the launcher.

Before, such a SIGTERM made the launcher exit 143 (128 + signum) although metrics.json said ``finished``, so a
script or scheduler reading the exit status took a finished run for an interrupted one; or, where it landed while the
launcher shut its tasks down, it was swallowed without a word. Real ``psflow train`` runs on a9a; the launcher sends
itself the SIGTERM (by pid, a real signal) at the point the case names (``late_signal/sitecustomize.py``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from support import A9A, REPO, run_bounded, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HOOK = Path(__file__).parent / "late_signal"


def _tasks_of(out: Path) -> list[int]:
    """The pids of live task processes of the run in ``out`` (their command line names its config.json)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if "psflow.launch.task" in argv and str(out) in argv and state not in ("Z", "X"):
                pids.append(int(entry))
    return pids


@pytest.mark.parametrize("point", ["while_written", "after_written", "in_shutdown"])
def test_a_sigterm_after_a_finished_run_s_end_exits_0_and_says_so(tmp_path: Path, point: str) -> None:
    out = tmp_path / "run"
    env = dict(os.environ, PSFLOW_TEST_LATE_SIGNAL=point, PYTHONPATH=os.pathsep.join(
        [str(HOOK), *filter(None, [os.environ.get("PYTHONPATH")])]))
    try:
        r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124",
                         "--ps", "1", "--workers", "1", "--batch-size", "128", "--max-steps", "20",
                         "--output", str(out), "--quiet"], timeout=250, env=env, cwd=REPO)
        wait_until(lambda: not _tasks_of(out), f"every task of {out} gone", 60.0)
    finally:
        for pid in _tasks_of(out):
            os.kill(pid, signal.SIGKILL)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "finished" and "interrupted" not in metrics, metrics
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert (f"psflow train: SIGTERM arrived after the run had finished at global_step {metrics['global_step']}: "
            "its end stands") in r.stderr, r.stderr[-3000:]
    assert "interrupted by" not in r.stderr, r.stderr[-3000:]
    summary = json.loads(r.stdout)  # the run's summary, as after any finished run
    assert summary["global_step"] == metrics["global_step"] and summary["examples"] == metrics["examples"]
