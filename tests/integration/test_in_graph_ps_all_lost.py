"""Every ps task of an in-graph run dying at once never hands a global_step value out twice (guarantee 2).

Before: with ``--replication in-graph --restart-policy on-failure`` and every ps task killed at one step
(both of ``--ps 2``, or the one of ``--ps 1``), the client's push failed, and its restarted process found
every ps task empty. It took them for a fresh cluster and restored the newest checkpoint at the
checkpoint's own step, below the values ps task 0 had handed out before it died: the steps after the
checkpoint (510, 520, ... 600) were logged twice. A between-graph run restores such a cluster past the
bound ps task 0's global_step journal kept (:mod:`psflow.ps.global_step`), and so does the in-graph
client now, when the checkpoint was written by its own run; a new run resuming another run's checkpoint
still starts at the checkpoint's step. Real ``psflow train`` runs on a9a (2 workers, batch 32, one epoch).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import A9A, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(200)]

A9A_RECORDS = 32561
#: One epoch of a9a in batches of 2 x 32: 509 batches, two async steps each.
STEPS_PER_EPOCH = 2 * 509


@pytest.mark.parametrize("num_ps", [1, 2])
def test_every_ps_task_killed_at_once_in_an_in_graph_run_hands_out_no_step_twice(tmp_path: Path,
                                                                                 num_ps: int) -> None:
    out = tmp_path / "run"
    faults = [arg for i in range(num_ps) for arg in ("--chaos", f"kill:ps:{i}@step=600")]
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--replication", "in-graph",
                "--ps", str(num_ps), "--workers", "2", "--batch-size", "32", "--epochs", "1", "--log-every", "10",
                "--output", str(out), "--checkpoint-dir", str(out / "ckpt"), "--save-checkpoints-steps", "250",
                "--restart-policy", "on-failure", "--quiet", *faults, timeout=170)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert sorted(f["task"] for f in metrics["faults"]) == [f"/job:ps/task:{i}" for i in range(num_ps)]
    log = (out / "logs" / "client-0.log").read_text()
    # No step value logged twice across the whole run; every record trained exactly once in the final model.
    steps = [int(s) for s in re.findall(r"in-graph client: step=(\d+)", log)]
    assert steps and len(steps) == len(set(steps)), sorted(s for s in steps if steps.count(s) > 1)
    assert metrics["ps"][0]["examples"] == A9A_RECORDS, metrics["ps"]
    # The restarted client restored the checkpoint onto every ps task, past every step value handed out.
    restored = re.findall(r"restored checkpoint \S+ckpt-(\d+) \(step (\d+)\) onto every ps task; "
                          r"generation \d+, global_step (\d+)", log)
    assert len(restored) == 1, log[-3000:]
    checkpoint_step, resumed_at = int(restored[0][1]), int(restored[0][2])
    assert checkpoint_step < 600 <= resumed_at, restored
    # The redone work took new step numbers: the run ends the steps after the checkpoint past where it resumed.
    assert metrics["global_step"] == resumed_at + STEPS_PER_EPOCH - checkpoint_step, metrics["global_step"]
    assert [p["init_count"] for p in metrics["ps"]] == [1] * num_ps  # restored into, never initialized again
