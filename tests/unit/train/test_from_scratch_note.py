"""A checkpoint directory that holds checkpoints but no complete one: the run starts from scratch, and the
launcher says so in one line before it starts anything (issue 30, item 5: it said nothing)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from psflow.train.config import TrainConfig
from psflow.train.duties import claim_checkpoint_dir

pytestmark = pytest.mark.timeout(60)


def _claim(ckpt: Path) -> str:
    out = io.StringIO()
    _, lock = claim_checkpoint_dir(TrainConfig.flat(checkpoint_dir=str(ckpt)), out=out)
    assert lock is not None
    lock.release()
    return out.getvalue()


def test_incomplete_checkpoints_only_are_named_and_the_run_starts_from_scratch(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    for name in ("ckpt-000000010", "ckpt-000000020"):
        (ckpt / name).mkdir(parents=True)
        (ckpt / name / "shard-00000-of-00001.safetensors").write_bytes(b"partial")
    (ckpt / "ckpt-000000020" / "manifest.json").write_text("{not json")  # unreadable: not restorable either
    assert _claim(ckpt) == (f"psflow: warning: no complete checkpoint in {ckpt} (2 incomplete directories): "
                            "starting from scratch\n")


def test_a_pointer_left_alone_says_so_too(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "checkpoint").write_text(json.dumps({"latest": "ckpt-000000020", "all": ["ckpt-000000020"]}))
    assert _claim(ckpt).endswith(f"no complete checkpoint in {ckpt} (0 incomplete directories): starting from scratch\n")


def test_a_fresh_directory_says_nothing(tmp_path: Path) -> None:
    assert _claim(tmp_path / "new") == ""
    assert _claim(tmp_path / "new") == ""  # holding only the lock (released) is fresh too


def test_an_epoch_pointer_file_left_alone_says_so_too(tmp_path: Path) -> None:
    """A chief with a lease epoch writes ``checkpoint.e<N>`` before ``checkpoint``, only once a checkpoint was
    complete: a directory holding one held checkpoints (it said nothing: taken as fresh)."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "checkpoint.e3").write_text(json.dumps({"latest": "ckpt-000000020", "all": ["ckpt-000000020"],
                                                    "run_id": "run-a", "epoch": 3}))
    assert _claim(ckpt).endswith(f"no complete checkpoint in {ckpt} (0 incomplete directories): starting from scratch\n")
