"""Flags whose files psflow writes only on this machine refuse a URL, in one line, before anything starts.

``psflow train --output s3://bucket/run`` used to stop on the store's traceback after taking a lock
object there (or, with ``foo://``, on a line about ``directory.mutex``), and ``--summary-dir
s3://bucket/sum`` made a local folder ``./s3:/bucket/sum`` and trained into it. Each case runs in an
empty directory of its own, which must stay empty: no folder named after the URL, no run directory.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support import run_bounded

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TRAIN = ("train", "--num-features", "124", "--ps", "1", "--workers", "1", "--max-steps", "3", "--quiet",
         "--no-status")
SUPPORTED = "(object storage, s3:// or gs://, is for --checkpoint-dir, --train, --eval and --warm-start)"

CASES = {
    "--output on S3": (("--output", "s3://bucket/run"),
                       "psflow train: error: --output s3://bucket/run: the run's logs, metrics and status are "
                       f"written to a local directory, not to a URL: give a local path {SUPPORTED}"),
    "--output of an unknown scheme": (("--output", "foo://bucket/run"),
                                      "psflow train: error: --output foo://bucket/run: the run's logs"),
    "--output as file://": (("--output", "file:///tmp/run"), "psflow train: error: --output file:///tmp/run: "),
    "--summary-dir on S3": (("--output", "run", "--summary-dir", "s3://bucket/sum"),
                            "psflow train: error: --summary-dir s3://bucket/sum: TensorBoard summaries are written "
                            f"to a local directory, not to a URL: give a local path {SUPPORTED}"),
    "--summary-dir on GCS": (("--output", "run", "--summary-dir", "gs://bucket/sum"),
                             "psflow train: error: --summary-dir gs://bucket/sum: TensorBoard summaries"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_url_where_psflow_writes_locally_is_refused_and_nothing_is_created(name: str, tmp_path: Path) -> None:
    flags, line = CASES[name]
    data = Path(__file__).resolve().parents[2] / "data" / "a9a" / "a9a.t"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PSFLOW_TOKEN"}
    r = run_bounded([sys.executable, "-m", "psflow", *TRAIN, "--train", str(data), *flags], timeout=100, cwd=cwd,
                    env=env)
    assert r.returncode == 1, r.stderr[-3000:]
    assert line in r.stderr, r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    assert not list(cwd.iterdir()), f"created {sorted(p.name for p in cwd.iterdir())}"
