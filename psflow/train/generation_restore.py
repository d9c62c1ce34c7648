"""A restore within a run: every ps task loaded from a checkpoint at a new generation.

One function, :func:`restore_at_new_generation`, used by both restorers of a running cluster: the lease holder
after a ps task died (:meth:`psflow.train.recovery.ClusterRecovery.restore`), and a restarted chief whose join
finds the run went on past its checkpoint (:func:`psflow.train.chief.join_cluster`: some ps task kept its state,
or ps task 0's journal bounds steps handed out past the checkpoint). In order, it:

1. (unless the caller registered already) registers the layout with ``chief=True, defer_ready=True``
   (:func:`register_as_chief`), creating an empty task's variables, not ready, and naming the run: ps task 0's
   global_step journal claims it (:meth:`psflow.ps.global_step.GlobalStep.claim`) before ``BeginRestore`` reads
   its floor, so a replicated shard 0 whose member 0 restarted with an older run's journal goes on past the floor
   another member's journal holds for this run, not from the older run's (as the chief's join does:
   :func:`psflow.train.chief.join_cluster`);
2. sends ``BeginRestore`` with a generation above every task's (the wall clock in ms, or one more): each task
   refuses pushes of an older generation from then on, finishes the ones in flight, aborts sync/ssp waits and
   forgets finished workers; with a lease, the lease's epoch fences it (a deposed chief's restore is refused);
3. sets global_step past every value handed out: the checkpoint's, ps task 0's journal floor, and the
   surviving counter's where ps task 0 kept its state;
4. restores the checkpoint (:func:`psflow.checkpoint.restore.restore`), then marks every task ready at the new
   generation, ps task 0 last.

Every worker still training then sees its next push refused, waits for the cluster to settle at the new
generation and resumes at the checkpoint's reader position (:meth:`~psflow.train.recovery.ClusterRecovery.wait`).

Step 1's Register, :func:`register_as_chief`, is also the one a chief's join sends (:mod:`psflow.train.chief`,
which imports this module): one request for both, so the two never differ in what they name.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from psflow.checkpoint.manifest import Manifest, read_manifest
from psflow.checkpoint.restore import restore
from psflow.coord.api import Lease
from psflow.optim import OptimizerSpec
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import BeginRestoreReply, BeginRestoreRequest, RegisterRequest, SetReadyRequest, StatsReply
from psflow.ps.registration import Registration, next_attempt, register_tasks
from psflow.rpc.api import gather
from psflow.train.within_run import written_by

__all__ = ["GenerationRestore", "restore_at_new_generation", "register_as_chief"]


def register_as_chief(client: ParameterClient, optimizer: OptimizerSpec, run: str | None, *,
                      limit: float | None = None) -> Registration:
    """The chief's Register: as :meth:`ParameterClient.register` with ``chief=True, defer_ready=True``, naming run
    ``run``, which ps task 0's global_step journal claims (:meth:`psflow.ps.global_step.GlobalStep.claim`; None:
    claims nothing). The Register of a restarted chief's join (:func:`psflow.train.chief.join_cluster`) and of a
    restore at a new generation (step 1). Blocks until every task answered; an unreachable task is asked again
    within ``limit`` s (None: ``--connect-timeout``).

    Returns:
        The tasks the call created the variables on, and which held none before (:class:`Registration`).

    Raises:
        FailedPreconditionError: another client registered a different layout, or ps task 0 could not record the
            run in its journal (names the file).
        TaskUnavailableError: a task stayed unreachable past the limit.
    """
    request = RegisterRequest(tuple(client.layout.values()), optimizer, client.sync, client.client_name, True, True,
                              client.incarnation, run, next_attempt())
    return register_tasks(client.channels, client.step_task, request, client.config,
                          client.config.connect_timeout if limit is None else limit, call=client.call_async)


@dataclass(frozen=True)
class GenerationRestore:
    """What :func:`restore_at_new_generation` did: the generation and global_step every task is ready at, and the
    restored checkpoint's manifest."""

    generation: int
    global_step: int
    manifest: Manifest


def restore_at_new_generation(client: ParameterClient, optimizer: OptimizerSpec, latest: str, lease: Lease | None,
                              states: Mapping[int, StatsReply | None], *, run: str | None, limit: float | None,
                              step_survived: bool, registered: bool = False) -> GenerationRestore:
    """Restores checkpoint ``latest`` onto every ps task at a new generation (see the module docstring).

    Args:
        client: the restorer's client.
        optimizer: the model's optimizer (registered on an empty task).
        latest: the checkpoint (taken over at ``lease``'s epoch by the caller).
        lease: the restorer's lease, whose epoch fences ``BeginRestore``; None where no election is held.
        states: every task's ``Stats`` as the caller read them (None: unreachable); the new generation is above
            each one's.
        run: this run's id, named by the Register (step 1): a replicated shard's ``pushes_applied`` is taken from a
            checkpoint of this run only.
        limit: how long the Register asks an unreachable task again (None: ``--connect-timeout``).
        step_survived: ps task 0 kept its global_step (the counter's value is then a floor too).
        registered: the caller has just registered the layout as step 1 does (the join's Register).

    Raises:
        CheckpointError: the checkpoint cannot be read or loaded.
        RpcError: a call failed; FencedOffError (ABORTED) where ``BeginRestore`` or a ``SetReady`` was fenced (a
            newer lease's holder restores instead). The tasks stay not ready.
    """
    gens = [s.generation for s in states.values() if s is not None]
    generation = max(time.time_ns() // 1_000_000, max(gens, default=0) + 1)
    if not registered:
        register_as_chief(client, optimizer, run, limit=limit)
    begin = BeginRestoreRequest(generation, *((lease.epoch, lease.holder) if lease is not None else ()))
    calls = {t: client.call_async(t, begin, timeout=30.0) for t in client.channels}
    replies = {t: BeginRestoreReply.from_frame(reply) for t, reply in gather(calls).items()}
    manifest = read_manifest(latest)
    step_reply = replies[client.step_task]
    # Past every value handed out: the surviving counter's, or the restarted task's journal floor.
    step = max(manifest.global_step, step_reply.step_floor or 0)
    if step_survived:
        step = max(step, step_reply.global_step or 0)
    restore(client, latest, global_step=step, push_counts=written_by(manifest, run), generation=generation)
    for task in sorted(client.channels, key=lambda t: t == client.step_task):
        client.call(task, SetReadyRequest(client.client_name, generation, step))
    return GenerationRestore(generation, step, manifest)
