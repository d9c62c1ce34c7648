"""Incremental checkpoints through ``psflow train`` (issue 29): a run saving a full checkpoint and 5 increments
holds, at its last step, every variable and slot of a run saving full checkpoints, bit for bit; a resumed run
restores the chain onto another number of ps tasks and goes on exactly as one resumed from a full checkpoint.

One worker: its steps are the same in every run (the data in file order, one push at a time), whatever the
number of ps tasks, so two runs of the same command reach the same values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import A9A, run_cli

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import read_variables

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

COMMON = ["--train", str(A9A), "--num-features", "124", "--workers", "1", "--quiet", "--optimizer", "adagrad",
          "--save-checkpoints-steps", "5"]


def _train(tmp_path: Path, name: str, ckpt: Path, *flags: str) -> None:
    r = run_cli("train", *COMMON, "--checkpoint-dir", str(ckpt), "--output", str(tmp_path / name), *flags)
    assert r.returncode == 0, r.stderr[-3000:]


def _same_variables(a: str, b: str) -> None:
    left, right = read_variables(a, slots=True), read_variables(b, slots=True)
    assert sorted(left) == sorted(right)
    for name in left:
        assert left[name].dtype == right[name].dtype and left[name].tobytes() == right[name].tobytes(), name


def test_full_plus_five_increments_and_a_resume_equal_full_checkpoints(tmp_path: Path) -> None:
    inc, full = tmp_path / "inc", tmp_path / "full"
    _train(tmp_path, "a", inc, "--ps", "2", "--max-steps", "25", "--full-checkpoint-every", "10", "--max-to-keep", "3")
    _train(tmp_path, "f", full, "--ps", "3", "--max-steps", "25", "--full-checkpoint-every", "1")
    last = latest_checkpoint(str(inc))
    assert last is not None and read_manifest(last).global_step == 25
    kinds = {p.name: read_manifest(str(p)).kind for p in sorted(inc.glob("ckpt-*"))}
    # --max-to-keep 3 keeps the newest three, and the full checkpoint and increments they are based on.
    assert kinds == {"ckpt-000000000": "full", **{f"ckpt-{s:09d}": "increment" for s in (5, 10, 15, 20, 25)}}
    assert json.loads((inc / "checkpoint").read_text())["all"] == sorted(kinds)
    assert read_manifest(str(full / "ckpt-000000025")).kind == "full"
    _same_variables(last, str(full / "ckpt-000000025"))
    # Resumed from the chain onto 3 ps tasks, and from the full checkpoint onto 1: the same step 35.
    _train(tmp_path, "r", inc, "--ps", "3", "--max-steps", "35")
    _train(tmp_path, "g", full, "--ps", "1", "--max-steps", "35")
    assert f"restored checkpoint {last} at step 25" in (tmp_path / "r" / "logs" / "worker-0.log").read_text()
    resumed = latest_checkpoint(str(inc))
    assert resumed is not None and read_manifest(resumed).global_step == 35
    assert read_manifest(str(inc / "ckpt-000000030")).kind == "full"  # a new chief's first save is full
    assert read_manifest(resumed).kind == "increment" and read_manifest(resumed).base == "ckpt-000000030"
    _same_variables(resumed, str(full / "ckpt-000000035"))
