"""examples/inception_distributed.py: Inception's distributed trainer shape on psflow.

Run as a user runs it (from another directory, no flags but where its files go): 1 ps task and 4 workers in sync
mode, 3 gradients aggregated per step and 1 backup, RMSProp with a staircase decay by epochs, moving averages.
Its held-out accuracy with the moving averages is within 0.01 of the same model trained in one process with the
global batch, the same schedule and as many steps (``--in-process``); both runs report the evaluation with the
moving averages beside the one without, and the chief's learning-rate summary.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from support import REPO, run_bounded

pytest.importorskip("torch")
pytest.importorskip("sklearn")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLE = REPO / "examples" / "inception_distributed.py"
ACCURACY = re.compile(r"^inception_distributed: accuracy ([\d.]+) with moving averages, ([\d.]+) without; "
                      r"log-loss ([\d.]+) / ([\d.]+) on 360 held-out digits$", re.MULTILINE)
RATE = re.compile(r"^inception_distributed: learning rate 0\.045 at step 10 -> 0\.024238 at step (\d+) "
                  r"\(the chief's summary, (\d+) points\); global_step 299,", re.MULTILINE)


def run_example(tmp_path: Path, name: str, *args: str) -> tuple[str, Path]:
    out = tmp_path / name
    env = {**os.environ, "PSFLOW_TORCH_THREADS": "1"}  # the processes share two cores
    r = run_bounded([sys.executable, str(EXAMPLE), "--output-dir", str(out), "--quiet", *args],
                    timeout=240, cwd=tmp_path, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    return r.stdout, out


def test_three_workers_and_a_backup_in_sync_mode_train_as_one_process_does(tmp_path: Path) -> None:
    distributed, out = run_example(tmp_path, "distributed")
    assert ("1 ps + 4 workers, sync: 3 gradients per step, 1 backup(s), batch 32 each; global batch 96, 299 steps "
            "(20 epochs), RMSProp at 0.045 x 0.94 every 29 steps, moving averages 0.9999") in distributed, distributed
    alone, _ = run_example(tmp_path, "in-process", "--in-process")
    assert "in one process; global batch 96, 299 steps (20 epochs)" in alone, alone
    found = {name: ACCURACY.search(text) for name, text in (("distributed", distributed), ("in-process", alone))}
    assert all(found.values()), (distributed, alone)
    accuracy = {name: (float(m.group(1)), float(m.group(2))) for name, m in found.items() if m is not None}
    print(f"accuracy with moving averages / without: {accuracy}")
    assert abs(accuracy["distributed"][0] - accuracy["in-process"][0]) <= 0.01, accuracy
    assert min(min(pair) for pair in accuracy.values()) >= 0.95, accuracy
    for text in (distributed, alone):  # the staircase 0.045 * 0.94 ** (step // 29), as the chief wrote it
        rate = RATE.search(text)
        assert rate is not None, text
    metrics = json.loads((out / "run" / "metrics.json").read_text())
    assert metrics["mode"] == "sync" and metrics["global_step"] == 299
    assert metrics["stale_dropped"] > 0  # the backup's gradients
    assert metrics["eval"]["accuracy"] == pytest.approx(accuracy["distributed"][0], abs=1e-4)
