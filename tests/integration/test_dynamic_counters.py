"""A dynamic table's counters (admitted, evicted, ...) survive a ps task's restart and a resume, resharded or not.

They were not checkpointed: a restored ps task counted from zero while the others kept the events of the steps
redone, and a resumed run counted from zero (one run reported 8,121 rows with 4,074 admitted). Each record here
has an id of its own, so every row is admitted once: admitted less the evictions is the rows held, always.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import run_cli

from psflow.ps.dynamic.snapshots import COUNTED

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

RECORDS = 2000


def _data(tmp_path: Path) -> Path:
    data = tmp_path / "unique.libsvm"  # record r: two shared ids and one of its own
    data.write_text("".join(f"{r % 2} 1:1 2:1 {100_000 + r}:1\n" for r in range(RECORDS)))
    return data


def _table(out: Path) -> dict[str, int]:
    metrics = json.loads((out / "metrics.json").read_text())
    table: dict[str, int] = metrics["dynamic_tables"]["weights"]
    assert table["admitted"] - table["evicted_ttl"] - table["evicted_capacity"] == table["rows"], table
    return table


def test_a_restarted_ps_task_and_the_restore_after_it_keep_the_tables_counters(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_cli("train", "--train", str(_data(tmp_path)), "--embedding-table", "dynamic", "--optimizer", "adagrad",
                "--ps", "2", "--workers", "1", "--epochs", "2", "--batch-size", "50", "--checkpoint-dir",
                str(tmp_path / "ckpt"), "--save-checkpoints-steps", "20", "--restart-policy", "on-failure",
                "--chaos", "kill:ps:1@step=50", "--quiet", "--no-status", "--output", str(out), timeout=250)
    assert r.returncode == 0, r.stderr[-3000:]
    log = (out / "logs" / "worker-0.log").read_text()
    assert re.search(r"restored checkpoint \S+ \(step \d+\) onto every ps task", log), log[-3000:]
    table = _table(out)
    assert table["rows"] == table["admitted"] == RECORDS + 2, table  # no eviction: every row admitted once


def test_a_resumed_run_on_more_ps_tasks_goes_on_counting_from_its_checkpoint(tmp_path: Path) -> None:
    data, ckpt = _data(tmp_path), tmp_path / "ckpt"
    common = ("train", "--train", str(data), "--embedding-table", "dynamic", "--capacity", "1500", "--optimizer",
              "adagrad", "--workers", "1", "--batch-size", "50", "--checkpoint-dir", str(ckpt), "--quiet", "--no-status")
    first = run_cli(*common, "--ps", "2", "--epochs", "1", "--output", str(tmp_path / "one"), timeout=250)
    assert first.returncode == 0, first.stderr[-3000:]
    before = _table(tmp_path / "one")
    assert before["evicted_capacity"] > 0, before
    second = run_cli(*common, "--ps", "3", "--epochs", "2", "--output", str(tmp_path / "two"), timeout=250)
    assert second.returncode == 0, second.stderr[-3000:]
    after = _table(tmp_path / "two")
    # The second epoch's admissions and evictions add to the first's (the old code: counted from zero).
    assert after["admitted"] > before["admitted"] and after["evicted_capacity"] > before["evicted_capacity"], after


def test_a_ps_kill_leaves_the_table_and_its_counters_as_an_undisturbed_run_of_the_same_seed(tmp_path: Path) -> None:
    """--ttl-steps 25 with ids reused every 20 steps (never expired) and every 40 (1 worker, so the order of steps is
    the data's): a run whose ps task 1 is killed and the cluster restored admits and evicts exactly as the run
    without the kill, and ends with the same rows. The steps it redoes take new global_step values (f127f88): had
    they aged the restored rows, the rows reused every 20 steps across the restore would expire."""
    data = tmp_path / "periodic.libsvm"  # record r: a shared id, one of 20 reused every 20 steps, one of its own
    data.write_text("".join(f"{r % 2} 1:1 {1000 + (r // 50) % 20}:1 {100_000 + r}:1\n" for r in range(RECORDS)))
    tables = {}
    for name, chaos in (("undisturbed", ()), ("killed", ("--chaos", "kill:ps:1@step=50"))):
        out = tmp_path / name
        r = run_cli("train", "--train", str(data), "--embedding-table", "dynamic", "--ttl-steps", "25", "--optimizer",
                    "adagrad", "--ps", "2", "--workers", "1", "--epochs", "3", "--batch-size", "50", "--seed", "7",
                    "--checkpoint-dir", str(tmp_path / f"ckpt-{name}"), "--save-checkpoints-steps", "20",
                    "--restart-policy", "on-failure", *chaos, "--quiet", "--no-status", "--output", str(out), timeout=250)
        assert r.returncode == 0, r.stderr[-3000:]
        tables[name] = {k: v for k, v in _table(out).items() if k in ("rows", *COUNTED)}
    log = (tmp_path / "killed" / "logs" / "worker-0.log").read_text()
    assert re.search(r"restored checkpoint \S+ \(step \d+\) onto every ps task", log), log[-3000:]
    assert tables["undisturbed"]["evicted_ttl"] > RECORDS, tables  # each epoch's own ids expire before the next
    assert tables["killed"] == tables["undisturbed"]
