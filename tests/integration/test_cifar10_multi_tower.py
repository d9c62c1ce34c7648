"""examples/cifar10_multi_tower.py: TensorFlow's multi-GPU CIFAR-10 trainer shape, towers in one worker.

Run as a user runs it (from another directory, no flags but where its files go): its demo -- 1 ps task and
1 worker with 2 CPU towers on 127.0.0.1, 10 epochs of the digits CNN -- reaches >= 0.95 on the held-out digits
(0.97 measured). ``--device cuda`` where PyTorch sees no GPU is one line; with a GPU, 2 towers on it train as well.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import pytest
from support import REPO, run_bounded

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

EXAMPLE = REPO / "examples" / "cifar10_multi_tower.py"
ACCURACY = re.compile(r"^cifar10_multi_tower: accuracy ([\d.]+), log-loss ([\d.]+) on 360 held-out digits", re.MULTILINE)


def run_example(tmp_path: Path, *args: str, timeout: float = 240) -> tuple[int, str, str]:
    env = {**os.environ, "PSFLOW_TORCH_THREADS": "1"}  # the processes share two cores
    r = run_bounded([sys.executable, str(EXAMPLE), "--output-dir", str(tmp_path / "out"), "--quiet", *args],
                    timeout=timeout, cwd=tmp_path, env=env)
    return r.returncode, r.stdout, r.stderr


def test_the_demo_trains_two_cpu_towers_in_one_worker_to_95_percent(tmp_path: Path) -> None:
    code, out, err = run_example(tmp_path)
    assert code == 0, err[-4000:]
    assert "1 ps + 1 worker(s), 2 towers each (cpu, cpu), batch 64 per worker, 10 epochs" in out, out
    found = ACCURACY.search(out)
    assert found is not None, out
    accuracy = float(found.group(1))
    print(f"demo: {found.group(0)}")
    assert accuracy >= 0.95, out
    metrics = json.loads((tmp_path / "out" / "run" / "metrics.json").read_text())
    assert metrics["global_step"] == 10 * 23 and metrics["examples"] == 14370  # 1,437 digits, batches of 64
    assert metrics["eval"]["accuracy"] == pytest.approx(accuracy, abs=1e-4)
    log = (tmp_path / "out" / "run" / "logs" / "worker-0.log").read_text()
    assert "2 towers: cpu, cpu" in log, log[-2000:]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the line where PyTorch sees no GPU")
def test_device_cuda_without_a_gpu_is_one_line(tmp_path: Path) -> None:
    code, out, err = run_example(tmp_path, "--device", "cuda", timeout=60)
    assert code == 1
    assert err.strip() == "cifar10_multi_tower: error: --device cuda: PyTorch sees no GPU (torch.cuda.is_available() is False)"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="PyTorch sees no GPU (torch.cuda.is_available() is False)")
def test_two_towers_on_one_gpu_train_as_well(tmp_path: Path) -> None:
    code, out, err = run_example(tmp_path, "--device", "cuda", "--towers", "2")
    assert code == 0, err[-4000:]
    assert "2 towers each (cuda, cuda)" in out, out
    found = ACCURACY.search(out)
    assert found is not None and float(found.group(1)) >= 0.95, out
    assert "2 towers: cuda, cuda" in (tmp_path / "out" / "run" / "logs" / "worker-0.log").read_text()
