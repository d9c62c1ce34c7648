"""A lazy table through checkpoints, a killed ps task and its restore, end to end (issue 29).

``psflow train`` on a9a hashed into 2^20 features: the weights table (2^20 x 1 float32, 4 MiB, FTRL's two
slots beside it) is lazy on its ps tasks, and a9a touches at most 124 of its rows. Every checkpoint, the
initial one included, stores only the built rows; ps task 0 killed mid-run is restored from one, its
partition lazy again (the checkpoints saved after the restore still hold only the built rows), and the run
ends as an undisturbed one does. A run warm-started from such a checkpoint (``--warm-start DIR``) builds only
the checkpoint's rows on its ps tasks.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import A9A, A9A_T, run_cli

from psflow.checkpoint.chain import ChainReader
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import read_variables

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

A9A_RECORDS = 32561
EPOCHS = 2
FEATURES = 1 << 20


def _train(out: Path, *extra: str) -> None:
    args = ["train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", str(FEATURES), "--ps", "2",
            "--workers", "2", "--batch-size", "32", "--epochs", str(EPOCHS), "--log-every", "10", "--quiet",
            "--output", str(out), "--checkpoint-dir", str(out / "ckpt"), "--save-checkpoints-steps", "100",
            "--max-to-keep", "100", "--lease-ttl", "2", *extra]
    r = run_cli(*args, timeout=360)
    assert r.returncode == 0, r.stderr[-3000:]


def _built(path: Path) -> list[int | None]:
    """Each weights partition's rows stored in checkpoint ``path``: its built rows (a full checkpoint) or changed
    rows (an increment); None: every row stored."""
    return [p.get("built", p.get("changed")) for p in read_manifest(str(path)).variables["weights"]["partitions"]]


def test_a_killed_ps_task_restores_a_lazy_table_from_its_built_rows_and_the_run_ends_as_an_undisturbed_one(
        tmp_path: Path) -> None:
    base = tmp_path / "base"
    _train(base)
    out = tmp_path / "run"
    _train(out, "--restart-policy", "on-failure", "--chaos", "kill:ps:0@step=350")
    metrics = json.loads((out / "metrics.json").read_text())
    (fault,) = metrics["faults"]
    assert fault["task"] == "/job:ps/task:0" and fault["recovery_seconds"] is not None, fault
    logs = "".join(p.read_text() for p in sorted((out / "logs").glob("worker-*.log")))
    restored = re.search(r"restored checkpoint (\S+) \(step (\d+)\) onto every ps task", logs)
    assert restored, logs[-3000:]
    assert metrics["ps"][0]["examples"] == EPOCHS * A9A_RECORDS, metrics["ps"][0]
    want = json.loads((base / "metrics.json").read_text())["eval"]["auc"]
    assert abs(metrics["eval"]["auc"] - want) <= 0.005, (metrics["eval"], want)
    checkpoints = sorted((out / "ckpt").glob("ckpt-*"), key=lambda p: read_manifest(str(p)).global_step)
    assert _built(checkpoints[0]) == [0] * len(_built(checkpoints[0]))  # step 0: no row built, none stored
    after = [p for p in checkpoints if read_manifest(str(p)).global_step > int(restored.group(2))]
    # The restore changed every row, so the next save holds each partition whole: as its built rows, the
    # restored partitions being lazy still (an eager one would be stored with every row, no "built").
    parts = read_manifest(str(after[0])).variables["weights"]["partitions"]
    assert all("built" in part for part in parts), (after[0], parts)
    for path in checkpoints:  # before and after the restore: only the rows built (or changed), at most a9a's 124
        built = _built(path)
        assert all(n is not None for n in built) and 0 < sum(built) <= 124 or path == checkpoints[0], (path, built)
    final = read_variables(str(checkpoints[-1]), slots=True)
    assert final["weights"].shape == (FEATURES, 1) and final["weights:accum"].shape == (FEATURES, 1)


def test_a_run_warm_started_from_a_lazy_checkpoint_builds_only_the_checkpoints_rows(tmp_path: Path) -> None:
    """``--warm-start DIR`` from a run's checkpoints (the newest an increment over a full checkpoint of built
    rows): the warm-started run's initial checkpoint, saved after the warm start and before any worker trains,
    stores exactly the source's built rows, with the source's values. So its ps tasks built only those rows;
    before, the warm start sent and built all 2^20, and that checkpoint stored every one."""
    source = tmp_path / "source"
    _train(source, "--epochs", "1")
    out = tmp_path / "warm"
    _train(out, "--epochs", "1", "--warm-start", str(source / "ckpt"))
    logs = "".join(p.read_text() for p in sorted((out / "logs").glob("worker-*.log")))
    assert f"warm-started bias, weights from {source / 'ckpt'}" in logs, logs[-3000:]
    newest = latest_checkpoint(str(source / "ckpt"))
    assert newest is not None
    held = ChainReader(newest).built("weights", 0, FEATURES)
    assert held is not None and 0 < held[0].size <= 124, held
    initial = out / "ckpt" / "ckpt-000000000"
    assert sum(n or 0 for n in _built(initial)) == held[0].size and None not in _built(initial), _built(initial)
    want, got = read_variables(newest), read_variables(str(initial))
    assert all(got[name].tobytes() == want[name].tobytes() for name in ("weights", "bias"))
