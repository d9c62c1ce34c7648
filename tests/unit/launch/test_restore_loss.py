"""``restore_loss`` where a driver process was restarted (psflow.launch.restore_loss): the restores the result
files report, and a figure that never says "nothing discarded" when it cannot know.

Before: an in-graph run whose client was killed and restarted counted only the second process's pushes (the first
wrote no result file), so ``examples_discarded`` (pushed less in the model) came out 0 although the restore threw
away every push since its checkpoint (a real run: 3,264 examples, ckpt-000000200 restored at global_step 302), and
no line was printed. The real run is tests/integration/test_in_graph_client_restore_loss.py.
"""

from __future__ import annotations

from typing import Any

from psflow.launch.restore_loss import restore_loss, restore_loss_line
from psflow.ps.protocol import StatsReply

# ps task 0 at the end of that run: 6,400 examples of ckpt-000000200 and the second process's 15,936
HEAD = [{"task": "/job:ps/task:0", "ready": True, "global_step": 800, "examples": 22336, "generation": 5}]
OWN = {"checkpoint": "/ckpt/ckpt-000000200", "checkpoint_step": 200, "examples_restored": 6400,
       "examples_before": 9664, "examples_discarded": 3264}


def _loss(restores: list[Any], restarted: int, pushed: int = 15936) -> dict[str, Any]:
    loss = restore_loss(HEAD, examples_pushed=pushed, examples_at_start=0, restores=restores,
                        drivers_restarted=restarted)
    assert loss is not None
    return loss


def test_a_restarted_client_s_restore_counts_what_it_threw_away() -> None:
    loss = _loss([OWN], 1)
    assert (loss["examples_discarded"], loss["examples_discarded_complete"], loss["checkpoint_step"]) == (3264, True, 200)
    line = restore_loss_line(loss)
    assert line is not None and "the checkpoint of global_step 200" in line and "at least 3264 discarded" in line
    assert "holds 22336 examples of this run" in line and "more may have been" not in line


def test_a_restore_whose_discard_is_not_known_says_more_may_have_been_discarded() -> None:
    """ps task 0 lost its state (its count before the restore is gone), or the client was restarted twice (only
    its last restore is in a result file), or a between-graph worker was killed (its pushes in no result file)."""
    for restores, restarted in (([{**OWN, "examples_before": None, "examples_discarded": None}], 1),
                                ([OWN], 2), ([None, None], 1)):
        loss = _loss(restores, restarted)
        assert loss["examples_discarded_complete"] is False, (restores, restarted)
        line = restore_loss_line(loss)
        assert line is not None and f"{restarted} driver process(es) restarted" in line
        assert "more may have been discarded" in line, line
    assert _loss([OWN], 2)["examples_discarded"] == 3264  # what is known still counts


def test_a_run_without_a_restart_is_counted_from_its_pushes_as_before() -> None:
    loss = _loss([None, None], 0, pushed=30000)
    assert (loss["examples_discarded"], loss["examples_discarded_complete"]) == (30000 - 22336, True)
    assert loss["checkpoint_step"] is None
    line = restore_loss_line(loss)
    assert line is not None and "back to an older checkpoint" in line and "holds 22336 of the 30000" in line
    assert restore_loss_line({**_loss([None], 0, pushed=22336)}) is None  # nothing discarded, all counted


# ---- a between-graph run: the checkpoint's step from the ps tasks ----------------------------------------------------
# No driver process reports a restore in a between-graph run (the chief restores within its session), so
# checkpoint_step was null there and the line said "an older checkpoint". Every ps task's Stats now names the
# checkpoint its restore of the task's generation loaded, and its step (psflow/ps/restore_gate.py).

def _stats(task: int, examples: int = 0, **fields: Any) -> dict[str, Any]:
    return StatsReply(f"/job:ps/task:{task}", ready=True, counters={"examples": examples}, **fields).as_dict()


def test_a_between_graph_run_s_checkpoint_step_is_the_one_the_ps_tasks_name() -> None:
    named = {"generation": 5, "restored_from": "/ckpt/ckpt-000000200", "restored_from_step": 200}
    ps_stats = [_stats(0, global_step=800, examples=22336, **named), _stats(1, **named)]
    loss = restore_loss(ps_stats, examples_pushed=30000, examples_at_start=0, restores=[None, None])
    assert loss is not None and loss["checkpoint_step"] == 200
    line = restore_loss_line(loss)
    assert line is not None and "back to the checkpoint of global_step 200" in line


def test_the_checkpoint_step_of_a_holder_gone_after_training_is_the_ready_tasks() -> None:
    """ps task 0 exited after training: its figures are the final checkpoint's stand-in (``global_step_from``), its
    generation not the run's; the tasks still ready name the run's restore."""
    stand_in = {**_stats(0, global_step=800, examples=22336), "global_step_from": "/ckpt/ckpt-000000800"}
    ready = _stats(1, generation=5, restored_from="/ckpt/ckpt-000000200", restored_from_step=200)
    loss = restore_loss([stand_in, ready], examples_pushed=30000, examples_at_start=0)
    assert loss is not None and (loss["generation"], loss["checkpoint_step"]) == (5, 200)


def test_ps_tasks_too_old_to_name_it_leave_it_unknown() -> None:
    older = {k: v for k, v in _stats(0, global_step=800, examples=22336, generation=5).items()
             if not k.startswith("restored_from")}
    loss = restore_loss([older], examples_pushed=30000, examples_at_start=0)
    assert loss is not None and loss["checkpoint_step"] is None
    # another generation's (a stale figure) is not this restore's
    other = _stats(0, global_step=800, examples=22336, generation=5, restored_from_step=100)
    stale = {**_stats(1, generation=4, restored_from_step=150), "ready": False}
    assert restore_loss([other, stale], examples_pushed=30000, examples_at_start=0)["checkpoint_step"] == 100  # type: ignore[index]
