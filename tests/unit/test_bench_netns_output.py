"""benchmarks/bench_netns.py --output FILE writes FILE only: the tracked results stay as they are (issue 30, item 8).

The benchmark itself needs root (network namespaces); here its measurement, ``_run``, returns fixed numbers,
and what is checked is where the results go. The tracked files are replaced by copies in tmp_path, so a
regression cannot touch the real benchmarks/RESULTS.md.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(60)

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    """bench_netns with its measurement fixed and its tracked files (results/netns.json, RESULTS.md) in tmp_path."""
    spec = importlib.util.spec_from_file_location("bench_netns_under_test", BENCHMARKS / "bench_netns.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rates = {"loopback": 1000.0, "netns": 900.0}

    def run(side: str, epochs: int, rate: str | None) -> dict[str, Any]:
        return {"side": side, "examples_per_sec": rates[side], "wall_seconds": 1.0, "examples": 1000 * epochs}

    monkeypatch.setattr(module, "_run", run)
    monkeypatch.setattr(module, "netns_available", lambda: None)
    monkeypatch.setattr(module, "TRACKED_JSON", str(tmp_path / "tracked" / "netns.json"))
    shutil.copy(BENCHMARKS / "RESULTS.md", tmp_path / "RESULTS.md")
    monkeypatch.setattr(sys.modules["results_md"], "PATH", str(tmp_path / "RESULTS.md"))
    return module


def test_with_output_only_that_file_is_written(bench: ModuleType, tmp_path: Path) -> None:
    before = (tmp_path / "RESULTS.md").read_bytes()
    out = tmp_path / "trial" / "netns.json"
    assert bench.main(["--pairs", "2", "--epochs", "1", "--output", str(out)]) == 0
    assert json.loads(out.read_text())["median_ratio_netns_over_loopback"] == pytest.approx(0.9)
    assert (tmp_path / "RESULTS.md").read_bytes() == before
    assert not (tmp_path / "tracked").exists()


def test_without_output_the_tracked_results_are_written(bench: ModuleType, tmp_path: Path) -> None:
    assert bench.main(["--pairs", "2", "--epochs", "1"]) == 0
    assert json.loads((tmp_path / "tracked" / "netns.json").read_text())["pairs"] == 2
    section = (tmp_path / "RESULTS.md").read_text().split("<!-- netns:begin -->")[1].split("<!-- netns:end -->")[0]
    assert "`benchmarks/bench_netns.py --pairs 2 --epochs 1`" in section and "| 0.900 |" in section
