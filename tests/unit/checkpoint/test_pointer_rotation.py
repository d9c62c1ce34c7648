"""A missing, damaged or outside checkpoint pointer (issue 25, item 1), on real in-process ps services (no sockets).

Rotation keeps the newest ``max_to_keep`` complete checkpoints of the lineage, read from the directory's manifests,
whatever the pointer says; readers (``latest_checkpoint``, which ``psflow export`` and the chief use) report a bad
pointer and use the newest complete checkpoint inside the directory. tests/integration/test_checkpoint_pointer.py
runs the same with ``psflow train`` and ``psflow export``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from test_checkpoint_dir import _cluster, _step

from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager

pytestmark = pytest.mark.timeout(60)


def _delete(ckpt: Path, outside: Path) -> str:
    (ckpt / "checkpoint").unlink()
    return "is missing"


def _garbage(ckpt: Path, outside: Path) -> str:
    (ckpt / "checkpoint").write_bytes(bytes(range(256)) + b"\x00\xff" * 22)  # 300 bytes, not UTF-8
    return "is not a JSON object"


def _not_an_object(ckpt: Path, outside: Path) -> str:
    (ckpt / "checkpoint").write_text('["ckpt-000000001"]')
    return "is not a JSON object"


def _absolute_outside(ckpt: Path, outside: Path) -> str:
    pointer = json.loads((ckpt / "checkpoint").read_text())
    (ckpt / "checkpoint").write_text(json.dumps(dict(pointer, latest=str(outside), all=[str(outside)])))
    return f"names {str(outside)!r}, which is not a ckpt-\\* directory directly inside"


def _dotdot(ckpt: Path, outside: Path) -> str:
    pointer = json.loads((ckpt / "checkpoint").read_text())
    relative = os.path.relpath(outside, ckpt)
    (ckpt / "checkpoint").write_text(json.dumps(dict(pointer, latest=relative, all=[relative])))
    return "which is not a ckpt-\\* directory directly inside"


def _symlink_inside(ckpt: Path, outside: Path) -> str:
    (ckpt / "ckpt-000000099").symlink_to(outside)
    pointer = json.loads((ckpt / "checkpoint").read_text())
    (ckpt / "checkpoint").write_text(json.dumps(dict(pointer, latest="ckpt-000000099")))
    return "which is not a ckpt-\\* directory directly inside"


DAMAGES: dict[str, Callable[[Path, Path], str]] = {
    "deleted": _delete, "garbage": _garbage, "not an object": _not_an_object, "absolute path outside": _absolute_outside,
    "relative path outside": _dotdot, "symlink to outside": _symlink_inside,
}


def _saved(tmp_path: Path, count: int) -> tuple[Path, Path, list[str], object]:
    """``count`` checkpoints of one lineage (steps 1..count) in ``tmp_path/ckpt``, and a complete copy of the first
    outside it (a newer step than any inside: what a pointer followed blindly would restore)."""
    ckpt = tmp_path / "ckpt"
    client = _cluster()
    manager = CheckpointManager(str(ckpt), max_to_keep=10, run_id="run-a")
    paths = []
    for _ in range(count):
        _step(client)
        paths.append(manager.save(client).path)
    outside = tmp_path / "elsewhere" / "ckpt-000000900"
    shutil.copytree(paths[0], outside)
    manifest = json.loads((outside / "manifest.json").read_text())
    (outside / "manifest.json").write_text(json.dumps(dict(manifest, global_step=900)))
    return ckpt, outside, paths, client


@pytest.mark.parametrize("damage", DAMAGES)
def test_rotation_keeps_max_to_keep_of_the_lineage_whatever_the_pointer_says(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    ckpt, outside, paths, client = _saved(tmp_path, 4)
    DAMAGES[damage](ckpt, outside)
    _step(client)  # type: ignore[arg-type]
    new = CheckpointManager(str(ckpt), max_to_keep=3, run_id="run-b").save(client).path  # type: ignore[arg-type]
    names = sorted(p.name for p in ckpt.glob("ckpt-*") if not p.is_symlink())
    assert names == [Path(p).name for p in paths[2:]] + [Path(new).name], names
    assert outside.is_dir() and (outside / "manifest.json").exists()  # nothing outside the directory touched
    pointer = json.loads((ckpt / "checkpoint").read_text())
    assert pointer["latest"] == Path(new).name and pointer["all"] == names
    assert latest_checkpoint(str(ckpt)) == new


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_bad_pointer_is_reported_and_the_newest_complete_checkpoint_inside_is_read(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    ckpt, outside, paths, _ = _saved(tmp_path, 3)
    problem = DAMAGES[damage](ckpt, outside)
    with caplog.at_level(logging.WARNING, logger="psflow.checkpoint"):
        assert latest_checkpoint(str(ckpt)) == paths[-1]
        assert latest_checkpoint(str(ckpt)) == paths[-1]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]  # once per process, not at every read
    message = warnings[0].getMessage()
    assert str(ckpt / "checkpoint") in message and "ignored" in message and Path(paths[-1]).name in message, message
    assert re.search(problem, message), message


def test_a_pointer_to_a_missing_checkpoint_inside_falls_back_and_says_so(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    ckpt, _, paths, _ = _saved(tmp_path, 3)
    pointer = json.loads((ckpt / "checkpoint").read_text())
    (ckpt / "checkpoint").write_text(json.dumps(dict(pointer, latest="ckpt-000000099")))
    with caplog.at_level(logging.WARNING, logger="psflow.checkpoint"):
        assert latest_checkpoint(str(ckpt)) == paths[-1]
    assert "ckpt-000000099" in caplog.text and "gone or has no manifest" in caplog.text


def test_a_good_pointer_is_followed_without_a_word(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ckpt, _, paths, _ = _saved(tmp_path, 3)
    pointer = json.loads((ckpt / "checkpoint").read_text())
    (ckpt / "checkpoint").write_text(json.dumps(dict(pointer, latest=Path(paths[0]).name)))  # a rollback by hand
    with caplog.at_level(logging.WARNING, logger="psflow.checkpoint"):
        assert latest_checkpoint(str(ckpt)) == paths[0]
    assert not caplog.records
    assert latest_checkpoint(str(tmp_path / "empty")) is None and not caplog.records  # a fresh directory: no pointer, no word


def test_rotation_orders_by_global_step_then_save_time_and_spares_other_lineages(tmp_path: Path) -> None:
    """Two saves of one step (a restore, then a save before any push) are both counted; the newer one is kept."""
    ckpt, _, paths, client = _saved(tmp_path, 2)
    other = _cluster("other")
    other_path = CheckpointManager(str(ckpt), max_to_keep=1, run_id="run-o").save(other).path
    manager = CheckpointManager(str(ckpt), max_to_keep=2, run_id="run-a")
    again = manager.save(client).path  # type: ignore[arg-type]  # step 2 again: ckpt-000000002-<ns>
    assert Path(again).name.startswith("ckpt-000000002-")
    names = sorted(p.name for p in ckpt.glob("ckpt-*"))
    assert names == sorted([Path(paths[1]).name, Path(again).name, Path(other_path).name]), names
    (ckpt / "checkpoint").unlink()
    assert latest_checkpoint(str(ckpt)) == again  # the newest of step 2 (save time), not the older one
