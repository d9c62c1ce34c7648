"""An in-graph run whose client is killed and restarted: its end says what the restore threw away, and its
TensorBoard curve drops the discarded model's points.

Before: the restarted client restored the newest checkpoint before its session (``_restore_initialized_cluster``),
so its session's join restored nothing and no SessionLog START was written: TensorBoard kept the points of the
model the restore discarded (a real run: train/loss at 220..300 after a restore of ckpt-000000200). And
``metrics.json`` ``restore_loss`` counted only the second life's pushes (the first wrote no result file), so it
said ``examples_discarded`` 0 although the restore had thrown away every push since the checkpoint. Real
``psflow train`` processes (``--chaos kill:client:0``); asserted on exit status, metrics.json, the console and the
events files, never on time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import A9A, run_cli

from psflow.checkpoint.manifest import read_manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

BATCH = 32  # each async push of the in-graph client carries one worker's slice: BATCH examples


def _train_loss_steps(logdir: Path) -> list[int]:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    acc = accumulator.EventAccumulator(str(logdir))  # purges orphaned points at a START, its default
    acc.Reload()
    return [e.step for e in acc.Scalars("train/loss")]


def _starts(logdir: Path) -> list[tuple[int, str]]:
    loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")
    events: list[Any] = [e for p in sorted(logdir.iterdir()) for e in loader.EventFileLoader(str(p)).Load()]
    return [(e.step, e.session_log.checkpoint_path) for e in events if e.HasField("session_log")]


def test_a_restarted_in_graph_client_reports_the_restore_s_discard_and_starts_its_curve_again(tmp_path: Path) -> None:
    out, ckpt, summaries = tmp_path / "run", tmp_path / "ckpt", tmp_path / "summaries"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "2", "--workers", "2",
                "--batch-size", str(BATCH), "--max-steps", "600", "--replication", "in-graph",
                "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "100", "--summary-dir", str(summaries),
                "--save-summaries-steps", "10", "--restart-policy", "on-failure",
                "--chaos", "kill:client:0@step=250", "--output", str(out), "--no-status", "--quiet", timeout=250)
    assert r.returncode == 0, r.stderr[-4000:]
    metrics = json.loads((out / "metrics.json").read_text())
    fault = metrics["faults"][0]
    assert fault["task"] == "/job:client/task:0" and fault["recovered"], metrics["faults"]
    restored = metrics["client"][0]["restored"]
    assert restored is not None, metrics["client"]
    restored_step = read_manifest(restored).global_step
    assert restored_step < fault["at_step"], (restored, fault)

    loss = metrics["restore_loss"]
    assert loss is not None and loss["checkpoint_step"] == restored_step, loss
    # every step value up to the fault was an applied push of BATCH examples; the restore kept restored_step's
    assert loss["examples_discarded"] >= (fault["at_step"] - restored_step) * BATCH, loss
    assert loss["examples_discarded_complete"] is True and loss["drivers_restarted"] == 1, loss
    line = next((ln for ln in r.stderr.splitlines() if "a restore within the run" in ln), None)
    assert line is not None, r.stderr[-3000:]
    assert f"global_step {restored_step}" in line and f"at least {loss['examples_discarded']} discarded" in line

    assert (restored_step + 1, restored) in _starts(summaries)
    steps = _train_loss_steps(summaries)
    # the discarded model's points (past the checkpoint, up to the fault) are dropped; the rest of the run is there
    assert not [s for s in steps if restored_step < s <= fault["at_step"]], steps
    assert steps[-1] == metrics["global_step"] and restored_step in steps, steps
