"""metrics.json counts each record once and is standard JSON; empty inputs, overflowing values and
chaos specs naming one process twice are refused before anything runs (issue 17, items 8-10).
Real `psflow train` runs on a small slice of a9a."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support import A9A, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

RECORDS = 2000
EPOCHS = 2


def strict_loads(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, as every JSON reader but Python's does."""
    def refuse(name: str) -> None:
        raise AssertionError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A 2,000-record training file, a one-class eval file (its AUC is NaN: no negatives), an empty file."""
    d = tmp_path_factory.mktemp("data")
    lines = A9A.read_text().splitlines(keepends=True)
    (d / "train.txt").write_text("".join(lines[:RECORDS]))
    (d / "positives.txt").write_text("".join(line for line in lines[RECORDS:RECORDS + 3000] if line.startswith("+1")))
    (d / "empty.txt").write_text("")
    return {p.stem: p for p in d.iterdir()}


def train(out: Path, data: dict[str, Path], *extra: str) -> Any:
    return run_cli("train", "--train", str(data["train"]), "--num-features", "124", "--batch-size", "64",
                   "--epochs", str(EPOCHS), "--quiet", "--output", str(out), *extra, timeout=180)


def check_metrics(out: Path, stdout: str) -> dict[str, Any]:
    metrics: dict[str, Any] = strict_loads((out / "metrics.json").read_text())
    strict_loads(stdout)  # the summary printed is JSON too
    holder = next(p for p in metrics["ps"] if p["global_step"] is not None)
    assert metrics["examples"] == holder["examples"] == EPOCHS * RECORDS, metrics
    assert metrics["examples_processed"] == EPOCHS * RECORDS  # undisturbed: nothing redone, nothing lost
    assert metrics["examples_per_sec"] > 0
    assert metrics["eval"]["auc"] is None and metrics["eval"]["examples"] > 0  # NaN written as null
    return metrics


@pytest.mark.parametrize("how", ["cluster", "in-process", "in-graph"])
def test_examples_is_the_exactly_once_count_and_metrics_json_is_standard_json(how: str, tmp_path: Path,
                                                                             data: dict[str, Path]) -> None:
    extra = {"cluster": ["--ps", "2", "--workers", "2"], "in-process": ["--in-process"],
             "in-graph": ["--ps", "2", "--workers", "2", "--replication", "in-graph"]}[how]
    out = tmp_path / "run"
    r = train(out, data, "--eval", str(data["positives"]), *extra)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = check_metrics(out, r.stdout)
    if how == "cluster":
        assert metrics["examples_per_sec"] == pytest.approx(metrics["examples"] / metrics["wall_seconds"])


@pytest.mark.parametrize("flag", ["--train", "--eval"])
def test_an_empty_input_is_refused_naming_the_file_before_any_task_starts(flag: str, tmp_path: Path,
                                                                         data: dict[str, Path]) -> None:
    out = tmp_path / "run"
    if flag == "--train":
        r = run_cli("train", "--train", str(data["empty"]), "--num-features", "124", "--quiet", "--output", str(out))
    else:
        r = train(out, data, "--eval", str(data["empty"]))
    assert r.returncode == 1, r.stderr[-3000:]
    assert f"error: {flag} {data['empty']}: the file holds no libsvm records" in r.stderr, r.stderr[-3000:]
    assert not (out / "logs").exists() and not (out / "metrics.json").exists()  # nothing was started


def test_an_overflowing_value_fails_the_run_naming_file_and_line(tmp_path: Path, data: dict[str, Path]) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text(data["train"].read_text() + "1 3:1e39\n")
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(bad), "--num-features", "124", "--ps", "1", "--workers", "1", "--quiet",
                "--output", str(out), timeout=180)
    assert r.returncode == 1
    assert f"{bad}:{RECORDS + 1}: value in token '3:1e39' overflows float32" in r.stderr, r.stderr[-3000:]


def test_two_chaos_specs_naming_the_chief_and_worker_0_at_one_step_are_refused(tmp_path: Path,
                                                                              data: dict[str, Path]) -> None:
    out = tmp_path / "run"
    r = train(out, data, "--ps", "1", "--workers", "2", "--chaos", "kill:worker:0@step=5", "--chaos", "kill:chief@step=5")
    assert r.returncode == 1, r.stderr[-3000:]
    assert "'kill:worker:0@step=5' and --chaos 'kill:chief@step=5' both name /job:worker/task:0" in r.stderr, r.stderr
    assert not list((out / "logs").glob("*.log")), "a task was started"
