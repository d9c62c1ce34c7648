"""Which model a finished local run evaluates: the live ps tasks', or its final checkpoint's when they lost it.

Every driver task exited 0, so the chief wrote the run's final checkpoint and nothing pushed after it: the live
ps tasks and that checkpoint hold the same model. The launcher reads the live ps tasks (no files read) unless a
ps task lost its state after training: killed and restarted empty (no chief is left to restore it; its ``Stats``
say it is not ready), or its pull failed. Then :func:`evaluate_final` evaluates the final checkpoint's variables
from the files (``--eval-moving-averages``: their moving averages, as from the ps tasks), prints one line saying
so and why, and the run's end says where its model came from (``metrics.json`` ``eval_model``). The ps task that
held global_step may be the one lost: :func:`with_step_of` then takes the run's last global_step and examples from
that final checkpoint (they are the run's: the chief wrote it at the run's last step).

A ps task whose process exited after training (no restart follows: the launcher's watch, which restarts tasks,
has returned; ``--restart-policy never``, or its restarts spent) is not waited for: :func:`gone_after_training`
names it from the launcher's own children (with ``--ps-replicas``: a shard whose every member exited), the
launcher's client connects to the other tasks only (:func:`connect_live`), and the final checkpoint is evaluated
at once, the line saying which task exited, how and when, rather than after ``--connect-timeout``: after
training; or before training ended, its restart still in its backoff then (not made: the restarts left are dropped,
so no report calls it ``restarting``); or, a shard member, during training while its shard went on without it.

Guarantee: a finished run whose final checkpoint is complete is evaluated, whichever ps task was lost past it.
A run without ``--checkpoint-dir``, or whose newest checkpoint is not final, has no copy of the lost state:
:class:`~psflow.launch.processes.LaunchError` says that training finished and that the model is lost (the run
fails, exit status 1), naming the ps tasks and the directory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from psflow.checkpoint.manifest import Manifest, read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import read_variables
from psflow.cluster.replicas import BACKUP_JOB, shard_members
from psflow.data import Batch
from psflow.errors import CheckpointError
from psflow.launch.processes import LaunchError
from psflow.launch.supervisor import describe_exit
from psflow.ps.idle import idle_tasks
from psflow.rpc.api import RpcError
from psflow.train.evaluation import ArrayParameters, evaluate, parameters

#: The task that holds global_step in a local run (the ps client's step task: the lowest ps index).
STEP_TASK = "/job:ps/task:0"

__all__ = ["FinalCheckpoint", "connect_live", "evaluate_final", "gone_after_training", "lost_after_training",
           "stats_or_silent", "with_step_of"]


@dataclass(frozen=True)
class FinalCheckpoint:
    """The run's final checkpoint, read in place of the live ps tasks; ``why``: what the ps tasks lost."""

    path: str
    manifest: Manifest
    why: str

    def record(self) -> dict[str, Any]:
        """``metrics.json``'s ``eval_model``: where the evaluated model came from, and why."""
        return {"from": "checkpoint", "path": self.path, "global_step": self.manifest.global_step, "why": self.why}


def gone_after_training(lc: Any) -> dict[str, dict[str, Any]]:
    """(Every driver task exited 0, the launcher's watch returned: nothing restarts a task now) The ps tasks whose
    newest process exited (``lc``: the run's :class:`~psflow.launch.processes.LocalCluster`), by name, each as its
    ``Stats`` stand-in ``{"task", "ready": False, "exited": True, "error"}``. With ``--ps-replicas``: each shard
    whose every member exited, under its ps task's name; a shard with a member running is live (its backup holds
    every acknowledged push). Reads exit codes and the supervisor's events only (no call).

    First ends the restarts still in their backoff (:meth:`~psflow.launch.supervisor.Supervisor.cancel_pending`).
    The error says when each process exited: ``after training`` (the watch saw no exit of it: no restart was
    decided), or ``before training ended`` / ``during training`` (the watch saw it: its restart was still in its
    backoff, and was not made; or, a shard member, its shard went on without it)."""
    supervisor = getattr(getattr(lc, "resilience", None), "supervisor", None)
    if supervisor is not None:
        supervisor.cancel_pending("training ended first")
    newest = {t.name: t for t in lc.tasks}  # started in order: a restart's process comes last
    code = {name: t.popen.poll() for name, t in newest.items()}
    replicated = BACKUP_JOB in lc.cluster.jobs
    gone: dict[str, dict[str, Any]] = {}
    for k in lc.cluster.task_indices("ps"):
        members = shard_members(lc.cluster, k) if replicated else (f"/job:ps/task:{k}",)
        if any(code.get(m) is None for m in members):
            continue
        seen = {m: _exit_seen(supervisor, newest[m]) for m in members}
        if not replicated:
            m = members[0]
            error = _when(m, describe_exit(int(code[m] or 0)), seen[m], shard=False)
        elif not any(seen.values()):
            how = ", ".join(f"{m} {describe_exit(int(code[m] or 0))}" for m in members)
            error = f"every member of shard {k} exited after training, none restarted ({how})"
        else:
            error = f"every member of shard {k} exited, none restarted: " + "; ".join(
                _when(m, describe_exit(int(code[m] or 0)), seen[m], shard=True) for m in members)
        gone[members[0]] = {"task": members[0], "ready": False, "exited": True, "error": error}
    return gone


