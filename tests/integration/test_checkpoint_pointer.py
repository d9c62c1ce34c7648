"""A deleted, damaged or outside checkpoint pointer (issue 25, item 1), with real ``psflow train`` and ``psflow export``.

Before: the next run restored (an outside pointer: the checkpoint outside), then its rotation deleted every complete
checkpoint of the lineage but its own newest, although ``--max-to-keep 5``. Now every complete checkpoint within
``--max-to-keep`` remains, the newest one inside the directory is restored, and the pointer's problem is printed.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from support import A9A, run_cli

from psflow.checkpoint.manifest import read_manifest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

#: Every save full (--full-checkpoint-every 1): what rotation keeps here is --max-to-keep alone (increments keep
#: their bases too: tests/integration/test_checkpoint_incremental.py).
ARGS = ("--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "1", "--batch-size", "256", "--quiet",
        "--save-checkpoints-steps", "40", "--full-checkpoint-every", "1")


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One epoch (128 steps) with a checkpoint every 40 steps: ckpt-000000000, 40, 80, 120 and 128."""
    base = tmp_path_factory.mktemp("first")
    r = run_cli("train", *ARGS, "--epochs", "1", "--checkpoint-dir", str(base / "ckpt"), "--output", str(base / "run"))
    assert r.returncode == 0, r.stderr[-3000:]
    return base / "ckpt"


def _steps(ckpt: Path) -> dict[int, str]:
    return {read_manifest(str(p)).global_step: p.name for p in ckpt.glob("ckpt-*") if (p / "manifest.json").exists()}


def _deleted(ckpt: Path, outside: Path) -> str:
    (ckpt / "checkpoint").unlink()
    return "is missing"


def _garbage(ckpt: Path, outside: Path) -> str:
    (ckpt / "checkpoint").write_bytes(bytes((7 * i + 0x80) % 256 for i in range(300)))  # as head -c 300 /dev/urandom
    return "is not a JSON object"


def _outside(ckpt: Path, outside: Path) -> str:
    pointer = json.loads((ckpt / "checkpoint").read_text())
    (ckpt / "checkpoint").write_text(json.dumps(dict(pointer, latest=str(outside), all=[str(outside)])))
    return f"names '{outside}', which is not a ckpt-\\* directory directly inside"


@pytest.mark.parametrize("damage", [_deleted, _garbage, _outside], ids=["deleted", "garbage", "outside"])
def test_a_bad_pointer_is_reported_the_newest_inside_restored_and_nothing_kept_is_deleted(
        first_run: Path, tmp_path: Path, damage: object) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(first_run, ckpt)
    outside = tmp_path / "elsewhere" / "ckpt-000000040"
    shutil.copytree(ckpt / "ckpt-000000040", outside)  # a complete checkpoint, outside the directory
    before = _steps(ckpt)
    assert sorted(before) == [0, 40, 80, 120, 128], before
    problem = damage(ckpt, outside)  # type: ignore[operator]
    r = run_cli("train", *ARGS, "--epochs", "2", "--max-steps", "150", "--checkpoint-dir", str(ckpt),
                "--output", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-3000:]
    # Every complete checkpoint within --max-to-keep (5) remains: the new one at 150 and the four newest before it.
    after = _steps(ckpt)
    assert sorted(after) == [40, 80, 120, 128, 150], after
    assert all(after[step] == before[step] for step in (40, 80, 120, 128))
    log = (tmp_path / "run" / "logs" / "worker-0.log").read_text()
    assert f"restored checkpoint {ckpt / 'ckpt-000000128'} at step 128" in log, log[-3000:]
    # The warning, on the console: the pointer file and what was wrong with it.
    assert re.search(rf"checkpoint pointer {re.escape(str(ckpt / 'checkpoint'))} {problem}.*; ignored: using the newest "
                     r"complete checkpoint inside it, ckpt-000000128", r.stderr), r.stderr[-3000:]
    assert (outside / "manifest.json").exists()  # nothing outside the directory touched
    assert json.loads((ckpt / "checkpoint").read_text())["latest"] == after[150]  # the next save wrote a good pointer


def test_export_ignores_a_pointer_outside_the_directory(first_run: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(first_run, ckpt)
    outside = tmp_path / "elsewhere" / "ckpt-000000040"
    shutil.copytree(ckpt / "ckpt-000000040", outside)
    _outside(ckpt, outside)
    r = run_cli("export", str(ckpt), str(tmp_path / "model"), timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"checkpoint pointer {ckpt / 'checkpoint'} names '{outside}'" in r.stderr, r.stderr[-3000:]
    model = json.loads((tmp_path / "model" / "model.json").read_text())
    assert (model["checkpoint"], model["global_step"]) == (str(ckpt / "ckpt-000000128"), 128)
