"""What a restore within a local run took from its final model, said at the run's end.

A restore within the run (a ps task lost, the cluster restored at a new generation) sets the model back to a
checkpoint, but global_step goes on past every value already handed out (each step value belongs to exactly one
push: :mod:`psflow.ps.global_step`), and ``--max-steps`` counts those values. So a fault near the last step can
leave a run that stops at once after its restore, with a final model of far fewer steps than global_step says
(a restore of the initial checkpoint: none at all). The final snapshot says it plainly:

* ``metrics.json`` ``restore_loss`` (None where no restore happened within the run: the task holding global_step is
  at generation 0; where that task exited or restarted empty after training, the ps tasks still ready say it, and
  with none ready it is not known: None): ``generation``, ``global_step``, ``checkpoint_step`` (the step of the
  checkpoint the model was last set back to: where a driver process reports it, an in-graph run's client, which
  makes every restore of its run; else as the ps tasks at the run's generation name it, their ``Stats``' record of
  what that restore loaded (a between-graph run, whose chief restores within its session); None where neither
  does: ps tasks too old to say),
  ``examples_in_model`` (this run's part of the model's exactly-once count), ``examples_pushed`` (what the driver
  processes' result files report having pushed: a restarted process's count starts at its restart),
  ``examples_stale_at_most`` (their pushes dropped as stale, each at most one batch: never applied, restore or not,
  e.g. a sync run's backup worker's), ``examples_discarded`` (at least: see below), ``drivers_restarted`` (the
  driver processes restarted in the run: workers and chief, or the in-graph client) and
  ``examples_discarded_complete``;
* one console line at the end (:func:`restore_loss_line`), where anything was discarded or may have been.

``examples_discarded`` is a lower bound, the larger of two: pushed less stale less in the model (at least 0),
and the sum of what the restores the result files report threw away (the in-graph client's: the examples ps
task 0 held just before its restore less the checkpoint's, every applied push of the client's earlier processes
in them). A killed driver process writes no result file, so its pushes are in neither unless a reported restore
covers them. ``examples_discarded_complete`` says whether everything is counted: true where no driver process
was restarted, or (in-graph) where the one restart's restore reported what it threw away; the figure is then
exact but for the stale pushes, each counted a whole batch (a worker's last may be smaller). False: the pushes of
a killed process's life, or a restore's discard, are in no count (ps task 0 lost its state; a client restarted
twice reports only its last restore), and how much more was discarded is not known: the run never says
"nothing discarded" then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from psflow.ps.protocol import restore_record

__all__ = ["restore_loss", "restore_loss_line"]


def restore_loss(ps_stats: Sequence[Mapping[str, Any]], *, examples_pushed: int, examples_at_start: int,
                 examples_stale_at_most: int = 0, restores: Sequence[Mapping[str, Any] | None] = (),
                 drivers_restarted: int = 0) -> dict[str, Any] | None:
    """``metrics.json``'s ``restore_loss`` (module docstring), from each ps task's ``Stats`` at the end, what the
    driver processes pushed, the examples of the checkpoint the run resumed (0 for a fresh model), a bound on
    the pushed examples dropped as stale (their pushes times the batch size), the restores the result files
    report (each ``{"checkpoint_step", "examples_discarded"}``, the latter None where not known; None entries:
    a result without one) and how many times a driver process was restarted; None where the task holding
    global_step reports no restore within the run (generation 0; where it lost its state after training, the
    tasks still ready: :func:`_generation`), or none holds it."""
    head = next((s for s in ps_stats if s.get("global_step") is not None), None)
    generation = _generation(head, ps_stats) if head is not None else None
    if head is None or not generation:
        return None
    in_model = max(0, int(head.get("examples") or 0) - examples_at_start)
    reported = [r for r in restores if r is not None]
    counted = [int(r["examples_discarded"]) for r in reported if r.get("examples_discarded") is not None]
    # Each restart's earlier life is counted only where the restore after it reported its discard: one restart
    # at most (the in-graph client reports its own restore only; a between-graph worker reports none).
    complete = drivers_restarted == 0 or (drivers_restarted == 1 and len(counted) == 1)
    return {"generation": generation, "global_step": int(head["global_step"]),
            "checkpoint_step": (int(reported[-1]["checkpoint_step"]) if reported
                                else _checkpoint_step(head, ps_stats, generation)),
            "examples_in_model": in_model, "examples_pushed": examples_pushed,
            "examples_stale_at_most": examples_stale_at_most,
            "examples_discarded": max(0, examples_pushed - examples_stale_at_most - in_model, sum(counted)),
            "examples_discarded_complete": complete, "drivers_restarted": drivers_restarted}


def _generation(head: Mapping[str, Any], ps_stats: Sequence[Mapping[str, Any]]) -> int:
    """The restore generation of the run's model: the holder of global_step's; where its figures are the final
    checkpoint's (``global_step_from``: it exited or restarted empty after training, its stand-in or its new
    process's generation not the run's), that of the ps tasks still ready (a restore sets every task to one
    generation); 0 where none is (not known: no restore said)."""
    if head.get("global_step_from") is None:
        return int(head.get("generation") or 0)
    return max((int(s.get("generation") or 0) for s in ps_stats if s.get("ready") and s is not head), default=0)


def _checkpoint_step(head: Mapping[str, Any], ps_stats: Sequence[Mapping[str, Any]], generation: int) -> int | None:
    """The step of the checkpoint the restore of ``generation`` (the run's: :func:`_generation`) loaded, as the ps
    tasks at that generation name it (every task's ``LoadShard`` told it), the holder of global_step first unless
    its figures are a stand-in's (``global_step_from``); None where none names it (ps tasks too old to say)."""
    tasks = [head] if head.get("global_step_from") is None else []
    for stats in [*tasks, *(s for s in ps_stats if s is not head)]:
        record = restore_record(stats) if stats.get("generation") == generation else None
        if record is not None:
            return record[1]
    return None


def restore_loss_line(loss: Mapping[str, Any] | None) -> str | None:
    """The console line of a run whose restore discarded pushed work, or may have; None where it discarded none."""
    complete = loss is not None and loss.get("examples_discarded_complete", True)
    if loss is None or (complete and not loss["examples_discarded"]):
        return None
    restarted = int(loss.get("drivers_restarted") or 0)
    step = loss.get("checkpoint_step")
    back = "an older checkpoint" if step is None else f"the checkpoint of global_step {step}"
    held = (f"{loss['examples_in_model']} of the {loss['examples_pushed']} examples this run's workers pushed"
            if not restarted else f"{loss['examples_in_model']} examples of this run")
    unknown = "" if complete else (f"; {restarted} driver process(es) restarted, their pushes before it not all "
                                   "counted: more may have been discarded")
    return (f"psflow: a restore within the run set the model back to {back}: global_step {loss['global_step']} "
            f"counts every step handed out, but the final model holds {held} (at least {loss['examples_discarded']} "
            f"discarded{unknown}; --max-steps counts the steps lost too)")
