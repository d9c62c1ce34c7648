"""data/criteo_synthetic: the bundled SYNTHETIC Criteo-format data is what its generator makes, in Criteo's layout.

The files are committed so that a fresh clone has Criteo-format data (the real samples' terms forbid bundling
them); scripts/make_synthetic_criteo.py is how they were made, and this checks that it still makes exactly
them, that they keep the layout (39 features, missing fields, negative counts, hex categories), stay small,
and are labelled synthetic. That they can be learnt: tests/unit/data/test_criteo.py.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.timeout(120)

DATA = REPO / "data" / "criteo_synthetic"
SCRIPT = REPO / "scripts" / "make_synthetic_criteo.py"
HEX = re.compile(rb"[0-9a-f]{8}\Z")


def test_the_generator_makes_the_committed_files_byte_for_byte(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--output", str(tmp_path)], capture_output=True, text=True,
                       timeout=100, check=False)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(tmp_path / "train.txt"), str(tmp_path / "eval.txt")]
    for name in ("train.txt", "eval.txt"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), f"{name} differs from what the script makes"


def test_another_seed_gives_other_rows_of_the_same_layout(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--output", str(tmp_path), "--train-rows", "50", "--eval-rows",
                        "10", "--seed", "7"], capture_output=True, text=True, timeout=100, check=False)
    assert r.returncode == 0, r.stderr
    lines = (tmp_path / "train.txt").read_bytes().splitlines()
    assert len(lines) == 50 and len((tmp_path / "eval.txt").read_bytes().splitlines()) == 10
    assert all(len(line.split(b"\t")) == 40 for line in lines)
    assert lines != (DATA / "train.txt").read_bytes().splitlines()[:50]


@pytest.mark.parametrize("name", ["train.txt", "eval.txt"])
def test_the_files_have_criteos_layout(name: str) -> None:
    lines = (DATA / name).read_bytes().splitlines()
    rows = [line.split(b"\t") for line in lines]
    assert len(rows) >= 800 and all(len(row) == 40 for row in rows)
    assert {row[0] for row in rows} == {b"0", b"1"}
    positives = sum(row[0] == b"1" for row in rows) / len(rows)
    assert 0.03 <= positives <= 0.05, positives
    counts = [row[1:14] for row in rows]
    assert all(re.fullmatch(rb"-?\d+", v) for row in counts for v in row if v)
    assert any(not v for row in counts for v in row)  # missing counts
    assert {row[1] for row in counts} & {b"-1", b"-2"}  # I2's negative values, as in the real files
    cats = [row[14:] for row in rows]
    assert all(HEX.match(v) for row in cats for v in row if v)
    assert any(not v for row in cats for v in row)  # missing categories
    sizes = [len({row[j] for row in cats}) for j in range(26)]
    assert min(sizes) <= 4 and max(sizes) >= 300  # small and large vocabularies


def test_the_data_is_small_and_says_it_is_synthetic() -> None:
    assert sum((DATA / name).stat().st_size for name in ("train.txt", "eval.txt")) < 1_000_000
    readme = (DATA / "README.md").read_text(encoding="utf-8")
    assert readme.startswith("# SYNTHETIC") and "scripts/make_synthetic_criteo.py" in readme
