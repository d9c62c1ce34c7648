"""`psflow train --optimizer rmsprop --learning-rate-schedule ...` on a9a, end to end: the ps tasks decay the rate
with global_step, the chief writes it as the ``learning_rate`` summary, the run's metrics carry it as a gauge."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from support import A9A, A9A_T, run_cli

from psflow.optim.schedules import ScheduleSpec
from psflow.train.summary import read_scalars

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

SCHEDULE = ScheduleSpec("exponential_decay", {"learning_rate": 0.02, "decay_steps": 10, "decay_rate": 0.5,
                                              "staircase": True})


@pytest.mark.parametrize(("mode", "workers", "steps"), [
    ("async", 1, -(-32561 // 512)),  # one worker, one epoch
    ("sync", 2, -(-16280 // 512)),  # two workers' batches aggregated into one step each
])
def test_rmsprop_with_a_decayed_rate_writes_the_rate_as_summary_and_gauge(tmp_path: Path, mode: str, workers: int,
                                                                          steps: int) -> None:
    pytest.importorskip("prometheus_client")
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124",
                "--optimizer", "rmsprop:momentum=0.9", "--learning-rate", "0.02",
                "--learning-rate-schedule", "exponential_decay:decay_steps=10,decay_rate=0.5,staircase=true",
                "--mode", mode, "--ps", "2", "--workers", str(workers), "--epochs", "1", "--save-summaries-steps", "10",
                "--output", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    final = metrics["global_step"]
    assert final == steps
    assert metrics["eval"]["auc"] > 0.85, metrics["eval"]
    # At each summary ps task 0's global_step is the summary's step (one worker; in sync mode the next step waits
    # for the chief's gradient), and the rate in force there is the schedule's at that step (the next update's):
    # in sync mode the schedule advanced once per aggregated step, not once per worker's push.
    points = read_scalars(str(out))["learning_rate"]
    assert [step for step, _ in points if step % 10 == 0] == list(range(10, final + 1, 10))
    for step, value in points:
        assert np.float32(value) == SCHEDULE.value(step), (step, value)
    assert points[0][1] == pytest.approx(0.01)
    from prometheus_client.parser import text_string_to_metric_families

    gauges = {s.name: s.value for f in text_string_to_metric_families((out / "metrics.prom").read_text())
              for s in f.samples if not s.labels}
    assert np.float32(gauges["psflow_learning_rate"]) == SCHEDULE.value(final)
    assert json.loads((out / "status.json").read_text())["learning_rate"] == gauges["psflow_learning_rate"]


def test_a_bad_schedule_is_one_line_before_any_task_starts(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--optimizer", "rmsprop",
                "--learning-rate-schedule", "cosine_decay:decay_steps=0", "--output", str(out))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        "psflow train: error: --learning-rate-schedule: schedule 'cosine_decay': 'decay_steps' must be an integer "
        ">= 1, got 0")
    assert not (out / "logs").exists()  # no task was started


def test_a_killed_ps_task_0_resumes_the_schedule_after_its_last_step_not_a_thousand_later(tmp_path: Path) -> None:
    """ps task 0 (global_step) killed at step 30 (or a little later: the launcher's poll), restored from the newest
    checkpoint: global_step goes on right after the last value handed out, so the schedule reads the steps after the
    kill and --max-steps 100 trains on. Before, the restarted task went on from its journal's block bound: global_step
    1001 at once, the run 'finished' with 21 steps trained and the rate of step 1000 (psflow.ps.global_step). The
    70 steps between the kill and the end leave room for a launcher slowed by a busy machine."""
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--batch-size", "256",
                "--optimizer", "rmsprop:momentum=0.9", "--learning-rate", "0.02",
                "--learning-rate-schedule", "exponential_decay:decay_steps=10,decay_rate=0.5,staircase=true",
                "--ps", "2", "--workers", "1", "--max-steps", "100", "--checkpoint-dir", str(tmp_path / "ckpt"),
                "--save-checkpoints-steps", "20", "--restart-policy", "on-failure", "--chaos", "kill:ps:0@step=30",
                "--save-summaries-steps", "1", "--output", str(out), "--quiet")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    (fault,) = metrics["faults"]
    assert fault["task"] == "/job:ps/task:0" and 30 <= fault["at_step"] < fault["recovered_at_step"] <= 100, fault
    assert metrics["global_step"] == 100 and metrics["phase"] == "finished"
    restored = re.search(r"restored checkpoint \S+ \(step (\d+)\) onto every ps task; generation \d+, global_step (\d+)",
                         (out / "logs" / "worker-0.log").read_text())
    assert restored, (out / "logs" / "worker-0.log").read_text()[-3000:]
    saved, step = int(restored.group(1)), int(restored.group(2))  # step: the last value ps task 0 handed out
    assert 20 <= saved <= fault["at_step"] <= step < 100
    assert metrics["examples"] == 256 * (saved + 100 - step)  # the steps to the checkpoint, then those after the kill
    rates = dict(read_scalars(str(out / "summaries")).get("learning_rate", []))
    assert max(rates) <= 100 and rates, rates


def test_a_reused_run_directory_s_earlier_global_step_is_not_this_run_s(tmp_path: Path) -> None:
    """A second psflow train into the same --output: ps task 0's global_step journal there is the first run's. When
    ps task 1 dies, the restore goes on past ps task 0's floor: it was the first run's last step (120), so global_step
    jumped from 30 to 120 and the run 'finished' at once with 22 of its 100 steps trained. The 70 steps between the
    kill and the end leave room for a launcher slowed by a busy machine (its poll fires the kill a little late)."""
    out = tmp_path / "run"
    common = ("train", "--train", str(A9A), "--num-features", "124", "--batch-size", "256", "--ps", "2",
              "--workers", "1", "--output", str(out), "--quiet")
    first = run_cli(*common, "--max-steps", "120")
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((out / "metrics.json").read_text())["global_step"] == 120
    r = run_cli(*common, "--max-steps", "100", "--checkpoint-dir", str(tmp_path / "ckpt"), "--save-checkpoints-steps",
                "20", "--restart-policy", "on-failure", "--chaos", "kill:ps:1@step=30")
    assert r.returncode == 0, r.stderr[-3000:]
    restored = re.search(r"restored checkpoint \S+ \(step (\d+)\) onto every ps task; generation \d+, global_step (\d+)",
                         (out / "logs" / "worker-0.log").read_text())
    assert restored, (out / "logs" / "worker-0.log").read_text()[-3000:]
    saved, step = int(restored.group(1)), int(restored.group(2))  # step: the surviving ps task 0's value, this run's
    metrics = json.loads((out / "metrics.json").read_text())
    assert 20 <= saved <= step and 30 <= step < 100, (saved, step)
    assert metrics["global_step"] == 100 and metrics["phase"] == "finished", metrics
    assert metrics["examples"] == 256 * (saved + 100 - step)
