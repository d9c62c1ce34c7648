"""benchmarks/psflow_timing.py and bench_tf_peer's TF warm-up rate: how bench_tf_peer*.py time a run, on made-up logs.

A run logging every step is timed from the chief's "initialized the variables" line to the last ``step=`` line;
one at ``--log-every 100`` (``until_done``) to the workers' last "done after" line; the rate after the warm-up
steps from the first line at a step >= 40. TF's warm-up rate comes from its workers' per-step samples.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.timeout(60)

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    saved = list(sys.path)
    sys.path.insert(0, str(BENCHMARKS))  # the scripts import their siblings (and put their folder on the path)
    try:
        spec = importlib.util.spec_from_file_location(f"{name}_under_test", BENCHMARKS / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path[:] = saved


def _line(second: float, text: str) -> str:
    whole = int(second)
    return f"2026-11-27 12:00:{whole:02d},{round((second - whole) * 1000):03d} INFO {text}\n"


def _write_logs(run: Path, lines: dict[int, list[str]]) -> None:
    (run / "logs").mkdir(parents=True)
    for worker, text in lines.items():
        (run / "logs" / f"worker-{worker}.log").write_text("".join(text))


def test_every_step_logged(tmp_path: Path) -> None:
    timing = _load("psflow_timing")
    _write_logs(tmp_path, {
        0: [_line(10.0, "psflow.chief: /job:worker/task:0: initialized the variables on 1 ps tasks"),
            *(_line(10.0 + s / 100, f"psflow.worker: worker 0: step={s} loss=0.5 auc=0.5") for s in range(1, 101, 2))],
        1: [_line(10.0 + s / 100, f"psflow.worker: worker 1: step={s} loss=0.5 auc=0.5") for s in range(2, 101, 2)]})
    out = timing.parse_worker_logs(str(tmp_path), 512)
    assert out["seconds"] == pytest.approx(1.0)
    assert out["step_values_logged"] == 100 and out["step_values_missing"] == 0
    assert out["step_values_logged_by_2plus_workers"] == 0
    # from step 40 (at 10.40 s) to step 100 (11.00 s): 60 steps of 512
    assert out["examples_per_sec_after_warmup"] == pytest.approx(60 * 512 / 0.6)


def test_logged_every_100_steps_ends_at_the_last_done_line(tmp_path: Path) -> None:
    timing = _load("psflow_timing")
    done = "psflow.worker: worker {w}: done after 391 local steps (200000 examples), last global step {g}: end of data"
    _write_logs(tmp_path, {
        0: [_line(10.0, "psflow.chief: /job:worker/task:0: initialized the variables on 1 ps tasks"),
            _line(10.5, "psflow.worker: worker 0: step=100 loss=0.5 auc=0.5"),
            _line(11.2, done.format(w=0, g=700))],
        1: [_line(10.9, "psflow.worker: worker 1: step=600 loss=0.5 auc=0.5"), _line(11.5, done.format(w=1, g=782))]})
    with pytest.raises(RuntimeError, match="no 'initialized the variables'"):
        timing.parse_worker_logs(str(tmp_path / "elsewhere"), 512, until_done=True)
    out = timing.parse_worker_logs(str(tmp_path), 512, until_done=True)
    assert out["seconds"] == pytest.approx(1.5)  # to worker 1's "done", the last one
    assert out["step_values_missing"] is None
    # from step 100 (the first logged step >= 40) at 10.5 s to the last "done" (step 782) at 11.5 s
    assert out["examples_per_sec_after_warmup"] == pytest.approx((782 - 100) * 512 / 1.0)
    # without until_done the done lines are not read: the last step= line ends the run
    assert timing.parse_worker_logs(str(tmp_path), 512)["seconds"] == pytest.approx(0.9)


def test_tf_after_warmup_from_the_workers_samples(tmp_path: Path) -> None:
    peer = _load("bench_tf_peer")
    # two workers, (time, global_step, local step) after each step; worker 1 is the first to reach step 40
    samples = {0: [(100.0 + s / 10, s, s) for s in range(1, 80, 2)], 1: [(100.0 + s / 10, s, s) for s in range(2, 81, 2)]}
    for worker, rows in samples.items():
        (tmp_path / f"worker-{worker}.json").write_text(json.dumps({"samples": rows}))
    # from global step 40 (at 104.0 s) to step 80 (108.0 s): 40 steps of 2 x 512 (sync)
    assert peer.tf_after_warmup(str(tmp_path), 1024) == pytest.approx(40 * 1024 / 4.0)
    assert peer.tf_after_warmup(str(tmp_path / "none"), 512) is None  # no samples: no rate
