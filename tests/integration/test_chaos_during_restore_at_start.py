"""A ps fault fired while the chief restores a resumed run's checkpoint at start recovers once the cluster trains
again, and the rounds after it fire (review of d8f1ef5).

A resumed run's chief restores the checkpoint at start at generation 0 (no ``BeginRestore``): ps task 0 holds the
checkpoint's global_step, not ready, so a fault due by then fires on that reading. ``kill:ps:1`` there cuts the
restore short; the chief's next try initializes every task again at generation 0, and the cluster trains: no restore
at a new generation ever comes. The launcher held such a fault to the generation it fired on (0), so it never
recovered ('not recovered: the cluster was not restored after /job:ps/task:1's replacement started (the step task
still at generation 0, ...)' after 2,000 steps trained) and every later round was not fired. Now a reading of a step
task that is not ready gives a fault no generation: the first ready reading after its replacement runs is its
baseline. ``slow_restore_at_start/sitecustomize.py`` holds the chief 1 s before its SetReady so the fault lands
there every time. Real ``psflow train`` processes, a9a.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support import A9A, REPO, run_bounded, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

_COMMON = ("--num-features", "124", "--ps", "2", "--workers", "2", "--batch-size", "32", "--no-status", "--quiet")


def test_a_ps_fault_during_the_restore_at_start_recovers_and_the_next_round_fires(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first = run_cli("train", "--train", str(A9A), *_COMMON, "--max-steps", "300", "--checkpoint-dir", str(ckpt),
                    "--output", str(tmp_path / "first"), timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    out = tmp_path / "resumed"
    hook = Path(__file__).parent / "slow_restore_at_start"
    env = dict(os.environ, PSFLOW_TEST_SLOW_RESTORE_AT_START="1",
               PYTHONPATH=os.pathsep.join([str(REPO), str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), *_COMMON, "--max-steps", "1500",
                     "--checkpoint-dir", str(ckpt), "--output", str(out), "--restart-policy", "on-failure",
                     "--lease-ttl", "2", "--chaos", "kill:ps:1@step=5", "--chaos", "kill:worker:1@step=105"],
                    timeout=250, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    ps1, worker1 = metrics["faults"]
    assert ps1["task"] == "/job:ps/task:1" and worker1["task"] == "/job:worker/task:1", metrics["faults"]
    assert ps1["recovered"] and ps1["recovered_at_step"] > ps1["at_step"], ps1
    assert metrics["faults_not_fired"] == 0 and worker1["recovered"], metrics["faults"]
    assert worker1["at_step"] >= ps1["recovered_at_step"] + 100, metrics["faults"]