def _exit_seen(supervisor: Any, task: Any) -> Any:
    """The supervisor's event of ``task``'s newest process's exit (the watch saw it, before training ended), or
    None: it exited after the watch returned."""
    if supervisor is None:
        return None
    pid = getattr(task, "pid", None)
    return next((e for e in reversed(supervisor.events) if e.task == task.name and e.pid == pid), None)


def _when(name: str, how: str, event: Any, *, shard: bool) -> str:
    """One task's clause of :func:`gone_after_training`'s error: how and when it exited, and its restart's fate."""
    if event is None:
        return f"{name} {how} after training" + ("" if shard else " and was not restarted")
    if "; not made: " in event.decision:  # Supervisor.cancel_pending: its restart was in its backoff
        return (f"{name} {how} before training ended; its restart ({event.decision.split('; not made: ')[0]}) was "
                "still in its backoff when training ended and was not made")
    if shard:
        return f"{name} {how} during training (its shard went on without it)"
    return f"{name} {how} during training and was not restarted ({event.decision})"


def connect_live(client: Any, gone: Mapping[str, Any]) -> None:
    """The launcher's client's connect after training: every ps task where none is ``gone``
    (:func:`gone_after_training`); else each live unreplicated task's channel only (a dead one would be waited
    for the whole connect timeout), nothing with replicated shards (their ``Stats`` are read of each member:
    :meth:`~psflow.launch.run_end.RunEnd.read_shards`; the model, from the final checkpoint)."""
    if not gone:
        client.connect()
    elif client.router is None:
        for ch in client.channels.values():
            if ch.task not in gone:
                ch.wait_ready()


def stats_or_silent(read: Callable[[int], dict[str, Any]], tasks: Iterable[int]) -> list[dict[str, Any]]:
    """``read(i)`` (ps task ``i``'s ``Stats``) of each task; a task that does not answer (an RpcError: killed,
    or restarted and not serving yet) as ``{"task", "ready": False, "error"}``: counted lost."""
    stats = []
    for i in tasks:
        try:
            stats.append(read(i))
        except RpcError as e:
            stats.append({"task": f"/job:ps/task:{i}", "ready": False, "error": str(e)})
    return stats


def lost_after_training(ps_stats: Sequence[Mapping[str, Any]], *, idle: Collection[int] = ()) -> str | None:
    """Why the live ps tasks no longer hold the run's model (each task whose ``Stats`` say it is not ready:
    restarted after training, with no chief to restore it; or that did not answer; a task that exited and was not
    restarted, :func:`gone_after_training`, by its own error), or None where every task is ready. ``idle``: the ps
    tasks holding none of the variables (:func:`psflow.ps.idle.idle_tasks`), which lose nothing of the model, ready
    or not."""
    held = [s for s in ps_stats if _task_index(s) not in idle]
    exited = [str(s.get("error")) for s in held if not s.get("ready") and s.get("exited")]
    lost = [str(s.get("task")) for s in held if not s.get("ready") and not s.get("exited")]
    if lost:
        exited.append(f"{', '.join(lost)} lost {'its' if len(lost) == 1 else 'their'} state after training "
                      "(restarted empty, not restored, or not answering)")
    return "; ".join(exited) or None


def _task_index(stats: Mapping[str, Any]) -> int | None:
    """``/job:ps/task:N``'s N (a ``Stats`` entry's ``task``); None where it names none."""
    task = str(stats.get("task", ""))
    head, _, index = task.rpartition("/task:")
    return int(index) if head == "/job:ps" and index.isdigit() else None


