"""A killed ps task that holds none of the model's variables comes back without a restore: the trained work stays.

Seen (a real run, psflow train --ps 4 --workers 1 --model logistic --max-steps 70 --restart-policy on-failure
--chaos kill:ps:3@step=30): ps tasks 2-3 hold nothing; ps task 3 killed and restarted empty made the chief restore
the newest checkpoint onto every task (without --checkpoint-dir the launcher's recovery one: step 0), 'the final
model holds 3072 of the 35633 examples', exit 0; with --checkpoint-dir --save-checkpoints-steps 10 every save
failed ('shard-00003-of-00004 ... /job:ps/task:3 ... UNAVAILABLE'), exit 1. Now the chief makes the restarted task
ready at the cluster's generation, restoring nothing (psflow.train.idle_tasks). Real processes, the repro made
small (~10 s each).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import A9A, run_cli
from test_train_cli import leftover_processes

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MAX_STEPS, BATCH = 40, 128


@pytest.mark.parametrize("checkpoints", [False, True], ids=["recovery-checkpoints", "checkpoint-dir"])
def test_a_killed_ps_task_holding_nothing_is_brought_back_without_a_restore(tmp_path: Path, checkpoints: bool) -> None:
    out = tmp_path / "run"
    # default --max-failed-saves (3): saves while ps task 3 is down need no shard of it (it holds nothing); they
    # failed, and the third in a row stopped the run (exit 1) before psflow.checkpoint.shard_files
    extra = ["--checkpoint-dir", str(tmp_path / "ckpt"), "--save-checkpoints-steps", "5"] if checkpoints else []
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "4", "--workers", "1",
                "--model", "logistic", "--batch-size", str(BATCH), "--max-steps", str(MAX_STEPS),
                "--restart-policy", "on-failure", "--chaos", "kill:ps:3@step=15", "--no-status", "--output", str(out),
                *extra, timeout=200)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert [f["task"] for f in metrics["faults"]] == ["/job:ps/task:3"], metrics["faults"]
    assert [e["task"] for e in metrics["restarts"] if e["restarted"]] == ["/job:ps/task:3"], metrics["restarts"]
    # nothing restored: the final model holds every example trained, once
    assert metrics["restore_loss"] is None, metrics["restore_loss"]
    assert metrics["global_step"] == MAX_STEPS
    assert metrics["examples"] == metrics["examples_processed"] == MAX_STEPS * BATCH, metrics
    logs = out / "logs"
    worker = (logs / "worker-0.log").read_text()
    assert "restored checkpoint" not in worker, worker[-3000:]
    assert "/job:ps/task:3 restarted holding no variables (the placement puts none there): made ready at " \
           "generation 0; nothing was restored" in worker, worker[-3000:]
    for task in (0, 1, 2):  # the tasks that held variables (and the other idle one) never began a restore
        assert "restore to generation" not in (logs / f"ps-{task}.log").read_text()
    assert "psflow: --ps 4 for 2 variable(s): /job:ps/task:2, /job:ps/task:3 hold none of them" in r.stderr
    assert "psflow: /job:ps/task:3 restarted 1 time holding no variables: it lost nothing and was made ready again; " \
           "nothing was restored" in r.stderr, r.stderr[-3000:]
    if checkpoints:  # saves after the task came back succeed: the final checkpoint is the last step's
        assert metrics["checkpoints"]["last_saved_step"] == MAX_STEPS, metrics["checkpoints"]
        assert metrics["checkpoints"]["failed"] == 0, metrics["checkpoints"]  # none failed for the idle task
    assert leftover_processes(str(out)) == []
