"""The launcher's choice of the model a finished run evaluates (psflow.launch.final_model) and what a restore
within the run took from it (psflow.launch.restore_loss), on Stats replies and checkpoint directories alone;
the real runs are tests/integration/test_ps_lost_after_training.py and test_restore_loss_at_end.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from psflow.checkpoint.manifest import Manifest
from psflow.launch.final_model import FinalCheckpoint, final_checkpoint, lost_after_training, stats_or_silent, with_step_of
from psflow.launch.processes import LaunchError
from psflow.launch.restore_loss import restore_loss, restore_loss_line
from psflow.rpc.api import RpcError


def _ready(i: int, **kw: Any) -> dict[str, Any]:
    return {"task": f"/job:ps/task:{i}", "ready": True, "global_step": None, **kw}


def test_a_task_that_does_not_answer_or_is_not_ready_is_lost() -> None:
    def read(i: int) -> dict[str, Any]:
        if i == 1:
            raise RpcError("/job:ps/task:1: unavailable")
        return _ready(i, global_step=60)

    stats = stats_or_silent(read, [0, 1])
    assert stats[1] == {"task": "/job:ps/task:1", "ready": False, "error": "/job:ps/task:1: unavailable"}
    assert lost_after_training(stats) == ("/job:ps/task:1 lost its state after training (restarted empty, "
                                          "not restored, or not answering)")
    assert lost_after_training([_ready(0), _ready(1)]) is None


def test_no_final_checkpoint_says_the_training_finished_and_the_model_is_lost(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="training finished, but X, and the run has no --checkpoint-dir"):
        final_checkpoint(None, "X")
    with pytest.raises(LaunchError, match="holds no complete checkpoint: the final model is lost"):
        final_checkpoint(str(tmp_path), "X")


def _final(step: int, examples: int) -> FinalCheckpoint:
    manifest = Manifest(global_step=step, variables={}, shards=[], examples=examples, final=True)
    return FinalCheckpoint("/ckpt/ckpt-000000061", manifest, "why")


def test_the_step_holder_lost_takes_the_final_checkpoint_s_step_and_examples() -> None:
    lost = [{"task": "/job:ps/task:0", "ready": False, "global_step": 0, "examples": 0}, _ready(1)]
    head = with_step_of(lost, _final(61, 7808))[0]
    assert (head["global_step"], head["examples"], head["global_step_from"]) == (61, 7808, "/ckpt/ckpt-000000061")
    kept = [_ready(0, global_step=61, examples=7808), {"task": "/job:ps/task:1", "ready": False}]
    assert with_step_of(kept, _final(61, 7808)) == kept  # the holder kept its state: its figures stand
    assert with_step_of(lost, None) == lost


def test_restore_loss_only_after_a_restore_within_the_run() -> None:
    assert restore_loss([_ready(0, global_step=120, examples=900, generation=0)], examples_pushed=7680,
                        examples_at_start=0) is None
    loss = restore_loss([_ready(0, global_step=120, examples=1000, generation=1)], examples_pushed=7680,
                        examples_at_start=100)
    assert loss == {"generation": 1, "global_step": 120, "checkpoint_step": None, "examples_in_model": 900,
                    "examples_pushed": 7680, "examples_stale_at_most": 0, "examples_discarded": 6780,
                    "examples_discarded_complete": True, "drivers_restarted": 0}
    line = restore_loss_line(loss)
    assert line is not None and "global_step 120" in line and "holds 900 of the 7680" in line
    assert restore_loss_line({**loss, "examples_discarded": 0}) is None


def test_stale_pushes_are_not_counted_discarded() -> None:
    """Sync mode drops a backup worker's push as stale (never applied, restore or not): at most its batch's
    examples are left out of what the restore discarded, so the figure stays a lower bound."""
    loss = restore_loss([_ready(0, global_step=120, examples=7424, generation=1)], examples_pushed=21312,
                        examples_at_start=0, examples_stale_at_most=96 * 64)
    assert loss is not None
    assert (loss["examples_stale_at_most"], loss["examples_discarded"]) == (6144, 7744)
    all_stale = restore_loss([_ready(0, global_step=9, examples=100, generation=1)], examples_pushed=200,
                             examples_at_start=0, examples_stale_at_most=640)
    assert all_stale is not None and all_stale["examples_discarded"] == 0


def _saved(directory: Path, step: int, *, final: bool = True) -> None:
    path = directory / f"ckpt-{step:09d}"
    path.mkdir(parents=True)
    (path / "manifest.json").write_text(Manifest(global_step=step, variables={}, shards=[], examples=step * 64,
                                                 final=final).to_json())


def test_a_final_checkpoint_older_than_the_runs_last_step_is_not_taken_for_the_runs_model(tmp_path: Path) -> None:
    """A resumed run whose own final save failed (--max-failed-saves 0) and nothing saved since the resume: the
    newest final checkpoint is the earlier run's; evaluating it would report another model as this run's."""
    _saved(tmp_path, 100)
    with pytest.raises(LaunchError, match=r"ckpt-000000100 \(global_step 100\) is older than the run's last step "
                                          r"160: the final model is lost, not evaluated"):
        final_checkpoint(str(tmp_path), "X", reached=160)
    assert final_checkpoint(str(tmp_path), "X", reached=100).manifest.global_step == 100  # nothing trained since
    assert final_checkpoint(str(tmp_path), "X").manifest.global_step == 100  # the last step not known (in-graph)


def test_an_idle_task_not_ready_or_gone_after_training_lost_nothing() -> None:
    """A ps task holding none of the variables (idle: :func:`psflow.ps.idle.idle_tasks`) restarted or exited after
    training held nothing of the model: the live tasks still hold all of it (R_A1's review of 12ab6bf: the launcher
    said '/job:ps/task:3 lost its state after training' and read the final checkpoint instead)."""
    stats = [_ready(0, global_step=60), _ready(1),
             {"task": "/job:ps/task:2", "ready": False, "exited": True, "error": "/job:ps/task:2 exited 1"},
             {"task": "/job:ps/task:3", "ready": False, "error": "unavailable"}]
    assert lost_after_training(stats, idle=frozenset({2, 3})) is None
    assert lost_after_training(stats, idle=frozenset({3})) == "/job:ps/task:2 exited 1"
    assert lost_after_training([*stats[:1], {"task": "/job:ps/task:1", "ready": False}, *stats[2:]],
                               idle=frozenset({2, 3})) == ("/job:ps/task:1 lost its state after training (restarted "
                                                           "empty, not restored, or not answering)")
