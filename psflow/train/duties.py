"""Builds a worker's MonitoredTrainingSession and hooks from a TrainConfig.

Every worker gets: :class:`StopAtStepHook` (``max_steps``, counting steps
done before a restore), :class:`NanLossHook`, :class:`StepCounterHook` and (a worker's
session) :class:`WorkerProgressHook`.
The chief also gets, when configured: :class:`CheckpointSaverHook`
(``checkpoint_dir``; every ``save_checkpoints_steps`` steps or
``save_checkpoints_secs`` seconds, default 600 s), :class:`SummarySaverHook`
(``summary_dir``, every ``save_summaries_steps``) and :class:`EvalHook`
(``eval_every_steps`` on the ``--eval`` set; also at the end; with ``eval_at_end``, which
``psflow server`` sets for ``--eval``, at the end only if there is no period; with chief election, the
final model once however many workers hold the duties at their end: :mod:`psflow.train.final_eval`).

Checkpoint safety (see :mod:`psflow.checkpoint.lock` and
:mod:`psflow.checkpoint`): every worker that may save (the chief, and
with chief election every worker) takes the run's lock of
``checkpoint_dir`` before it joins the cluster, so a second live run is
refused before it restores anything; the chief checks that the newest
checkpoint was written by this run's model (:func:`psflow.train.chief.check_restorable`)
before it restores it. A failed periodic save is logged, counted and skipped; the
``max_failed_saves``-th in a row ends the run
(:class:`~psflow.checkpoint.save.CheckpointSavesFailedError`), and so does a failed
final save (:class:`~psflow.checkpoint.save.FinalCheckpointError`; one fenced off by a
newer chief is left to that chief). Launchers
call :func:`claim_run` (their run directory, then :func:`claim_checkpoint_dir`)
before they write into the run directory or start any task.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import TextIO

from psflow.checkpoint.lock import CheckpointDirLock, RunDirLock, cluster_run_id, new_run_id
from psflow.checkpoint.lock_release import BoundedRelease
from psflow.checkpoint.manifest import Manifest, read_manifest
from psflow.checkpoint.pointer import incomplete_checkpoints, latest_checkpoint, pointer_files
from psflow.checkpoint.save import CheckpointManager
from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import member_address, ps_replicas, shard_members
from psflow.coord import CoordinationConfig
from psflow.data import DatasetConfig, ReaderPosition, epoch_start, read_all
from psflow.errors import CheckpointError
from psflow.models.api import Model
from psflow.ps.client import ParameterClient
from psflow.rpc.tls import TlsConfig
from psflow.train.build import data_options, model_record
from psflow.train.chief import check_restorable, is_chief
from psflow.train.config import TrainConfig
from psflow.train.deferred_end import DeferredEnd, RaiseDeferred
from psflow.train.faults import NO_FAULTS, FaultInjection
from psflow.train.final_eval import FinalEvalOnce
from psflow.train.hooks import (
    CheckpointSaverHook,
    EvalHook,
    NanLossHook,
    RunContext,
    RunValues,
    SessionRunHook,
    StepCounterHook,
    StopAtStepHook,
    SummarySaverHook,
    WorkerProgressHook,
)
from psflow.train.idle_tasks import ReadmitIdleTasks
from psflow.train.lock_at_end import ReleaseLockAtEnd
from psflow.train.ready_eval import ReadyEvaluation
from psflow.train.recovery import CampaignWhileTrainingHook, LeaderOnlyHook, Leadership
from psflow.train.session import MonitoredTrainingSession
from psflow.train.summary import SummaryWriter
from psflow.train.taken_over import TakenOverHook
from psflow.train.unsent_reports import SendUnsentReports

__all__ = ["make_session", "elects_chief", "coordination_config", "resume_position", "resume_from_positions",
           "resharded_epoch", "epochs_completed", "fault_exit", "run_id",
           "checkpoint_dir_lock", "claim_checkpoint_dir", "claim_run"]

log = logging.getLogger("psflow.worker")

#: Exit status of a process ended by a test fault point.
FAULT_EXIT_CODE = 75


def fault_exit(point: str | None) -> Callable[[str], None] | None:
    """A checkpoint fault hook that ends the process at phase ``point`` (tests only:
    :attr:`~psflow.train.faults.FaultInjection.checkpoint_exit`)."""
    if not point:
        return None

    def hook(phase: str) -> None:
        if phase == point:
            log.error("fault point %r reached: exiting with code %d", phase, FAULT_EXIT_CODE)
            logging.shutdown()
            os._exit(FAULT_EXIT_CODE)

    return hook


def make_session(config: TrainConfig, cluster: ClusterSpec, client: ParameterClient, model: Model,
                 job: str, task_index: int, *, leadership: Leadership | None = None,
                 chief: bool | None = None, faults: FaultInjection = NO_FAULTS,
                 save_section: Callable[[], AbstractContextManager[object]] | None = None,
                 take_over: bool = False) -> MonitoredTrainingSession:
    """The session of worker ``/job:<job>/task:<task_index>`` (not yet entered).

    ``chief``: whether this session holds the chief duties; None: the configured chief's
    (:func:`~psflow.train.chief.is_chief`). An in-graph run's client passes True: it is the run's chief.
    ``faults``: its checkpoint saves exit the process at ``faults.checkpoint_exit`` (tests).
    ``save_section``: entered around each checkpoint save (:class:`~psflow.checkpoint.save.CheckpointManager`).
    ``take_over``: a finished worker of this run may take the chief duties over (:mod:`psflow.train.take_over`);
    then this worker, resumed after one ended the run, stops before its duties run
    (:class:`~psflow.train.taken_over.TakenOverHook`).

    With ``leadership`` (chief election), every worker gets the chief hooks,
    each wrapped in a :class:`~psflow.train.recovery.LeaderOnlyHook`: they act
    only while this worker holds the chief lease; and a
    :class:`~psflow.train.recovery.CampaignWhileTrainingHook`: it campaigns
    for the lease once it runs steps. Initialization (or the restore at start)
    stays with the configured chief.
    """
    chief = is_chief(cluster, job, task_index) if chief is None else chief
    duties = chief or leadership is not None
    hooks: list[SessionRunHook] = [NanLossHook(), StepCounterHook(every_steps=config.report.log_every, name=client.client_name)]
    if job == "worker":  # the in-graph client logs its batches itself
        hooks.append(WorkerProgressHook(task_index, every_steps=config.report.log_every))
    if config.data.max_steps is not None:
        hooks.append(StopAtStepHook(last_step=config.data.max_steps))
    chief_hooks: list[SessionRunHook] = []
    release: list[SessionRunHook] = []
    optimizer = config.optimizer_spec()
    if leadership is not None:  # before the saver: a ps task holding nothing, restarted, is made ready (no restore)
        chief_hooks.append(ReadmitIdleTasks(client, optimizer, leadership.confirmed_lease, run=run_id(config, cluster)))
    elif job == "client":  # the in-graph client: the run's only chief, no lease (its readmission unfenced)
        chief_hooks.append(ReadmitIdleTasks(client, optimizer, None, run=run_id(config, cluster)))
    if config.checkpoint.dir:
        lock = checkpoint_dir_lock(config, cluster)
        if duties:  # before joining: a directory another live run holds is refused before anything is restored
            lock.acquire()
        if chief:
            _check_newest_checkpoint(config, client.client_name)
        manager = CheckpointManager(config.checkpoint.dir, max_to_keep=config.checkpoint.max_to_keep,
                                    transport=config.checkpoint.transport, fault=fault_exit(faults.checkpoint_exit),
                                    lock=lock, max_failed_saves=config.checkpoint.max_failed_saves,
                                    full_every=config.checkpoint.full_every, section=save_section)
        if leadership is not None:  # its reports the ledger missed, sent also once the duties moved on
            release.append(SendUnsentReports(manager))
        if duties:  # released at the end, not while a save given up at --save-timeout may still publish
            release.append(ReleaseLockAtEnd(lock, manager=manager))
        fence = None
        if leadership is not None:
            def fence() -> tuple[int, str] | None:
                lease = leadership.lease()
                return (lease.epoch, lease.holder) if lease is not None else None
        saver = CheckpointSaverHook(manager, save_secs=config.checkpoint.save_secs,
                                    save_steps=config.checkpoint.save_steps,
                                    optimizer=optimizer.to_json(), model=model_record(config), fence=fence,
                                    final_must_succeed=config.checkpoint.max_failed_saves != 0)
        # With election, LeaderOnlyHook lets the duties go on after a failed save; without, this does.
        chief_hooks.append(saver if leadership is not None else _FailedSaveTolerant(saver, client.client_name))
    writer = SummaryWriter(config.report.summary_dir) if duties and config.report.summary_dir else None
    if writer is not None:  # after the saver: a START owed at taking the duties is at the step the ps tasks restored,
        # whatever the saver saved
        chief_hooks.append(SummarySaverHook(writer, save_steps=config.report.save_summaries_steps))
    if duties and config.data.eval and (config.report.eval_every_steps or config.report.eval_at_end):
        eval_batch = read_all(list(config.data.eval), config.data.format, **data_options(config))
        # of one ready model, or not done (a ps task being restored: psflow.train.ready_eval)
        ready = ReadyEvaluation(model, client, eval_batch, moving_averages=config.report.eval_moving_averages)
        evaluation = EvalHook(ready, every_steps=config.report.eval_every_steps, writer=writer)
        # With election, two workers finishing together both hold the duties at their end: the final model once.
        chief_hooks.append(FinalEvalOnce(evaluation) if leadership is not None else evaluation)
    if leadership is not None:
        chief_hooks = [LeaderOnlyHook(h, leadership) for h in chief_hooks]
    if len(chief_hooks) > 1:  # the saver, the summary hook, the evaluation: no duty's failed end() skips another's
        deferred = [DeferredEnd(h) for h in chief_hooks]  # (psflow.train.deferred_end)
        chief_hooks = [*deferred, RaiseDeferred(*deferred)]
    if leadership is not None:  # it campaigns while it trains, and acts as chief while it holds the lease
        hooks.append(CampaignWhileTrainingHook(leadership))
        if take_over:  # before the duties: a worker resumed after a take-over ended the run saves and evaluates nothing
            hooks.append(TakenOverHook(leadership, config.checkpoint.dir))
        hooks += chief_hooks
        chief_hooks = []
    # Last of all (a session ends its hooks in order, the chief-only ones after the others; without election, a
    # session with duties is the chief's): the final save takes the lock again if it was deleted meanwhile, so a
    # lock released before it would be left behind. It ends also after an end() raised (ends_always).
    (hooks if leadership is not None else chief_hooks).extend(release)
    return MonitoredTrainingSession(client, optimizer, is_chief=chief, checkpoint_dir=config.checkpoint.dir,
                                    hooks=hooks, chief_only_hooks=chief_hooks, ready_timeout=config.cluster.connect_timeout,
                                    warm_start=config.model.warm_start, initial_values=model.initial_values,
                                    leader=leadership.confirmed_lease if leadership is not None else None,
                                    run=run_id(config, cluster))


def elects_chief(config: TrainConfig) -> bool:
    """Whether the workers of the run elect who holds the chief duties (:class:`~psflow.train.recovery.Leadership`):
    between-graph runs with duties to hold (checkpoints, summaries or evaluation). Without election the
    configured chief holds them (:func:`~psflow.train.chief.chief_task`)."""
    return config.sync.replication == "between-graph" and bool(
        config.checkpoint.dir or config.report.summary_dir or config.report.eval_every_steps
        or (config.data.eval and config.report.eval_at_end))  # the last worker to finish evaluates the run's model


def coordination_config(config: TrainConfig, cluster: ClusterSpec, *, token: str | None,
                        tls: TlsConfig | None = None) -> CoordinationConfig:
    """Where the run's chief lease is kept: ps task 0's lease table (``embedded``; with replicated ps shards, that
    of shard 0's primary, among its members) or ``config.chief.zookeeper``."""
    first = min(cluster.task_indices("ps"))
    address = config.chief.zookeeper if config.chief.coordination == "zookeeper" else cluster.task_address("ps", first)
    members: tuple[tuple[str, str], ...] = ()
    if config.chief.coordination == "embedded" and ps_replicas(cluster) > 0:
        members = tuple((task, member_address(cluster, task)) for task in shard_members(cluster, first))
    return CoordinationConfig(config.chief.coordination, address or "", lease_ttl=config.chief.lease_ttl, token=token,
                              tls=tls, rpc_timeout=min(5.0, config.cluster.rpc_timeout), members=members)


def resume_position(session: MonitoredTrainingSession, dataset: DatasetConfig) -> ReaderPosition | None:
    """Where this worker's data resumes: :func:`resume_from_positions` of its reported (or checkpointed) position
    and every position the ps tasks held when it joined."""
    return resume_from_positions(session.reader_position, session.reader_positions, dataset,
                                 session.client.client_name)


def resume_from_positions(own: str | None, positions: Mapping[str, str], dataset: DatasetConfig,
                          name: str) -> ReaderPosition | None:
    """Where worker ``name``'s data resumes, from its own ReaderPosition JSON ``own`` (or None) and every
    position the ps tasks hold (``positions``, by client name; its own among them or not). Only the newest
    positions count (the most ``resharded``): older ones were left by a run before the last resharding.

    * A position of this worker's share (its index) under this run's sharding (workers, shuffle buffer, seed):
      from there, exactly. ``own`` or another client's (a 1-worker between-graph run and an in-graph run read
      the same share under different names); of several, the one furthest into the data.
    * Otherwise, if they were taken under another sharding (a run resumed with another ``--workers``,
      ``--shuffle-buffer`` or ``--seed``; a position cannot be carried from one sharding to another), or the
      other workers of this sharding started at a later epoch than 0 (they resumed such positions before this
      worker joined): from the beginning of :func:`resharded_epoch`, logged as a WARNING. That epoch's records
      read before the checkpoint are read again; the epochs before it never, and ``--epochs`` still bounds the
      run's epochs.
    * Otherwise (no position, or only other workers' of this sharding, started at epoch 0: this worker had
      read nothing): None, the data from its beginning.

    Raises:
        DataError: a position that is not one, or no training file matches (the second case).
    """
    mine = ReaderPosition.from_json(own) if own is not None else None
    saved = {key: ReaderPosition.from_json(text) for key, text in positions.items() if key != name}
    newest = _newest(list(saved.values()) + ([mine] if mine is not None else []))
    # This worker's share under this sharding, whoever read it: a 1-worker between-graph run and an in-graph run
    # (its client reads alone) read the same share under different names. The furthest reading of it resumes.
    share = {key: p for key, p in [*saved.items(), (name, mine)] if p is not None and p in newest and _fits(p, dataset)}
    if share:
        key = max(share, key=lambda k: (share[k].epoch, share[k].records_consumed, k == name))
        log.info("%s: resuming data at epoch %d, %d records into it%s", name, share[key].epoch,
                 share[key].records_consumed, "" if key == name else f" (the position {key} left of the same share)")
        return share[key]
    start = resharded_epoch(newest, _sharding_of(dataset))
    if start is None:
        return None
    epoch, resharded = start
    others = sorted({_sharding(p) for p in newest if _sharding(p) != _sharding_of(dataset)})
    log.warning("%s: the saved reader positions were taken with (workers, shuffle buffer, seed) = %s, this run has "
                "%s: a position cannot be carried over, so this worker starts epoch %d of its share from its "
                "beginning (records of epoch %d read before the checkpoint are read again; epochs before it are "
                "not)", name, ", ".join(map(str, others)) or "(the other workers resumed them)",
                _sharding_of(dataset), epoch, epoch)
    return epoch_start(dataset, epoch, resharded=resharded)


def resharded_epoch(positions: list[ReaderPosition], sharding: tuple[int, int, int]) -> tuple[int, int] | None:
    """Where a worker of ``sharding`` (workers, shuffle buffer, seed) without a position of its own starts, from
    the newest saved ``positions`` (equally ``resharded``): None (epoch 0, from its beginning) when all of them
    were taken under this sharding and started at epoch 0; else (the epoch, its ``resharded``): under this
    sharding, the least ``start_epoch`` (where the others started, the same count); under another, the least of
    each position's completed epochs (:func:`epochs_completed`) and, where a worker of that sharding left no
    position, its ``start_epoch`` (that worker read nothing after it), resharded once more."""
    if all(_sharding(p) == sharding for p in positions):
        started = min((p.start_epoch for p in positions), default=0)
        return (started, positions[0].resharded) if started else None
    ends = [epochs_completed(p) for p in positions]
    readers = {(_sharding(p), p.worker_index) for p in positions}
    if len(readers) < sum(s[0] for s in {_sharding(p) for p in positions}):
        ends.append(min(p.start_epoch for p in positions))
    return min(ends), positions[0].resharded + 1


def _newest(positions: list[ReaderPosition]) -> list[ReaderPosition]:
    """The positions taken since the last resharding (the most ``resharded``)."""
    latest = max((p.resharded for p in positions), default=0)
    return [p for p in positions if p.resharded == latest]


def _sharding(position: ReaderPosition) -> tuple[int, int, int]:
    return position.num_workers, position.shuffle_buffer, position.seed


def _sharding_of(dataset: DatasetConfig) -> tuple[int, int, int]:
    return dataset.num_workers, dataset.shuffle_buffer, dataset.seed


def _fits(position: ReaderPosition, dataset: DatasetConfig) -> bool:
    return position.worker_index == dataset.worker_index and _sharding(position) == _sharding_of(dataset)


def epochs_completed(position: ReaderPosition) -> int:
    """Epochs finished at ``position`` (a position past the last file closes its epoch)."""
    return position.epoch + (1 if position.path == "" and position.file_index > 0 else 0)


def run_id(config: TrainConfig, cluster: ClusterSpec) -> str:
    """The run's id: the launcher's (``config.run_id``), else derived from the cluster and the
    checkpoint directory, alike in every task (see :func:`psflow.checkpoint.lock.cluster_run_id`)."""
    return config.run_id or cluster_run_id(cluster.to_json(), config.checkpoint.dir or "")


def checkpoint_dir_lock(config: TrainConfig, cluster: ClusterSpec) -> CheckpointDirLock:
    """The run's lock of ``config.checkpoint.dir`` (not acquired).

    Raises:
        CheckpointError: the run has no checkpoint directory.
    """
    if not config.checkpoint.dir:
        raise CheckpointError("this run has no --checkpoint-dir to lock")
    return CheckpointDirLock(config.checkpoint.dir, run_id(config, cluster))


def claim_checkpoint_dir(config: TrainConfig, *, run_dir: str | None = None,
                         out: TextIO | None = None) -> tuple[TrainConfig, CheckpointDirLock | None]:
    """(Launchers, before any task starts) Names the run and takes its checkpoint directory.

    Gives the config a fresh ``run_id`` if it has none (every task, and every
    restarted one, reads it from the config), takes the directory's lock for
    the run, and checks the newest checkpoint there against the run's model,
    printing its warnings (another seed; or that the directory holds no
    complete checkpoint, so the run starts from scratch) to ``out``. Blocks for a few file
    operations. The caller releases the lock when the run ends
    (:meth:`~psflow.checkpoint.lock.CheckpointDirLock.release`, or
    ``with lock:``); a launcher that dies leaves a stale lock the next run
    takes over.

    Returns:
        The config with its run id, and the lock (None without a checkpoint directory).

    Raises:
        CheckpointLockedError: another live run holds the directory (names it).
        CheckpointError: the newest checkpoint was written by another model, or cannot be read.
    """
    run = config.run_id or new_run_id()
    config = dataclasses.replace(config, run_id=run)
    if not config.checkpoint.dir:
        return config, None
    lock = CheckpointDirLock(config.checkpoint.dir, run, run_dir=run_dir)
    lock.acquire()
    try:
        for warning in _newest_checkpoint_warnings(config):
            if out is not None:
                print(f"psflow: warning: {warning}", file=out, flush=True)
            else:
                log.warning("%s", warning)
    except BaseException:
        lock.release()
        raise
    return config, lock


def claim_run(config: TrainConfig, run_dir: str, *,
              out: TextIO | None = None) -> tuple[TrainConfig, contextlib.ExitStack]:
    """(Launchers, before anything is written into ``run_dir`` or started) Names the run and takes its
    run directory (:class:`~psflow.checkpoint.lock.RunDirLock`), then its checkpoint directory
    (:func:`claim_checkpoint_dir`).

    Blocks for a few file operations. If the checkpoint directory is refused, the run directory is
    released before the error propagates. A run directory this process already holds for the same run
    (``psflow train`` takes it before it writes the inferred schema) is left to its taker to release.

    Returns:
        The config with its run id, and what to leave when the run ends (every lock this call took,
        released on exit, however the run ends; the checkpoint directory's waited for at most
        :data:`~psflow.checkpoint.lock_release.RELEASE_TIMEOUT` s, then named as left behind).

    Raises:
        RunDirLockedError: another live run holds ``run_dir`` (names it: run id, pid, host).
        DirectoryLockError: the run directory's lock file cannot be read or written.
        CheckpointLockedError: another live run holds the checkpoint directory (names it).
        CheckpointError: the newest checkpoint was written by another model, or cannot be read.
    """
    config = dataclasses.replace(config, run_id=config.run_id or new_run_id())
    with contextlib.ExitStack() as held:
        held.enter_context(RunDirLock(run_dir, config.run_id or ""))
        config, checkpoint_lock = claim_checkpoint_dir(config, run_dir=run_dir, out=out)
        if checkpoint_lock is not None:
            # Taken already: only its release is left to do, bounded (a store that stopped answering never ends it).
            held.enter_context(BoundedRelease(checkpoint_lock, out=out))
        return config, held.pop_all()


def _newest_checkpoint_warnings(config: TrainConfig) -> list[str]:
    if not config.checkpoint.dir:
        return []
    latest = latest_checkpoint(config.checkpoint.dir)
    if latest is None:
        return _from_scratch(config.checkpoint.dir)
    manifest = read_manifest(latest)
    return check_restorable(latest, manifest, model_record(config)) + _other_sharding(latest, manifest, config)


def _other_sharding(path: str, manifest: Manifest, config: TrainConfig) -> list[str]:
    """The console's word on a checkpoint whose newest reader positions were taken under another sharding than
    this run's (an in-graph run's client reads the data alone): where the readers without a newest position of
    this sharding start (:func:`resume_from_positions`); nothing when every reader has one."""
    if not manifest.reader_positions:
        return []
    saved = [ReaderPosition.from_json(text) for text in manifest.reader_positions.values()]
    positions = _newest(saved)
    readers = config.cluster.num_workers if config.sync.replication == "between-graph" else 1  # in-graph: the client
    ours = (readers, config.data.shuffle_buffer, config.data.seed)
    others = sorted({_sharding(p) for p in saved if _sharding(p) != ours})
    resumed = {p.worker_index for p in positions if _sharding(p) == ours}  # each resumes its own position exactly
    starting = [i for i in range(readers) if i not in resumed]
    start = resharded_epoch(positions, ours)
    if not others or not starting or start is None:
        return []
    epoch = start[0]
    some = 1 < len(starting) < readers
    who = "every worker" if len(starting) == readers else f"worker{'s' * some} {', '.join(map(str, starting))}"
    return [f"checkpoint {path} holds reader positions taken with (workers, shuffle buffer, seed) = "
            f"{', '.join(map(str, others))}; this run has {ours}: positions cannot be carried over, so {who} "
            f"start{'' if some else 's'} epoch {epoch} of {'their shares' if some else 'its share'} from its beginning "
            f"(the records of epoch {epoch} read before the checkpoint are read again; the epochs before it are not)"]


def _from_scratch(directory: str) -> list[str]:
    """A directory that held checkpoints (a pointer file, ``checkpoint`` or an epoch's ``checkpoint.e<N>``, written
    only once a checkpoint was complete, or ``ckpt-*`` directories) but has no complete one left: the run starts
    from scratch, which a user resuming a run must hear about. A fresh directory: nothing."""
    incomplete = incomplete_checkpoints(directory)
    if not incomplete and not pointer_files(directory):
        return []
    return [f"no complete checkpoint in {directory} ({len(incomplete)} incomplete directories): starting from scratch"]


def _check_newest_checkpoint(config: TrainConfig, name: str) -> None:
    """(The chief, before it restores) raises if the newest checkpoint is another model's; logs its warnings."""
    for warning in _newest_checkpoint_warnings(config):
        log.warning("%s: %s", name, warning)


class _FailedSaveTolerant(SessionRunHook):
    """Runs a :class:`CheckpointSaverHook` so that one failed save (logged and counted by the
    manager) does not end the session; :class:`~psflow.checkpoint.save.CheckpointSavesFailedError`
    (the limit), :class:`~psflow.checkpoint.save.FinalCheckpointError` (the final save) and RPC
    failures do."""

    def __init__(self, inner: SessionRunHook, name: str) -> None:
        self.inner = inner
        self.name = name

    def begin(self) -> None:
        self.inner.begin()

    def after_initialize(self, session: MonitoredTrainingSession) -> None:
        self._guard(lambda: self.inner.after_initialize(session))

    def after_create_session(self, session: MonitoredTrainingSession) -> None:
        self._guard(lambda: self.inner.after_create_session(session))

    def before_run(self, context: RunContext) -> None:
        self.inner.before_run(context)

    def after_run(self, context: RunContext, values: RunValues) -> None:
        self._guard(lambda: self.inner.after_run(context, values))

    def end(self, session: MonitoredTrainingSession) -> None:
        self._guard(lambda: self.inner.end(session))

    def _guard(self, call: Callable[[], None]) -> None:
        try:
            call()
        except CheckpointError as e:
            log.error("%s: checkpoint skipped: %s", self.name, e)
