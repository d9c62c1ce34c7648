"""benchmarks/netns_delay.py (bench_netns.py --delay): where a layout's results go, and the AUC it reads.

The benchmark itself needs root (network namespaces); here only its naming, its reading of a worker log's
evaluation line and its RESULTS.md section are checked, on made-up figures.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def netns_delay(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(ROOT / "tests"))
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import netns_delay as module

    return module


def test_the_four_host_layout_keeps_its_section_and_others_add_their_host_count(netns_delay: ModuleType) -> None:
    assert netns_delay.section_name(1.0, 2, 2) == "netns_delay_1ms"
    assert netns_delay.section_name(5.0, 2, 4) == "netns_delay_5ms_6hosts"
    assert netns_delay.section_name(0.5, 1, 2) == "netns_delay_0.5ms_3hosts"


def test_auc_is_the_last_evaluation_in_the_worker_logs(netns_delay: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "worker-0.log").write_text(
        "12:00:00.000 INFO psflow.worker: eval step=100 auc=0.7000 logloss=0.6000 accuracy=0.7000\n"
        "12:00:01.000 INFO psflow.worker: eval step=1564 auc=0.8128 logloss=0.4000 accuracy=0.8000\n")
    (tmp_path / "worker-1.log").write_text("12:00:00.500 INFO psflow.worker: eval step=800 auc=0.7900 logloss=0.5\n")
    assert netns_delay._auc(str(tmp_path)) == pytest.approx(0.8128)


def test_no_evaluation_line_is_an_error_naming_the_folder(netns_delay: ModuleType, tmp_path: Path) -> None:
    (tmp_path / "worker-0.log").write_text("12:00:00.000 INFO psflow.worker: step=1 loss=0.69\n")
    with pytest.raises(RuntimeError, match=str(tmp_path)):
        netns_delay._auc(str(tmp_path))


def _run(rep: int, side: str, k: str, steady: float, e2e: float) -> dict[str, Any]:
    return {"rep": rep, "side": side, "steps_in_flight": k, "steady_eps": steady, "train_eps": steady,
            "end_to_end_eps": e2e, "cpu_seconds": 10.0, "wall_seconds": 5.0, "load_average_1min": 3.0 + rep}


def test_section_lists_per_repetition_ratios_and_auc_against_the_first_k(netns_delay: ModuleType) -> None:
    runs = [_run(rep, side, k, steady, steady / 2) for rep in range(2) for k, d in (("1", 0.5), ("4", 0.9))
            for side, steady in (("relay0", 100.0), ("relayD", 100.0 * d))]
    auc_runs = [{**_run(0, "relayD", "1", 50.0, 25.0), "auc": 0.8128, "examples": 800000, "final_step": 1564},
                {**_run(0, "relayD", "4", 90.0, 45.0), "auc": 0.8110, "examples": 800000, "final_step": 1564}]
    args = argparse.Namespace(delay=5.0, pairs=2, epochs=2, ps=2, workers=4, steps_in_flight="1,4", rev="worktree")
    result = {"workload": "w", "date": "d", "cpus": 2, "runs": runs, "auc_runs": auc_runs,
              "summary": netns_delay._summary(runs, ["relay0", "relayD"], ["1", "4"])}
    text = netns_delay._markdown(result, args)
    assert "--ps 2 --workers 4" in text and "load average at the runs' starts: 3.0-4.0" in text
    assert "- K=1: 0.500 / 0.500; 0.500 / 0.500" in text
    assert "- K=4: 0.900 / 0.900; 0.900 / 0.900" in text
    assert "| 4 | 0.8110 | -0.0018 | 800,000 | 1,564 |" in text

