"""``psflow train --optimizer adam`` resumes its own checkpoint.

Before, the launcher's resume check counted Adam's beta powers (saved beside ``m`` and ``v``) as another
optimizer's slots and refused every Adam checkpoint ("written with --optimizer adam ...; this run asks for
adam"), so a run with Adam could not be resumed, after a crash or for more epochs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import A9A, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

A9A_RECORDS = 32_561


def test_an_adam_run_resumes_for_another_epoch(tmp_path: Path) -> None:
    common = ("train", "--train", str(A9A), "--num-features", "124", "--optimizer", "adam", "--batch-size", "256",
              "--ps", "2", "--partitions", "2", "--workers", "2", "--checkpoint-dir", str(tmp_path / "ckpt"),
              "--quiet", "--no-status")
    first = run_cli(*common, "--epochs", "1", "--output", str(tmp_path / "one"), timeout=250)
    assert first.returncode == 0, first.stderr[-3000:]
    second = run_cli(*common, "--epochs", "2", "--ps", "1", "--partitions", "1", "--output", str(tmp_path / "two"),
                     timeout=250)
    assert second.returncode == 0, second.stderr[-3000:]
    metrics = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert metrics["resumed_from"]["examples"] == A9A_RECORDS
    assert metrics["examples_this_run"] == A9A_RECORDS and metrics["examples"] == 2 * A9A_RECORDS