def evaluate_final(model: Any, client: Any, batch: Batch | None, ps_stats: Sequence[Mapping[str, Any]], *,
                   checkpoint_dir: str | None, moving_averages: bool, reached: int | None = None,
                   out: TextIO | None = None) -> tuple[dict[str, float] | None, FinalCheckpoint | None]:
    """The finished run's evaluation on ``batch`` (None: no ``--eval``, nothing evaluated) and the final
    checkpoint it read, None where the live ps tasks were read. ``ps_stats``: each ps task's ``Stats``, read
    after training; ``reached``: the run's last global_step, where known (:func:`final_checkpoint`).

    Raises:
        LaunchError: a ps task lost its state (or a pull failed) and no final checkpoint holds the model.
    """
    why = lost_after_training(ps_stats, idle=idle_tasks(client))
    if why is None:
        if batch is None:
            return None, None
        try:
            return evaluate(model, parameters(client, moving_averages=moving_averages), batch), None
        except RpcError as e:
            why = f"the ps tasks could not be read after training ({e})"
    final = final_checkpoint(checkpoint_dir, why, reached=reached)
    what = ("evaluating the final checkpoint {} (global_step {}) instead" if batch is not None
            else "the run's model is its final checkpoint {} (global_step {})")
    print(f"psflow: {why}: " + what.format(final.path, final.manifest.global_step), file=out or sys.stderr, flush=True)
    if batch is None:
        return None, final
    values = read_variables(final.path, moving_averages=moving_averages)
    return evaluate(model, ArrayParameters(values, what=final.path), batch), final


def final_checkpoint(checkpoint_dir: str | None, why: str, *, reached: int | None = None) -> FinalCheckpoint:
    """The run's final checkpoint in ``checkpoint_dir`` (the newest, its manifest ``final``, at ``reached`` or past
    it: the run's last global_step where the workers reported it; None: not known, an in-graph run's client).

    Raises:
        LaunchError: there is none (no directory, none complete, the newest not final, unreadable, or older than
            ``reached``: an earlier run's, this run's own final save having failed under ``--max-failed-saves 0``):
            training finished, but ``why``, and no copy of the model is left (the message says so).
    """
    lost = f"training finished, but {why}"
    if not checkpoint_dir:
        raise LaunchError(f"{lost}, and the run has no --checkpoint-dir: the final model is lost, not evaluated")
    try:
        path = latest_checkpoint(checkpoint_dir)
        manifest = read_manifest(path) if path is not None else None
    except (CheckpointError, OSError) as e:
        raise LaunchError(f"{lost}, and the newest checkpoint in {checkpoint_dir} cannot be read ({e}): the final "
                          "model is not evaluated") from e
    if path is None or manifest is None:
        raise LaunchError(f"{lost}, and {checkpoint_dir} holds no complete checkpoint: the final model is lost, "
                          "not evaluated")
    if not manifest.final:
        raise LaunchError(f"{lost}, and the newest checkpoint in {checkpoint_dir} is {os.path.basename(path)} "
                          f"(global_step {manifest.global_step}, not final): the final model is lost, not evaluated")
    if reached is not None and manifest.global_step < reached:
        raise LaunchError(f"{lost}, and the newest final checkpoint in {checkpoint_dir}, {os.path.basename(path)} "
                          f"(global_step {manifest.global_step}) is older than the run's last step {reached}: the "
                          "final model is lost, not evaluated")
    return FinalCheckpoint(path, manifest, why)


def with_step_of(ps_stats: list[dict[str, Any]], final: FinalCheckpoint | None) -> list[dict[str, Any]]:
    """``ps_stats``, where the task holding global_step lost its state after training (not ready: restarted
    empty, its step at 0 or its journal's bound; or none holds it) and the final checkpoint was read: that task's
    (else ps task 0's, else the first's) with the checkpoint's ``global_step`` and ``examples`` (the run's last:
    nothing pushed after the final save) and ``global_step_from`` naming it. Else unchanged."""
    if final is None or not ps_stats:
        return ps_stats
    at = next((i for i, s in enumerate(ps_stats) if s.get("global_step") is not None),
              next((i for i, s in enumerate(ps_stats) if s.get("task") == STEP_TASK), 0))
    if ps_stats[at].get("ready") and ps_stats[at].get("global_step") is not None:
        return ps_stats  # the holder kept its state: its figures are the run's
    stats = list(ps_stats)
    stats[at] = {**stats[at], "global_step": final.manifest.global_step, "examples": final.manifest.examples,
                 "global_step_from": final.path}
    return stats
