"""A ps task that lost its variables with no checkpoint to restore them from: the run stops.

A ps task that dies comes back empty (its process is new). The cluster then
holds trained variables on the tasks that survived and nothing on the
restarted one. The only way back to one consistent model is to restore every
task from a checkpoint (:mod:`psflow.train.recovery`). Where there is none
(no ``--checkpoint-dir``, or the task died before the first save), creating
the restarted task's variables from their initializers would give a model
that is half fresh and half trained, and the run would go on as if nothing
happened. It never does:

* the chief, when it joins the cluster (:func:`psflow.train.chief.join_cluster`,
  also after a restart of its own process), initializes variables only on a
  cluster where no ps task is ready, or restores every task from a checkpoint;
  it raises :class:`StateLostError` where a task is empty beside one that is
  ready and there is no checkpoint (found before its Register, or by it: a
  task that restarted empty in between);
* the chief restoring the cluster after a ps death
  (:meth:`psflow.train.recovery.ClusterRecovery.restore`) raises it when there
  is no checkpoint; every other worker raises it at once, without waiting for
  the chief, when the run has no checkpoint directory at all.

A ps task that held nothing (:func:`idle_tasks`: by the placement, not by its reply) lost nothing when it restarted
empty: it is never counted as a loss here, and the chief makes it ready again with no restore
(:mod:`psflow.train.idle_tasks`).

The error's message is one line naming the empty tasks, their variables, the
tasks that hold trained ones, and what to do. A task process that raises it
exits with :data:`psflow.launch.supervisor.STATE_LOST_EXIT_CODE`, which no
restart policy restarts: a new process would find the same cluster.

Every ps task restarted at once leaves nothing trained beside the empty
tasks: workers that see it (a run whose workers elect a chief) stop with the
same line, naming every variable of the model. What this does not cover: a
chief process that starts afterwards (restarted by whoever runs the tasks, in
a run without ``--checkpoint-dir``) sees a new cluster and initializes it.
``psflow train`` with a restart policy always has a checkpoint directory
(:func:`psflow.launch.resilience.with_recovery_checkpoints`), so there the
cluster is restored from the newest checkpoint instead.
"""

from __future__ import annotations

from collections.abc import Mapping

from psflow.errors import TrainingError
from psflow.ps.client import ParameterClient
from psflow.ps.idle import idle_tasks
from psflow.ps.protocol import StatsReply
from psflow.rpc.api import RpcError

__all__ = ["StateLostError", "ps_states", "idle_tasks", "lost_tasks", "check_state_kept", "state_lost_message"]

#: Most variable names a message lists for one task.
_NAMES_SHOWN = 4


class StateLostError(TrainingError, RuntimeError):
    """A ps task lost its variables and there is no checkpoint to restore them from (one line, names the tasks)."""


def ps_states(client: ParameterClient, *, timeout: float = 2.0) -> dict[int, StatsReply | None]:
    """Every ps task's ``Stats`` (asked in parallel), None for a task that did not answer.

    A replicated shard whose primary did not answer, or whose member refused (one without the shard's state:
    restarted and rebuilding, or deposed; :mod:`psflow.ps.replication.control_calls`), is followed to its primary
    now (one round of the members' statuses, a backup promoted where none is primary:
    :meth:`psflow.ps.failover.ShardRouter.reroute`) and asked again: the states are the shards' primaries' (or a
    backup's of the view), so a failover is never taken for a lost task; a shard none can serve now is None.
    """
    calls = {t: ch.call_async("Stats", timeout=timeout) for t, ch in client.channels.items()}
    out: dict[int, StatsReply | None] = {}
    errors: dict[int, RpcError] = {}
    for t, call in calls.items():
        try:
            out[t] = StatsReply.from_frame(call.result())
        except RpcError as e:
            out[t], errors[t] = None, e
    if errors and client.router is not None:
        for t in sorted(client.router.reroute(errors)):
            try:
                out[t] = StatsReply.from_frame(client.channels[t].call("Stats", timeout=timeout))
            except RpcError:
                pass
    return out


def lost_tasks(states: Mapping[int, StatsReply | None]) -> tuple[list[int], list[int]]:
    """``(empty, kept)``: the tasks that answered without variables, and those that hold them."""
    empty = sorted(t for t, s in states.items() if s is not None and not s.registered)
    kept = sorted(t for t, s in states.items() if s is not None and s.registered)
    return empty, kept


def check_state_kept(client: ParameterClient, states: Mapping[int, StatsReply | None], *,
                     checkpoint_dir: str | None) -> None:
    """(The chief, before it initializes, with no checkpoint to restore) refuses a cluster where a
    ps task is empty beside one that is ready: the empty one died after it was initialized.

    A task that holds variables but is not ready (the chief died while initializing or restoring)
    is no sign of a loss: it is initialized (or restored) again.

    Raises:
        StateLostError: names the empty tasks and the ready ones.
    """
    empty = [t for t in lost_tasks(states)[0] if t not in idle_tasks(client)]  # one holding nothing lost nothing
    ready = sorted(t for t, s in states.items() if s is not None and s.registered and s.ready)
    if empty and ready:
        raise StateLostError(state_lost_message(client, empty, ready, checkpoint_dir=checkpoint_dir))


def state_lost_message(client: ParameterClient, empty: list[int], kept: list[int], *,
                       checkpoint_dir: str | None) -> str:
    """The one line of a :class:`StateLostError`: which tasks, which variables, beside what, what to do."""
    tasks = ", ".join(f"/job:ps/task:{t}" for t in empty)
    # Nothing trained kept anywhere (a task that did not answer comes back empty too): the whole model is lost.
    names = [p.var.name for p in client.layout.values() if not kept or any(part.task in empty for part in p.partitions)]
    shown = ", ".join(names[:_NAMES_SHOWN]) + (f" and {len(names) - _NAMES_SHOWN} more" if len(names) > _NAMES_SHOWN else "")
    if checkpoint_dir:
        where = f"none in --checkpoint-dir {checkpoint_dir} yet"
        fix = "rerun (a ps task that dies after the first save is restored from it)"
    else:
        where, fix = "the run has no --checkpoint-dir", "rerun with --checkpoint-dir"
    if kept:
        lost = (f"{'its' if len(empty) == 1 else 'their'} variables ({shown or 'none placed there'}) would be fresh "
                f"beside trained ones on {', '.join(f'/job:ps/task:{t}' for t in kept)}")
    else:
        lost = f"every variable of the model ({shown}) is lost"
    return f"{tasks} restarted with no checkpoint to restore from ({where}): {lost}; {fix}"
