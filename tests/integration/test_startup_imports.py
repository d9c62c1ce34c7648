"""What a sparse-LR ``psflow train`` imports, process by process (issue 29: start-up cost).

Every task process and the command itself run with ``PYTHONPROFILEIMPORTTIME=1``, which makes Python
write one line per module it imports to stderr: the command's is captured here, each task's goes to its
log. The modules of the real run are checked, lazy imports inside functions included.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support import A9A, A9A_T, REPO, run_bounded

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def imported(stderr: str) -> set[str]:
    """The modules named by ``-X importtime`` lines (``import time: self | cumulative | name``)."""
    return {line.split("|")[2].strip() for line in stderr.splitlines()
            if line.startswith("import time:") and line.count("|") == 2 and "[us]" not in line}


def test_a_sparse_lr_run_imports_no_torch_and_its_ps_task_no_input_pipeline(tmp_path: Path) -> None:
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPROFILEIMPORTTIME="1")
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--eval", str(A9A_T),
                     "--num-features", "124", "--ps", "1", "--workers", "2", "--epochs", "1", "--quiet",
                     "--output", str(out)], timeout=200, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads((out / "metrics.json").read_text())["eval"]["auc"] > 0.85
    processes = {"psflow train": imported(r.stderr)}
    for name in ("ps-0", "worker-0", "worker-1"):
        processes[name] = imported((out / "logs" / f"{name}.log").read_text())
    for name, modules in processes.items():
        assert "numpy" in modules and "psflow" in modules, f"{name}: no import lines read"
        assert not {m for m in modules if m.split(".")[0] == "torch"}, f"{name} imported torch for sparse LR"
    ps_data = sorted(m for m in processes["ps-0"] if m == "psflow.data" or m.startswith("psflow.data."))
    assert ps_data == [], f"the ps task imported the input pipeline: {ps_data}"
    assert "yaml" not in processes["ps-0"]
