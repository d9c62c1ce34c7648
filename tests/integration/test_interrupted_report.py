"""A run interrupted before any end was written (SIGTERM mid-training) says so and says what it kept: not finished,
not evaluated, and what a run after it starts from: nothing (no --checkpoint-dir), or the newest checkpoint, named
as metrics.json's ``checkpoints`` names it. metrics.json says ``interrupted`` with the signal and ``128 + n``; no
summary on stdout. Before, the report said ``interrupted by SIGTERM at global_step N after S s`` and the tasks
stopped, and left the user to guess whether the training was kept. Real ``psflow train`` runs on a9a, a cluster's
and ``--in-process``; the SIGTERM is sent once the run has trained (a status.json or a checkpoint seen), by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import A9A, REPO, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _interrupted(out: Path, *extra: str, trained: str) -> subprocess.CompletedProcess[str]:
    """``psflow train`` (1 ps, 1 worker, epochs without end), SIGTERMed once ``trained`` says it trained."""
    proc = subprocess.Popen([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124",
                             "--ps", "1", "--batch-size", "128", "--epochs", "1000", "--output", str(out), "--quiet",
                             *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        if trained == "status":  # the live page's file names a step past the first
            def seen() -> bool:
                try:
                    return int(json.loads((out / "status.json").read_text()).get("global_step") or 0) > 10
                except (OSError, ValueError):
                    return False
        else:  # a checkpoint past the initial one in the checkpoint directory
            def seen() -> bool:
                return (out / "ck").is_dir() and any(n.startswith("ckpt-") and n != "ckpt-000000000" and "." not in n
                                                      for n in os.listdir(out / "ck"))
        wait_until(lambda: seen() or proc.poll() is not None, "the run trained", 200.0)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=200)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("in_process", [False, True], ids=["cluster", "in_process"])
def test_an_interrupted_run_with_checkpoints_names_the_one_a_run_resumes_from(tmp_path: Path, in_process: bool) -> None:
    out = tmp_path / "run"
    ck = out / "ck"
    r = _interrupted(out, "--checkpoint-dir", str(ck), "--save-checkpoints-steps", "10",
                     *(["--in-process"] if in_process else ["--workers", "1"]), trained="checkpoint")
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["phase"], metrics["interrupted"], metrics["exit_code"]) == ("interrupted", "SIGTERM", 143), metrics
    assert r.returncode == 143 and r.stdout == "", (r.returncode, r.stdout, r.stderr[-3000:])
    assert f"psflow train: interrupted by SIGTERM at global_step {metrics['global_step']} after " in r.stderr, r.stderr
    saved = metrics["checkpoints"]
    assert saved["last_saved_path"] and os.path.isdir(saved["last_saved_path"]), saved
    assert (f"not finished, not evaluated: the newest checkpoint is {saved['last_saved_path']} (global_step "
            f"{saved['last_saved_step']}): a run with --checkpoint-dir {ck} resumes there") in r.stderr, r.stderr
    assert "eval" not in metrics, sorted(metrics)


def test_an_interrupted_run_without_a_checkpoint_directory_says_nothing_is_kept(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = _interrupted(out, "--workers", "1", trained="status")
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["phase"], metrics["exit_code"], metrics.get("checkpoints")) == ("interrupted", 143, None), metrics
    assert r.returncode == 143 and r.stdout == "", (r.returncode, r.stdout, r.stderr[-3000:])
    lines = r.stderr.splitlines()
    assert "not finished, not evaluated: nothing of its training is kept (no --checkpoint-dir)" in lines, r.stderr
    assert lines[-1] == f"metrics: {out}/metrics.json", r.stderr
