"""``psflow train`` with two or more steps in flight per worker (``--steps-in-flight 2``, ``4``): real processes.

Every record is counted once per epoch, every global step is logged by exactly one worker (``--log-every 1``:
each push logs the step it produced), and the model is as good as with one step in flight.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import A9A, A9A_T, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

A9A_RECORDS = 32_561
EPOCHS = 2
_STEP = re.compile(r"psflow\.worker: worker (\d+): step=(\d+) ")


def _train(tmp_path: Path, name: str, *extra: str) -> tuple[dict[str, object], list[int]]:
    out = tmp_path / name
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--epochs", str(EPOCHS),
                "--batch-size", "256", "--ps", "2", "--workers", "2", "--log-every", "1", "--quiet", "--no-status",
                "--output", str(out), *extra, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    steps = [int(m.group(2)) for log in sorted((out / "logs").glob("worker-*.log"))
             for m in _STEP.finditer(log.read_text(errors="replace"))]
    return metrics, steps


@pytest.mark.parametrize("transport", ["tcp", "grpc"])
def test_two_steps_in_flight_count_every_record_once_and_log_every_step_once(tmp_path: Path, transport: str) -> None:
    one, one_steps = _train(tmp_path, "k1", "--transport", transport, "--steps-in-flight", "1")
    two, two_steps = _train(tmp_path, "k2", "--transport", transport, "--steps-in-flight", "2")
    for metrics, steps in ((one, one_steps), (two, two_steps)):
        assert metrics["examples"] == EPOCHS * A9A_RECORDS
        assert sorted(steps) == list(range(1, len(steps) + 1)), "a step value logged twice or missing"
        assert len(steps) == metrics["global_step"]
    assert len(two_steps) == len(one_steps)  # the same batches, each pushed once
    auc_one, auc_two = one["eval"]["auc"], two["eval"]["auc"]  # type: ignore[index]
    assert auc_two >= 0.89 and abs(auc_two - auc_one) <= 0.01, (auc_one, auc_two)


def test_four_steps_in_flight_count_every_record_once_and_log_every_step_once(tmp_path: Path) -> None:
    """gRPC, up to 3 pushes in flight per worker and ps task, applied in the order made (psflow.train.pipeline)."""
    four, steps = _train(tmp_path, "k4", "--transport", "grpc", "--steps-in-flight", "4")
    assert four["examples"] == EPOCHS * A9A_RECORDS
    assert sorted(steps) == list(range(1, len(steps) + 1)), "a step value logged twice or missing"
    assert len(steps) == four["global_step"]
    assert four["eval"]["auc"] >= 0.89, four["eval"]  # type: ignore[index]


def test_four_steps_in_flight_stop_at_max_steps_with_the_pushes_in_flight_counted(tmp_path: Path) -> None:
    stopped, steps = _train(tmp_path, "k4max", "--transport", "grpc", "--steps-in-flight", "4", "--max-steps", "40")
    assert sorted(steps) == list(range(1, len(steps) + 1)), "a step value logged twice or missing"
    assert len(steps) == stopped["global_step"]
    # Each worker stops on the first result at or past 40 it collects: its pushes in flight then (3), and the one
    # that result's call sent, are applied; no more.
    assert 40 <= len(steps) <= 40 + 2 * 4
    assert stopped["examples"] < EPOCHS * A9A_RECORDS
