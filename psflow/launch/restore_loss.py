"""What a restore within a local run took from its final model, said at the run's end.

A restore within the run (a ps task lost, the cluster restored at a new generation) sets the model back to a
checkpoint, but global_step goes on past every value already handed out (each step value belongs to exactly one
push: :mod:`psflow.ps.global_step`), and ``--max-steps`` counts those values. So a fault near the last step can
leave a run that stops at once after its restore, with a final model of far fewer steps than global_step says
(a restore of the initial checkpoint: none at all). The final snapshot says it plainly:

* ``metrics.json`` ``restore_loss`` (None where no restore happened within the run: the task holding global_step
  is at generation 0): ``generation``, ``global_step``, ``examples_in_model`` (this run's part of the model's
  exactly-once count), ``examples_pushed`` (what the finished driver processes report having pushed),
  ``examples_stale_at_most`` (their pushes dropped as stale, each at most one batch: never applied, restore or
  not, e.g. a sync run's backup worker's) and ``examples_discarded`` (pushed less stale less in the model, at
  least 0);
* one console line at the end (:func:`restore_loss_line`).

``examples_discarded`` is a lower bound: a killed worker process's pushes are in no result file (its restarted
process counts from its restart), so they count neither as pushed nor as discarded; a stale push counts as a
whole batch (a worker's last may be smaller).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["restore_loss", "restore_loss_line"]


def restore_loss(ps_stats: Sequence[Mapping[str, Any]], *, examples_pushed: int, examples_at_start: int,
                 examples_stale_at_most: int = 0) -> dict[str, int] | None:
    """``metrics.json``'s ``restore_loss`` (module docstring), from each ps task's ``Stats`` at the end, what the
    driver processes pushed, the examples of the checkpoint the run resumed (0 for a fresh model) and a bound on
    the pushed examples dropped as stale (their pushes times the batch size); None where the task holding
    global_step reports no restore within the run (generation 0), or none holds it."""
    head = next((s for s in ps_stats if s.get("global_step") is not None), None)
    if head is None or not int(head.get("generation") or 0):
        return None
    in_model = max(0, int(head.get("examples") or 0) - examples_at_start)
    return {"generation": int(head["generation"]), "global_step": int(head["global_step"]),
            "examples_in_model": in_model, "examples_pushed": examples_pushed,
            "examples_stale_at_most": examples_stale_at_most,
            "examples_discarded": max(0, examples_pushed - examples_stale_at_most - in_model)}


def restore_loss_line(loss: Mapping[str, int] | None) -> str | None:
    """The console line of a run whose restore discarded pushed work; None where it discarded none."""
    if loss is None or not loss["examples_discarded"]:
        return None
    return ("psflow: a restore within the run set the model back to an older "
            f"checkpoint: global_step {loss['global_step']} counts every step handed out, but the final model holds "
            f"{loss['examples_in_model']} of the {loss['examples_pushed']} examples this run's workers pushed "
            f"(at least {loss['examples_discarded']} discarded; --max-steps counts the steps lost too)")
