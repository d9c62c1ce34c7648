"""Every ps task came back empty: lost within this run (go on past its step values), or a new run?

A chief that starts and finds no ps task ready sees one of two things that look alike:

* a new run (a fresh cluster, or one resuming a checkpoint, maybe of an earlier run in the same
  ``--checkpoint-dir``): it restores the checkpoint at the checkpoint's own step
  (:func:`psflow.train.chief.join_cluster`). Its step values are its own; going on from any higher
  value would make every ordinary resume skip up to a journal block (1,000) of them;
* a process of this run restarted after every ps task died at once (the in-graph client, whose push
  failed): ps task 0 had handed out step values past the newest checkpoint's step before it died.
  Restored at the checkpoint's step, the run would hand those values out again (guarantee 2). It must
  go on past the bound ps task 0's global_step journal kept (:mod:`psflow.ps.global_step`, the
  ``step_floor`` of its ``Stats``), as the workers of a between-graph run do when they restore such a
  cluster within their run (:meth:`psflow.train.recovery.ClusterRecovery.restore`); a restarted chief's
  join then restores at a new generation as they do (:mod:`psflow.train.generation_restore`).

:func:`lost_within_run` tells the second from the first by two facts, both needed: the values were
this run's, and ps task 0's journal bounds values that an earlier process of it handed out above the
newest checkpoint's step. The values were this run's where the newest checkpoint was written by this
run (its manifest's ``run.run_id`` is this run's id, which every process of the run, restarted ones
included, reads from its config: :func:`psflow.train.duties.run_id`), or where the journal names this
run as the one that handed them out (``StatsReply.step_run``: the chief's ``Register`` names its run,
:meth:`psflow.ps.global_step.GlobalStep.claim`), as it does in a resumed run that lost every ps task
before its first checkpoint (the newest is then the earlier run's). A new run has neither: its id is
new, and a journal it finds in a reused ``--state-dir`` names the run that wrote it, or no run (one
written before runs were named, which counts as another run's), so a resume never jumps. A journal that
names another run bounds none of this run's values, even beside a checkpoint of this run: a replicated
shard 0 whose member 0 was down through the whole of this run's primary's time comes back naming an
older run, with that run's floor (above or below the checkpoint's step), while another member's journal
bounds this run's values; member 0 takes that floor only when a Register names this run
(:meth:`psflow.ps.global_step.GlobalStep.claim`). So a caller that asks before its Register (the
in-graph client) leaves such a loss to the chief's join, which asks again after its Register; and a
restore within the run names the run in its own Register (:mod:`psflow.train.generation_restore`). Without a
journal (ps task 0 started without ``--state-dir``; ``psflow train`` always gives it one) the two
cannot be told apart: the checkpoint's step is used, and the values handed out since it are handed
out again, as :mod:`psflow.train.recovery` says.

:func:`written_by` is the checkpoint's half of the first fact: a restore within a run takes a replicated shard's count of
applied pushes from a checkpoint of this run only (a new run's counts start at 0, not at an older run's).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from psflow.checkpoint.manifest import Manifest, read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.ps.protocol import StatsReply

__all__ = ["lost_within_run", "written_by"]

log = logging.getLogger("psflow.recovery")


def lost_within_run(checkpoint_dir: str | None, run: str, states: Mapping[int, StatsReply | None],
                    step_task: int) -> bool:
    """Whether a cluster whose ps tasks answered ``states`` (none of them ready) lost its state within
    run ``run``, after this run's newest checkpoint in ``checkpoint_dir`` (see the module docstring):
    then it must be restored past ps task ``step_task``'s journal bound, not at the checkpoint's step.
    Logs why when it did. Blocks for reading one manifest.

    Raises:
        CheckpointError: the newest checkpoint's manifest cannot be read.
    """
    step_state = states.get(step_task)
    floor = step_state.step_floor if step_state is not None else None
    latest = latest_checkpoint(checkpoint_dir) if checkpoint_dir and floor else None
    if latest is None or floor is None:
        return False
    named = step_state.step_run if step_state is not None else None
    if named is not None and named != run:
        return False  # another run's floor, even beside a checkpoint of this run: see the module docstring
    manifest = read_manifest(latest)
    own = written_by(manifest, run)
    if not (own or named == run) or floor <= manifest.global_step:
        return False
    log.warning("every ps task came back empty within run %s: ps task 0's journal bounds the step values it "
                "handed out before it died at %d, past the newest checkpoint %s (step %d, %s); global_step goes on "
                "past that bound", run, floor, latest, manifest.global_step,
                "written by this run" if own else "an earlier run's: the journal says this run handed them out")
    return True


def written_by(manifest: Manifest, run: str | None) -> bool:
    """Whether the checkpoint of ``manifest`` was written by run ``run`` (its ``run.run_id``; None: the run is
    not known, and any checkpoint counts as its own). A restore takes a replicated shard's ``pushes_applied``
    only from a checkpoint of its own run: another run's count is not this run's (:mod:`psflow.train.recovery`).
    """
    return run is None or (manifest.run or {}).get("run_id") == run
