"""The built-in PyTorch Wide & Deep on dynamic tables (``--embedding-table dynamic``, issue #14), over real processes.

``psflow train --model wide_deep --format criteo --embedding-table dynamic`` on the bundled synthetic
Criteo-format data (data/criteo_synthetic: 3,000 rows train, 2 epochs; 800 rows eval) with 2 ps tasks and 2
workers: the reader keeps the
full 64-bit hashes as ids (about half of them negative), every wide and deep table is a dynamic
table spread over both ps tasks by id, and with ``--admit-after 1`` it ends holding one row for
each distinct id of its field in the training data -- in the ps tasks' stats and in the final
checkpoint (rows keyed by those ids). Eval AUC must be sane (> 0.6; measured 0.71 on the real
sample's rows). Only the format matters here, so the data is the synthetic one, in every clone; the
test skips without PyTorch.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from support import REPO, run_cli

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import DYNAMIC_IDS, read_variables
from psflow.data.criteo import parse_criteo
from psflow.ps.dynamic import table_totals

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CRITEO = REPO / "data" / "criteo_synthetic"
TRAIN_ROWS, EVAL_ROWS = 3000, 800
FIELDS = [f"C{i}" for i in range(1, 27)]
OPTIONS = {"capacity_rows": 20000, "admit_after": 1}


@pytest.fixture(scope="module")
def split() -> tuple[Path, Path]:
    pytest.importorskip("torch")
    return CRITEO / "train.txt", CRITEO / "eval.txt"


def test_wide_deep_trains_on_dynamic_tables_keyed_by_raw_64_bit_ids(split: tuple[Path, Path], tmp_path: Path) -> None:
    train, evaluation = split
    out, ckpt = tmp_path / "run", tmp_path / "ckpt"
    # The timeout is a safety net (run_cli kills every process the run started past it), never reached by a passing run.
    r = run_cli("train", "--model", "wide_deep", "--format", "criteo", "--train", str(train), "--eval", str(evaluation),
                "--embedding-table", "dynamic", "--capacity", str(OPTIONS["capacity_rows"]),
                "--admit-after", str(OPTIONS["admit_after"]), "--embedding-dim", "8", "--hidden", "32,16",
                "--batch-size", "128", "--epochs", "2", "--ps", "2", "--workers", "2", "--quiet",
                "--output", str(out), "--checkpoint-dir", str(ckpt), timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["examples"] == 2 * TRAIN_ROWS
    assert metrics["eval"]["examples"] == EVAL_ROWS
    assert metrics["eval"]["auc"] > 0.6, metrics["eval"]

    # What training looked up: each field's distinct raw ids (the full 64-bit hashes read as int64).
    columns = parse_criteo(train.read_bytes(), 0).batch
    seen = {f: np.unique(columns.column(f).ids) for f in FIELDS}
    assert all(ids.dtype == np.int64 for ids in seen.values())
    assert any((ids < 0).any() for ids in seen.values()) and any((ids >= 1 << 62).any() for ids in seen.values())
    tables = [f"{part}{f}" for part in ("wide/", "deep/emb_") for f in FIELDS]

    # The ps tasks' stats: every table is dynamic, shared by both ps tasks, one row per distinct id, nothing lost.
    assert len(metrics["ps"]) == 2
    for stats in metrics["ps"]:
        shares = {key.rsplit("/part_", 1)[0] for key in stats.get("dynamic_tables", {})}
        assert shares == set(tables), stats.get("task")
    totals = table_totals(metrics["ps"])
    for name in tables:
        counters = totals[name]
        field = name.rsplit("/", 1)[-1].removeprefix("emb_")
        assert counters["rows"] == counters["admitted"] == seen[field].size, (name, counters)
        assert counters["evicted_capacity"] == counters["dropped_gradients"] == counters["rejected_lookups"] == 0, name

    # The final checkpoint: each table saved as a dynamic one, its rows keyed by exactly those ids.
    path = latest_checkpoint(str(ckpt))
    assert path is not None
    manifest = read_manifest(path)
    saved = read_variables(path)
    for name in tables:
        assert manifest.variables[name]["dynamic"] == OPTIONS, name
        field = name.rsplit("/", 1)[-1].removeprefix("emb_")
        np.testing.assert_array_equal(saved[f"{name}{DYNAMIC_IDS}"], seen[field], err_msg=name)
        assert saved[name].shape == (seen[field].size, 1 if name.startswith("wide/") else 8), name
        assert np.isfinite(saved[name]).all() and np.any(saved[name] != 0), name  # trained rows
    assert "dynamic" not in manifest.variables["deep/layer0/kernel"]
    assert saved["deep/layer0/kernel"].shape == (26 * 8 + 13, 32)
