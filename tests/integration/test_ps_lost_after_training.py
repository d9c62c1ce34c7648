"""A ps task lost after the run's training ended (its final checkpoint written), before the launcher's final
evaluation: the run evaluates the final model from its final checkpoint, and ends finished.

Before: the launcher's evaluation pulled the variables from the live ps tasks, and a ps task restarted empty (no
chief is left to restore it) answered ``Pull: unknown variable partition 'bias/part_0'``: the run ended with exit
status 1 and metrics.json ``phase`` failed, although training had finished and the final checkpoint held the
model. Real ``psflow train`` processes; the launcher loses the ps task itself once its watch of the training
returned (tests/integration/ps_lost_after_training on its PYTHONPATH: SIGKILL by pid, then the task started again,
as ``--chaos`` cannot aim exactly past the final save). Asserted on exit status, console lines and files, never on
time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import A9A, A9A_T, REPO, run_bounded

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def _train(tmp_path: Path, *extra: str, lose: int | None) -> tuple[subprocess.CompletedProcess[str], Path, Path]:
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(Path(__file__).parent / "ps_lost_after_training"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    if lose is not None:
        env["PSFLOW_TEST_LOSE_PS"] = str(lose)
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--eval", str(A9A_T),
                     "--num-features", "124", "--ps", "2", "--workers", "2", "--batch-size", "128",
                     "--max-steps", "60", "--output", str(out), "--no-status", "--quiet", *extra],
                    timeout=250, env=env, cwd=REPO)
    return r, out, ckpt


@pytest.mark.parametrize("lose", [1, 0], ids=["ps1", "ps0-holding-global_step"])
def test_the_final_model_is_evaluated_from_the_final_checkpoint(tmp_path: Path, lose: int) -> None:
    r, out, ckpt = _train(tmp_path, "--checkpoint-dir", str(tmp_path / "ckpt"), lose=lose)
    assert r.returncode == 0, r.stderr[-4000:]
    final = latest_checkpoint(str(ckpt))
    assert final is not None
    manifest = read_manifest(final)
    assert manifest.final
    assert f"evaluating the final checkpoint {final}" in r.stderr, r.stderr[-3000:]
    assert f"/job:ps/task:{lose}" in r.stderr, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "finished"
    assert metrics["eval_model"] == {"from": "checkpoint", "path": final, "global_step": manifest.global_step,
                                     "why": metrics["eval_model"]["why"]}
    assert metrics["global_step"] == manifest.global_step
    assert metrics["examples"] == manifest.examples
    assert metrics["eval"]["auc"] > 0.6  # a trained model's, not an initial one's (0.5)


def test_without_a_checkpoint_directory_the_run_says_the_model_is_lost(tmp_path: Path) -> None:
    r, out, _ = _train(tmp_path, lose=1)
    assert r.returncode == 1, r.stderr[-4000:]
    line = r.stderr.strip().splitlines()[-1]
    assert "training finished" in line and "/job:ps/task:1" in line and "no --checkpoint-dir" in line, line
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "failed"
