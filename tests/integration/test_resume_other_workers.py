"""``psflow train`` resuming a checkpoint with another ``--workers`` keeps the epochs already trained.

Before, the checkpoint's reader positions (taken with 2 workers) did not fit 3 workers, and every worker started
its data at epoch 0: a run of 1 epoch resumed for ``--epochs 3`` with 3 workers trained 3 more (4 in all;
metrics.json's ``examples`` said so, the console did not). Now every worker starts the oldest epoch a saved
position was in, from its beginning (here epoch 1: the first run ended both workers' epoch 0), and the console
says which.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import A9A, run_cli

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.data import ReaderPosition
from psflow.train.duties import epochs_completed

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

A9A_RECORDS = 32_561
EPOCHS = 3


def _train(tmp_path: Path, name: str, *extra: str) -> dict[str, object]:
    out = tmp_path / name
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--batch-size", "256",
                "--ps", "1", "--checkpoint-dir", str(tmp_path / "ckpt"), "--quiet", "--no-status",
                "--output", str(out), *extra, timeout=250)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics: dict[str, object] = json.loads((out / "metrics.json").read_text())
    metrics["stderr"] = r.stderr
    return metrics


def test_a_run_resumed_with_more_workers_trains_only_the_epochs_left(tmp_path: Path) -> None:
    first = _train(tmp_path, "two", "--workers", "2", "--epochs", "1")
    latest = latest_checkpoint(str(tmp_path / "ckpt"))
    assert latest is not None
    positions = [ReaderPosition.from_json(t) for t in read_manifest(latest).reader_positions.values()]
    assert len(positions) == 2 and min(epochs_completed(p) for p in positions) == 1, positions
    epoch = 1
    second = _train(tmp_path, "three", "--workers", "3", "--epochs", str(EPOCHS))
    assert second["examples_at_start"] == first["examples"]
    assert second["examples_this_run"] == (EPOCHS - epoch) * A9A_RECORDS, (epoch, second["examples_this_run"])
    stderr = str(second["stderr"])
    assert (f"holds reader positions taken with (workers, shuffle buffer, seed) = (2, 0, 0); this run has (3, 0, 0): "
            f"positions cannot be carried over, so every worker starts epoch {epoch} of its share") in stderr, stderr


def test_an_in_graph_run_resuming_a_between_graph_checkpoint_trains_only_the_epochs_left(tmp_path: Path) -> None:
    """The in-graph client reads the data alone: the workers' positions are another sharding's (before, it
    started at epoch 0 and trained both epochs again)."""
    first = _train(tmp_path, "between", "--workers", "2", "--epochs", "1")
    second = _train(tmp_path, "in-graph", "--workers", "2", "--epochs", "2", "--replication", "in-graph")
    assert second["examples_at_start"] == first["examples"] == A9A_RECORDS
    assert second["examples_this_run"] == A9A_RECORDS
    assert "this run has (1, 0, 0): positions cannot be carried over, so every worker starts epoch 1" in str(
        second["stderr"])


@pytest.mark.parametrize("first, then", [("between-graph", "in-graph"), ("in-graph", "between-graph")])
def test_one_worker_and_an_in_graph_client_resume_each_others_position(tmp_path: Path, first: str, then: str) -> None:
    """A 1-worker between-graph run and an in-graph run read the same share (one reader) under different client
    names: stopped mid-epoch 1, the other resumes its position exactly (before: epoch 0, every record again)."""
    steps = 200  # 256-record batches: 127.2 to an epoch
    one = _train(tmp_path, "first", "--workers", "1", "--epochs", "2", "--max-steps", str(steps),
                 "--replication", first)
    two = _train(tmp_path, "then", "--workers", "1", "--epochs", "2", "--replication", then)
    assert two["examples_at_start"] == one["examples"]
    assert int(str(one["examples"])) + int(str(two["examples_this_run"])) == 2 * A9A_RECORDS, (one, two)
    assert "cannot be carried over" not in str(two["stderr"])
