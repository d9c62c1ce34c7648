"""A restore within a ``--max-steps`` run that sets the model back: the run's end says how much the final model lost.

global_step goes on past every step value handed out before the restore (each value belongs to one push), and
``--max-steps`` counts them, so the restarted run stops sooner, its final model holding fewer steps than
global_step says (by design). Before, the end said only ``global_step 120`` beside an ``examples`` figure smaller
than the workers' ``examples_processed``, nothing plainly: the user read a finished run of 120 steps. Real
``psflow train`` processes; a ps task is killed (``--chaos``) with no checkpoint but the initial one, so the
restore goes back to it. Asserted on exit status, console lines and metrics.json, never on time.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support import A9A, REPO, run_bounded

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


def test_the_end_says_what_the_final_model_lost_to_a_restore(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124",
                     "--ps", "2", "--workers", "2", "--batch-size", "64", "--max-steps", "120",
                     "--checkpoint-dir", str(tmp_path / "ckpt"), "--save-checkpoints-steps", "100000",
                     "--restart-policy", "on-failure", "--chaos", "kill:ps:1@step=60", "--output", str(out),
                     "--no-status", "--quiet"], timeout=250, cwd=REPO)
    assert r.returncode == 0, r.stderr[-4000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "finished" and metrics["global_step"] >= 120
    loss = metrics["restore_loss"]
    assert loss["generation"] >= 1 and loss["global_step"] == metrics["global_step"]
    assert loss["examples_in_model"] == metrics["examples"]  # a fresh model: all of it this run's
    assert loss["examples_pushed"] == metrics["examples_processed"]
    assert loss["examples_discarded"] == loss["examples_pushed"] - loss["examples_in_model"] > 0
    # the initial checkpoint's step, as the ps tasks name what their restore loaded (null before in a between-graph run)
    assert loss["checkpoint_step"] == 0, loss
    line = next((ln for ln in r.stderr.splitlines() if "a restore within the run" in ln), None)
    assert line is not None, r.stderr[-3000:]
    assert f"global_step {metrics['global_step']}" in line and f"holds {loss['examples_in_model']} of the" in line
    assert "back to the checkpoint of global_step 0:" in line, line


@pytest.mark.parametrize("case", ["sigterm_as_written", "metrics_json_unwritable"])
def test_the_restore_loss_line_survives_a_signal_or_an_unwritten_end(tmp_path: Path, case: str) -> None:
    """The restore-loss line is the run's report: it was printed after the end's files were written, so a SIGTERM as
    they were (raised on leaving that section: exit status 0, the end stands) or a metrics.json that could not be
    written (exit status 1) left it out. ``late_signal/sitecustomize.py`` sends the SIGTERM or fails the write."""
    out = tmp_path / "run"
    hook = Path(__file__).parent / "late_signal"
    env = dict(os.environ, PSFLOW_TEST_LATE_SIGNAL="while_written" if case == "sigterm_as_written" else "",
               PSFLOW_TEST_METRICS_UNWRITABLE="1" if case == "metrics_json_unwritable" else "0",
               PYTHONPATH=os.pathsep.join([str(REPO), str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124",
                     "--ps", "2", "--workers", "2", "--batch-size", "64", "--max-steps", "120",
                     "--checkpoint-dir", str(tmp_path / "ckpt"), "--save-checkpoints-steps", "100000",
                     "--restart-policy", "on-failure", "--chaos", "kill:ps:1@step=60", "--output", str(out),
                     "--no-status", "--quiet"], timeout=250, cwd=REPO, env=env)
    assert r.returncode == (0 if case == "sigterm_as_written" else 1), r.stderr[-4000:]
    lines = [ln for ln in r.stderr.splitlines() if "a restore within the run" in ln]
    assert len(lines) == 1, r.stderr[-3000:]


def test_a_run_without_a_restore_has_no_restore_loss(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124",
                     "--ps", "2", "--workers", "2", "--batch-size", "64", "--max-steps", "40", "--output", str(out),
                     "--no-status", "--quiet"], timeout=250, cwd=REPO)
    assert r.returncode == 0, r.stderr[-4000:]
    assert json.loads((out / "metrics.json").read_text())["restore_loss"] is None
    assert "a restore within the run" not in r.stderr


def test_a_sync_run_s_stale_pushes_are_not_counted_discarded_by_the_restore(tmp_path: Path) -> None:
    """Sync mode with a backup worker (3 workers, 2 pushes per step): the third push of each step is dropped as
    stale, never in the model, restore or not. Before, ``examples_discarded`` was every pushed example the model
    did not hold, the stale ones included: 13,888 'at least discarded' where the model had held at most 7,936
    before the restore (each of global_step's steps holds 2 pushes of at most 64 examples).

    A stale push is made sure of (``first_push_barrier/sitecustomize.py``): each worker's first push waits until all
    three have read step 0, so the first step gets three pushes, one stale. Before, the test counted on the three
    training together: a worker whose process started late on a loaded machine (shown by one delayed 30 s) found the
    120 steps done by the other two, one push each per step, none stale: ``stale_dropped`` 0."""
    out = tmp_path / "run"
    barrier = tmp_path / "first_push"
    barrier.mkdir()
    hook = Path(__file__).parent / "first_push_barrier"
    env = dict(os.environ, PSFLOW_TEST_FIRST_PUSH_BARRIER=f"{barrier}:3",
               PYTHONPATH=os.pathsep.join([str(REPO), str(hook), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124",
                     "--ps", "2", "--workers", "3", "--batch-size", "64", "--max-steps", "120", "--mode", "sync",
                     "--replicas-to-aggregate", "2", "--checkpoint-dir", str(tmp_path / "ckpt"),
                     "--save-checkpoints-steps", "100000", "--restart-policy", "on-failure",
                     "--chaos", "kill:ps:1@step=60", "--output", str(out), "--no-status", "--quiet"],
                    timeout=250, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-4000:]
    assert sorted(p.name for p in barrier.iterdir()) == ["worker-0", "worker-1", "worker-2"]  # each held its first
    metrics = json.loads((out / "metrics.json").read_text())
    loss = metrics["restore_loss"]
    assert loss is not None and metrics["stale_dropped"] > 0, metrics
    # every example the run's model ever held: global_step's steps, 2 pushes of at most 64 examples each
    assert 0 < loss["examples_discarded"] <= metrics["global_step"] * 2 * 64 - loss["examples_in_model"], loss
    assert loss["examples_stale_at_most"] == metrics["stale_dropped"] * 64
