"""A malformed record deep in a large ``--eval`` file, found only when the finished run evaluates, says so.

The launcher checks a few MiB of each ``--eval`` file before it starts anything; a bad record past them is met
by the final evaluation, after every worker finished and the final checkpoint was written. The run fails
(exit 1, metrics.json ``phase`` failed), but before, its one line was the reader's alone, ``psflow train: error:
big.libsvm:125001: malformed token ...``: no ``--eval``, nothing saying that the training was done and saved, so
it read as a training failure (a training record found bad, the work lost) and invited running it all again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import A9A, A9A_T, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def big_eval(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """a9a.t 8 times over (~17 MiB), with a malformed line near its end."""
    lines = A9A_T.read_text().splitlines() * 8
    lines.insert(len(lines) - 100, "1 x:2")
    path = tmp_path_factory.mktemp("eval") / "big.libsvm"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("mode", [("--ps", "1", "--workers", "2"), ("--in-process",)], ids=["cluster", "in-process"])
def test_the_error_names_eval_and_says_the_training_finished(tmp_path: Path, big_eval: Path, mode: tuple[str, ...]) -> None:
    small = tmp_path / "small.libsvm"
    small.write_text("\n".join(A9A.read_text().splitlines()[:2000]) + "\n")
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(small), "--eval", str(big_eval), "--num-features", "124", "--quiet",
                "--no-status", "--checkpoint-dir", str(tmp_path / "ckpt"), "--output", str(out), *mode, timeout=250)
    assert r.returncode == 1, r.stderr[-3000:]
    line = r.stderr.strip().splitlines()[-1]
    assert line.startswith(f"psflow train: error: --eval: {big_eval}:"), line
    assert "malformed token 'x:2'" in line and "the training finished" in line, line
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "failed" and metrics["examples"] == 2000
    assert metrics["checkpoints"]["last_saved_step"] == metrics["global_step"]  # the final checkpoint is there
