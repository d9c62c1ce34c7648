"""A real ``psflow train`` whose metrics.json cannot be written (a full disk: ``metrics_unwritable/sitecustomize.py``)
fails, cluster and ``--in-process`` alike: exit status 1, one line naming the file and the OSError, the run's summary
on stdout all the same (its training done), no metrics.json. Before, ``--in-process`` exited 0 without it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support import A9A, REPO, run_bounded

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HOOK = Path(__file__).parent / "metrics_unwritable"


@pytest.mark.parametrize("mode", [["--in-process"], ["--ps", "1", "--workers", "1"]], ids=["in_process", "cluster"])
def test_a_run_whose_metrics_json_cannot_be_written_exits_1_with_its_summary(tmp_path: Path, mode: list[str]) -> None:
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(HOOK),
                                                       *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124", *mode,
                     "--batch-size", "128", "--max-steps", "20", "--output", str(out), "--quiet"],
                    timeout=250, env=env, cwd=REPO)
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    lines = [line for line in r.stderr.splitlines() if "metrics.json" in line]
    assert lines == [f"psflow train: error: could not write {out}/metrics.json: [Errno 28] No space left on device: "
                     f"'{out}/metrics.json'"], r.stderr[-3000:]
    assert not (out / "metrics.json").exists()
    summary = json.loads(r.stdout)  # training's own result
    assert summary["global_step"] == 20, summary


@pytest.mark.parametrize("mode", [["--in-process"], ["--ps", "1", "--workers", "1"]], ids=["in_process", "cluster"])
def test_its_last_line_is_printed_before_the_error(tmp_path: Path, mode: list[str]) -> None:
    """The run trained: its last line (``psflow: done: global_step N | ...``) as a finished run's, then the error.
    Before, neither path printed it (the cluster's bar was closed without it, --in-process prints it on return)."""
    out = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(HOOK),
                                                       *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124", *mode,
                     "--batch-size", "128", "--max-steps", "20", "--output", str(out), "--no-status"],
                    timeout=250, env=env, cwd=REPO)
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    lines = r.stderr.splitlines()
    done = [i for i, line in enumerate(lines) if line.startswith("psflow: done: global_step 20 ")]
    assert len(done) == 1, r.stderr[-3000:]
    assert lines[-1].startswith(f"psflow train: error: could not write {out}/metrics.json"), r.stderr[-3000:]
    assert done[0] < len(lines) - 1
    assert json.loads(r.stdout)["global_step"] == 20
