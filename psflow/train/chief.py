"""Chief duties: who the chief is, and how a client joins the cluster.

The chief is task 0 of the ``chief`` job if the cluster has one, else worker
task 0 (TF1 convention). :func:`join_cluster` is the one way a training
client gets its variables ready:

Chief, in order:
    1. finds the newest complete checkpoint in ``checkpoint_dir`` (if any);
       without one, asks every ps task whether it holds variables: a task that
       is empty beside one that is ready died after the cluster was initialized,
       and initializing it now would mix fresh and trained variables, so the
       chief raises :class:`~psflow.train.state_loss.StateLostError` instead
       (see :mod:`psflow.train.state_loss`);
    2. registers the layout on every ps task with ``chief=True`` and
       ``defer_ready=True``: each task that is not ready yet creates its
       partitions (the one initialization of the cluster) and stays not ready.
       A task that is unreachable meanwhile (restarting) is asked again within
       ``--connect-timeout``, as a non-chief asks
       (:func:`psflow.ps.registration.register_tasks`), and the Register says which
       tasks it created the variables on: a task whose process held none (it
       restarted empty, however late: after step 1's check, or while it was
       asked again) beside a ready one, with no checkpoint, raises the same
       :class:`~psflow.train.state_loss.StateLostError` as step 1 (the fresh
       variables stay not ready: no pull or push ever reads them).
       With a checkpoint (ps task 0 created) it restores the checkpoint into the
       tasks (with its lease and the run id it first takes the checkpoint over at
       its lease's epoch, :func:`psflow.checkpoint.adopt.checkpoint_to_restore`, so
       an older chief whose save of it is then fenced off leaves it in place):

       * on a cluster that starts anew (no task kept its state, and ps task 0's
         journal bounds no step past the checkpoint's:
         :func:`psflow.train.within_run.lost_within_run`; a resumed run) at
         generation 0 and the checkpoint's global_step
         (:func:`psflow.checkpoint.restore.restore`), logging
         ``restored checkpoint <path> at step <S>``;
       * within the run (another task kept its state, or the journal bounds steps
         past the checkpoint: the chief died with ps task 0 while workers trained
         on) as after any ps death
         (:func:`psflow.train.generation_restore.restore_at_new_generation`): at a
         new generation, so the workers still training are refused, wait and are
         rewound to the checkpoint, with global_step past every step handed out,
         logging ``... onto every ps task, generation G, global_step S2``. If
         it holds no lease while there is an election (another worker holds it),
         or its BeginRestore or its loads are fenced (:class:`~psflow.checkpoint.restore.RestoreRefusedError`),
         it restores nothing: the tasks stay
         not ready, the lease holder restores them, and this chief waits for that
         like a worker (``JoinResult.restore_pending``);

       a task whose Register created nothing while it was not ready (a restore is in
       progress there: the ps tasks' guard, :mod:`psflow.ps.restore_gate`) makes the
       join wait for that restore the same way, with or without a checkpoint; so
       does a join that took the cluster for a fresh one when a lease holder's
       ``BeginRestore`` came after its Register (its loads, of generation 0, and
       its SetReady, of none, are refused while that restore is in progress: some
       task's Stats then show its generation); after any other refusal of the
       SetReady (no task shows a restore begun, e.g. a replicated shard's member
       that is not the primary mid-failover) it waits likewise, logging the task
       and the checkpoint: it campaigns, and the lease's holder (it, once
       elected) restores the cluster at a new generation;

       without one but with
       ``warm_start``, it loads the warm-start values instead
       (:func:`psflow.checkpoint.warm_start.warm_start`: variables only; slots and
       global_step keep their initial values). Having initialized (not restored)
       the cluster, it calls ``initialized`` (the session's hooks'
       ``after_initialize``: the initial checkpoint is written there) while no
       other client can join or push yet. Then it marks every task ready,
       ps task 0 (which non-chiefs ask first) last: so a ready ps task 0 means
       every task was initialized (and, with a checkpoint directory, that its
       initial checkpoint was written or its save failed), and a chief that dies
       half-way leaves tasks that are not ready, which its next process
       initializes again;
    3. if the tasks were already ready (the chief was restarted), nothing is
       created or restored: the ps tasks hold newer state than any checkpoint.
       With a checkpoint, a task that came back empty beside a ready ps task 0
       only gets its variables created here (not ready): the chief's first push
       then fails, and it restores every task at a new generation as after any
       ps task's death (:class:`psflow.train.recovery.ClusterRecovery`; waiting,
       it campaigns for the chief lease, which nobody else may be left to take).

Any other client (non-chief workers, the launcher, tools) registers with
``chief=False``: it never initializes anything; it asks the ps tasks again
(every 0.02 s for about a second, then with bounded exponential backoff:
:func:`psflow.ps.registration.ready_waits`) until the chief has made them ready, and
fails with :class:`~psflow.rpc.api.TaskUnavailableError` after
``ready_timeout`` seconds. No fixed sleeps.

Every client then reads its reader position (the one its pushes last
reported, or the one the restored checkpoint recorded) so its data resumes
where it stopped, and global_step; a ps task 0 unreachable then (restarting) is
asked again as in the Register, within the same limit
(:func:`psflow.ps.registration.ask_until_reachable`).

Before the chief restores at start, :func:`check_restorable` compares the
checkpoint's manifest with the run's model: a checkpoint written by another
model (name, model parameters, embedding width), or from data read another
way (format, schema, hashed id space), is refused with
:class:`~psflow.errors.CheckpointError` naming every difference;
one written with another ``--seed`` is restored with a warning (resuming
with a new seed is legitimate: the variables and optimizer state continue,
the data order follows the new seed). A checkpoint of another format
version is refused by :func:`~psflow.checkpoint.manifest.read_manifest`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from psflow.checkpoint.adopt import checkpoint_to_restore
from psflow.checkpoint.manifest import Manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.restore import RestoreRefusedError, restore
from psflow.checkpoint.warm_start import load_values, warm_start
from psflow.cluster import ClusterError, ClusterSpec, TaskId
from psflow.coord import Lease
from psflow.errors import CheckpointError
from psflow.models.api import DYNAMIC_TABLE_FLAGS, DYNAMIC_TABLE_PARAM
from psflow.optim import OptimizerSpec
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SetReadyRequest
from psflow.ps.registration import Registration, ask_until_reachable
from psflow.rpc.api import FailedPreconditionError, FencedOffError
from psflow.train.generation_restore import register_as_chief, restore_at_new_generation
from psflow.train.state_loss import StateLostError, check_state_kept, idle_tasks, ps_states, state_lost_message
from psflow.train.within_run import lost_within_run

__all__ = ["chief_task", "is_chief", "JoinResult", "join_cluster", "check_restorable", "training_view", "trainer_task"]

log = logging.getLogger("psflow.chief")


def chief_task(cluster: ClusterSpec) -> TaskId:
    """The chief: ``/job:chief/task:0`` if the cluster has a chief job, else ``/job:worker/task:0``.

    Raises:
        UnknownJobError: the cluster has neither a chief nor a worker job.
    """
    return cluster.chief()


def is_chief(cluster: ClusterSpec, job: str, index: int) -> bool:
    """Whether ``/job:<job>/task:<index>`` is the chief of ``cluster``."""
    if job not in ("chief", "worker") or job not in cluster.jobs:
        return False
    return chief_task(cluster) == TaskId(job, index)


def training_view(cluster: ClusterSpec, job: str, index: int) -> tuple[ClusterSpec, int]:
    """The cluster as the training code sees it, and this task's index among the training workers.

    With a ``chief`` job (TF2 / TFJob), the chief trains too, as in TensorFlow:
    the training workers are ``[chief 0, worker 0, worker 1, ...]`` and this
    returns a cluster whose ``worker`` job lists them in that order (the chief
    job dropped, the others kept), with the chief at index 0 (so it stays the
    chief) and ``/job:worker/task:i`` at ``i + 1``; data shards, reader
    positions, sync replicas and lease holders all count them that way.
    Without a chief job: ``(cluster, index)`` unchanged.

    Raises:
        ClusterError: ``job`` is neither ``chief`` nor ``worker``, or the chief job has more than one task.
    """
    if job not in ("chief", "worker"):
        raise ClusterError(f"/job:{job}/task:{index} does not train (only chief and worker tasks do)")
    if "chief" not in cluster.jobs:
        return cluster, index
    if cluster.num_tasks("chief") != 1:
        raise ClusterError(f"job 'chief' has {cluster.num_tasks('chief')} tasks; a chief job has one")
    chief_address = cluster.task_address("chief", min(cluster.task_indices("chief")))
    workers = list(cluster.job_tasks("worker")) if "worker" in cluster.jobs else []
    jobs: dict[str, list[str] | dict[int, str]] = {
        name: tasks for name, tasks in cluster.as_dict().items() if name not in ("chief", "worker")}
    jobs["worker"] = [chief_address, *workers]
    return ClusterSpec(jobs), 0 if job == "chief" else index + 1


def trainer_task(cluster: ClusterSpec, index: int) -> TaskId:
    """The task of training worker ``index`` as :func:`training_view` counts them (the inverse):
    with a ``chief`` job, 0 is the chief and ``i`` the i-th worker task (``/job:worker/task:i-1``
    where worker indices are dense); without one, ``/job:worker/task:index``.

    Raises:
        ClusterError: no such training worker.
    """
    if "chief" not in cluster.jobs:
        cluster.task_address("worker", index)  # raises naming the job and index
        return TaskId("worker", index)
    if index == 0:
        return TaskId("chief", min(cluster.task_indices("chief")))
    workers = sorted(cluster.task_indices("worker")) if "worker" in cluster.jobs else []
    if not 0 < index <= len(workers):
        raise ClusterError(f"no training worker {index}: the cluster has the chief and {len(workers)} worker task(s)")
    return TaskId("worker", workers[index - 1])


@dataclass(frozen=True)
class JoinResult:
    """What :func:`join_cluster` did.

    Attributes:
        created: this call created the variables (chief only).
        restored: the checkpoint restored, or None.
        global_step: global_step once the cluster is ready.
        reader_position: this client's ReaderPosition JSON to resume from, or None.
        reader_positions: every client's ReaderPosition JSON the ps tasks hold, by client name (this one's
            among them if it has one): a run resumed under another sharding reads its epoch from them.
        generation: the restore generation ps task 0 was ready at, read before the positions (None: pending).
        restore_pending: (chief) its join left the restore within the run to the lease holder: the tasks are not
            ready; it waits like a worker (:meth:`psflow.train.recovery.ClusterRecovery.wait`, generation None)
            and resumes at the position that returns (global_step and the positions here are empty).
    """

    created: bool
    restored: str | None
    global_step: int
    reader_position: str | None
    reader_positions: Mapping[str, str] = field(default_factory=dict)
    generation: int | None = None
    restore_pending: bool = False


def join_cluster(
    client: ParameterClient,
    optimizer: OptimizerSpec,
    *,
    chief: bool,
    checkpoint_dir: str | None = None,
    ready_timeout: float | None = None,
    warm_start_from: str | None = None,
    initial_values: Callable[[], Mapping[str, np.ndarray]] | None = None,
    leader: Callable[[], Lease | None] | None = None,
    run: str | None = None,
    initialized: Callable[[], None] | None = None,
) -> JoinResult:
    """Initializes (chief) or waits for (others) the cluster's variables.

    Blocks until every ps task is ready. See the module docstring for the order.

    Args:
        client: a connected client (:meth:`ParameterClient.connect`).
        optimizer: the model's optimizer.
        chief: whether this client is the chief.
        checkpoint_dir: where the chief looks for a checkpoint to restore.
        ready_timeout: seconds a non-chief waits for the chief.
        warm_start_from: (chief) variables to load when it initializes a fresh
            cluster (see :func:`psflow.checkpoint.warm_start.read_warm_start`).
        initial_values: (chief) the model's own initial values
            (:meth:`psflow.models.Model.initial_values`), loaded when it
            initializes a fresh cluster, before the warm start; called only then.
        leader: (chief) its lease now (:meth:`psflow.train.recovery.Leadership.lease`), asked once before a
            restore; with ``run`` the checkpoint is adopted at that lease's epoch (None, or no lease: read as it is).
        run: the run's id (:func:`psflow.train.duties.run_id`), which the adopted pointer records.
        initialized: (chief) called once this call initialized a fresh cluster (created the variables and loaded
            their values; not a restore), before any ps task is made ready: no other client has joined or pushed.
            What it raises propagates, and the ps tasks stay not ready.

    Raises:
        CheckpointError: the newest checkpoint (or the warm start) cannot be read or loaded, or was removed
            before its adoption with no other left.
        CheckpointFencedError: (a CheckpointError) the checkpoint's pointer was written by a newer epoch of ``run``.
        StateLostError: (chief) a ps task is empty beside ready ones and there is no checkpoint (found before the
            Register, or by it).
        FailedPreconditionError: this client's layout differs from the registered one.
        TaskUnavailableError: (non-chief) the chief did not make the cluster ready in time; a ps task stayed
            unreachable past the limit (``ready_timeout``, the chief's ``--connect-timeout``).
    """
    restored, generation = None, None
    if chief:
        latest = latest_checkpoint(checkpoint_dir) if checkpoint_dir else None
        if latest is None:  # nothing to restore from: a ps task that lost its variables stops the run here
            check_state_kept(client, ps_states(client), checkpoint_dir=checkpoint_dir)
        start_values = initial_values() if initial_values is not None and latest is None else {}
        # Every task stays not ready until all are initialized (ps task 0 made ready last).
        registration = _register(client, optimizer, run)
        if (new := registration.new - idle_tasks(client)) and registration.kept and latest is None:  # restarted empty since
            raise StateLostError(state_lost_message(client, sorted(new), sorted(registration.kept),
                                                    checkpoint_dir=checkpoint_dir))
        created = client.step_task in registration.created
        if pending := sorted(set(client.channels) - registration.created - registration.kept):
            log.warning("%s: a restore is in progress on /job:ps/task:%s (its Register created nothing there): "
                        "waiting for it", client.client_name, ", /job:ps/task:".join(map(str, pending)))
            return JoinResult(created, None, 0, None, {}, generation=None, restore_pending=True)
        if created and latest is not None and checkpoint_dir:
            restored, generation = _restore_at_join(client, optimizer, checkpoint_dir, latest, registration,
                                                    leader, run)
            if restored is None:  # the lease holder restores: this chief waits for it like a worker
                return JoinResult(created, None, 0, None, {}, generation=None, restore_pending=True)
        elif created:
            own = load_values(client, start_values, "the model's initial values") if start_values else []
            names = warm_start(client, warm_start_from) if warm_start_from is not None else []
            kept = [n for n in client.layout if n not in names and n not in own]
            log.info("%s: initialized the variables on %d ps tasks%s%s%s", client.client_name, len(client.channels),
                     f", the model's own values for {', '.join(own)}" if own else "",
                     f", warm-started {', '.join(names) or 'none'} from {warm_start_from}" if warm_start_from else "",
                     f" (initializers kept for {', '.join(kept)})" if kept and warm_start_from else "")
            if initialized is not None:  # before any other worker can push (the initial checkpoint: step 0)
                initialized()
            _set_ready(client)
    else:
        created = client.register(optimizer, ready_timeout=ready_timeout)
    limit = client.config.connect_timeout if chief or ready_timeout is None else ready_timeout
    if generation is None:  # read before the positions: a restore after them moves it on (the worker sees it)
        generation = _asked(client, lambda: client.ps_stats().generation, limit)
    positions = {name: text for name, text in _asked(client, client.reader_positions, limit).items()
                 if isinstance(text, str)}
    return JoinResult(created, restored, _asked(client, client.global_step, limit), positions.get(client.client_name),
                      positions, generation=generation)


def _register(client: ParameterClient, optimizer: OptimizerSpec, run: str | None) -> Registration:
    """The chief's Register (as :meth:`ParameterClient.register` with ``chief=True, defer_ready=True``), with the
    tasks it created the variables on: an unreachable task is asked again within ``--connect-timeout``. It names
    run ``run``, which ps task 0's global_step journal records (:meth:`psflow.ps.global_step.GlobalStep.claim`):
    :func:`~psflow.train.generation_restore.register_as_chief`, the Register of a restore at a new generation too."""
    return register_as_chief(client, optimizer, run)


def _restore_at_join(client: ParameterClient, optimizer: OptimizerSpec, directory: str, latest: str,
                     registration: Registration, leader: Callable[[], Lease | None] | None,
                     run: str | None) -> tuple[str | None, int | None]:
    """(Chief, ps task 0 created) restores checkpoint ``latest``: ``(restored, generation)``, the restored checkpoint
    and the generation the tasks are ready at (None: 0, a cluster that starts anew), or ``(None, None)`` where the
    restore is left to the lease holder (the tasks stay not ready). See step 2 of the module docstring."""
    within = bool(registration.kept) or (run is not None and lost_within_run(
        directory, run, {client.step_task: client.ps_stats()}, client.step_task))
    if not within:  # a resumed run on a fresh cluster: generation 0, the checkpoint's step
        latest = _taken_over(directory, latest, leader, run)
        try:  # generation 0: a load after a lease holder's BeginRestore is refused by the fence, nothing changed there
            manifest = restore(client, latest, generation=0)
        except RestoreRefusedError as e:  # any other failed load fails the chief (CheckpointError)
            log.warning("%s: %s: waiting for that restore", client.client_name, e)  # its SetReady opens the tasks
            return None, None
        if not _ready_at_start(client, latest):
            return None, None
        log.info("%s: restored checkpoint %s at step %d", client.client_name, latest, manifest.global_step)
        return latest, None
    lease = leader() if leader is not None else None
    if leader is not None and lease is None:
        log.warning("%s: the run went on past checkpoint %s while this chief restarted; another worker holds the "
                    "chief lease, which restores the cluster: waiting for it", client.client_name, latest)
        return None, None
    latest = _taken_over(directory, latest, lambda: lease, run)
    try:
        done = restore_at_new_generation(client, optimizer, latest, lease, ps_states(client), run=run,
                                         limit=client.config.connect_timeout, step_survived=False, registered=True)
    except (FencedOffError, RestoreRefusedError) as e:  # fenced (ABORTED): a newer lease's holder restores
        # only the fence's own refusal: another (a replicated shard's deposed member) is no holder's restore
        log.warning("%s: restore of %s refused (%s): waiting for the lease holder to restore the cluster",
                    client.client_name, latest, e)
        return None, None
    log.info("%s: restored checkpoint %s at step %d onto every ps task, generation %d, global_step %d%s",
             client.client_name, latest, done.manifest.global_step, done.generation, done.global_step,
             " (past the steps handed out since)" if done.global_step != done.manifest.global_step else "")
    return latest, done.generation


_T = TypeVar("_T")


def _asked(client: ParameterClient, ask: Callable[[], _T], limit: float) -> _T:
    """``ask()`` (a call to the task holding global_step), asked again while that task is unreachable."""
    return ask_until_reachable(ask, client=client.client_name, task=client.channels[client.step_task].task,
                               config=client.config, limit=limit)


def _taken_over(directory: str, latest: str, leader: Callable[[], Lease | None] | None, run: str | None) -> str:
    """The checkpoint the chief's first restore reads (:func:`~psflow.checkpoint.adopt.checkpoint_to_restore`, as
    :class:`~psflow.train.recovery.ClusterRecovery`'s restore): with a lease and a run id taken over at the
    lease's epoch, so an older chief whose save of it is then fenced off neither deletes it nor puts its previous
    pointer back. ``latest``: the one the chief found before it registered (named if none is left).

    Raises:
        CheckpointFencedError: the pointer was written by a newer epoch of the run (this chief was deposed).
        CheckpointError: no checkpoint is left in ``directory`` (an older chief's fenced save, the only one, was
            removed meanwhile), or the mutex was not had in time.
    """
    taken = checkpoint_to_restore(directory, run_id=run, lease=leader() if leader is not None else None)
    if taken is None:
        raise CheckpointError(f"checkpoint {latest} was removed before it could be restored (an older chief's save, "
                              f"fenced off), and {directory} holds no other; the ps tasks stay not ready")
    return taken


def _ready_at_start(client: ParameterClient, latest: str) -> bool:
    """(After the restore at start, generation 0, of checkpoint ``latest``) marks every task ready as
    :func:`_set_ready` does: True. False where a task refused the ``SetReady`` (FAILED_PRECONDITION: of no
    generation, there is no fencing token to refuse): the tasks not made ready stay so (ps task 0 among them), and the
    chief, as a worker whose cluster is being restored (:meth:`~psflow.train.recovery.ClusterRecovery.await_restore`),
    campaigns and waits for the cluster to settle at a new generation, restoring it itself once it holds the chief
    lease (bounded by the recovery timeout: a ``RecoveryError`` naming the tasks not ready). Logged as what it is:
    waiting for a lease holder's restore where some task's ``Stats`` show a generation above 0 (every loaded task was
    at 0; a restore within the run is at one above it; every task's, not the refusing one's alone: the holder's
    BeginRestores reach the tasks in any order, and the refusing one may have restarted or died since); else (e.g. a
    replicated shard's member that is not the primary, or was deposed, mid-failover) the refusal, the task and the
    checkpoint, and that the cluster is restored at a new generation instead.

    Raises:
        RpcError: a ``SetReady`` failed otherwise (a task unreachable, the variables not registered there).
    """
    for task in _ready_order(client):
        try:
            client.call(task, SetReadyRequest(client.client_name))
        except FailedPreconditionError as e:
            states = ps_states(client, timeout=client.config.rpc_timeout)  # in parallel: one deadline in all
            if began := max((s.generation for s in states.values() if s is not None), default=0):
                log.warning("%s: %s: waiting for that restore (generation %d)", client.client_name, e, began)
                return False
            said = ", ".join(f"{client.channels[t].task} {'no answer' if s is None else 'at generation 0'}"
                             for t, s in sorted(states.items()))
            log.warning("%s: checkpoint %s was loaded onto every ps task at generation 0, but %s refused to become "
                        "ready (%s) and no restore has begun (%s): the cluster is restored at a new generation by "
                        "the chief lease's holder (this chief campaigns for it)", client.client_name, latest,
                        client.channels[task].task, e, said)
            return False
    return True


def _set_ready(client: ParameterClient) -> None:
    """Marks every ps task ready, ps task 0 (which non-chiefs ask first) last."""
    for task in _ready_order(client):
        client.call(task, SetReadyRequest(client.client_name))


def _ready_order(client: ParameterClient) -> list[int]:
    """The ps tasks in the order a chief marks them ready: the one holding global_step (non-chiefs ask it) last."""
    return sorted(client.channels, key=lambda t: t == client.step_task)


#: Model-record fields that must agree for a checkpoint to be restored: (part, key, what the user changes).
_MUST_AGREE = (
    ("data", "format", "--format"),
    ("data", "num_features", "--num-features"),
    ("data", "schema", "the data schema (--schema / --feature, or the one inferred)"),
    ("config", "features", "the model's input features"),
    ("config", "embedding_dim", "--embedding-dim"),
    ("config", "params", "the model's parameters (--model-param, --hidden, --wide-optimizer, --deep-optimizer)"),
)


def _dynamic_differences(theirs: Mapping[str, Any], mine: Mapping[str, Any]) -> list[str]:
    """The dynamic table settings in which model parameters ``theirs`` (the checkpoint's) and ``mine`` differ,
    each as the flag that sets it with both values (:data:`~psflow.models.api.DYNAMIC_TABLE_FLAGS`; an option
    without one as ``--model-param dynamic_table``'s)."""
    saved, ours = theirs.get(DYNAMIC_TABLE_PARAM), mine.get(DYNAMIC_TABLE_PARAM)
    if saved == ours:
        return []
    if saved is None or ours is None or not isinstance(saved, Mapping) or not isinstance(ours, Mapping):
        kinds = ("static", "dynamic")
        return [f"--embedding-table {kinds[saved is not None]} (this run: {kinds[ours is not None]})"]

    def shown(value: object) -> str:
        return "none" if value is None else f"{value!r:.80}"
    keys = [*DYNAMIC_TABLE_FLAGS, *sorted((set(saved) | set(ours)) - set(DYNAMIC_TABLE_FLAGS))]  # the flags' order
    def flag(key: str) -> str:  # an option without a flag of its own is set in --model-param dynamic_table={...}
        return DYNAMIC_TABLE_FLAGS.get(key) or f"--model-param {DYNAMIC_TABLE_PARAM}'s {key}"
    return [f"{flag(key)} {shown(saved.get(key))} (this run: {shown(ours.get(key))})"
            for key in keys if saved.get(key) != ours.get(key)]


def check_restorable(path: str, manifest: Manifest, model: Mapping[str, Any]) -> list[str]:
    """Whether checkpoint ``path`` may be restored into a run of model record ``model``.

    ``model`` is :func:`psflow.train.build.model_record` of the run. Pure: reads nothing.

    Returns:
        Warnings to show: another seed, or a checkpoint that does not record its model.

    Raises:
        CheckpointError: it was written by another model, or for data read
            another way (names each difference and the flag that sets it).
    """
    saved = manifest.model
    if saved is None:
        writer = f"psflow {manifest.psflow_version}" if manifest.psflow_version else "an older psflow"
        return [f"checkpoint {path} does not record the model that wrote it ({writer}); restoring it without checking"]
    ours = json.loads(json.dumps(dict(model)))  # as the manifest holds it: lists, not tuples
    differences = []
    if saved.get("name") != ours.get("name"):
        differences.append(f"--model {saved.get('name')!r} (this run: {ours.get('name')!r})")
    for part, key, what in _MUST_AGREE:
        theirs, mine = (saved.get(part) or {}).get(key), (ours.get(part) or {}).get(key)
        if key == "params" and isinstance(theirs, Mapping) and isinstance(mine, Mapping):
            differences += _dynamic_differences(theirs, mine)  # named by their own flags
            theirs, mine = ({k: v for k, v in p.items() if k != DYNAMIC_TABLE_PARAM} for p in (theirs, mine))
        if theirs != mine:
            shown = f" {theirs!r:.80} (this run: {mine!r:.80})" if not isinstance(theirs, (dict, list)) else ""
            differences.append(f"{what}{shown}")
    if differences:
        raise CheckpointError(f"checkpoint {path} was written with another model: {'; '.join(differences)}. Refusing to "
                              "restore it: give this run another --checkpoint-dir, or the settings it was written with")
    seed, our_seed = (saved.get("config") or {}).get("seed"), (ours.get("config") or {}).get("seed")
    if seed != our_seed:
        return [f"checkpoint {path} was written by a run with --seed {seed}; this run has --seed {our_seed}: resuming "
                f"it (the restored variables and optimizer state continue; the data order follows --seed {our_seed})"]
    return []
