"""The in-graph client: one process reads all the data, drives every worker task, and is the run's chief.

Order of the client's life (:func:`run_in_graph_client`):
    1. build the model and its placement (:mod:`psflow.train.build`), connect
       to every ps task (a bounded wait), and make its session as the chief
       (:func:`psflow.train.duties.make_session`, the between-graph chief's
       hooks): this takes the run's lock of ``--checkpoint-dir`` and checks the
       newest checkpoint there against the run's model;
    2. if the ps tasks were initialized already (this client is a restarted
       one, or a ps task was restarted), restore EVERY ps task from the newest
       checkpoint at a new generation
       (:meth:`~psflow.train.recovery.ClusterRecovery.restore`, unfenced: the
       client is the only chief), so the run goes on from a state in which
       every record up to the checkpoint's reader position was trained once;
       global_step goes on from the value the surviving ps task 0 held (no
       step value is handed out twice). Every ps task empty is a fresh cluster,
       unless it was lost within this run (:mod:`psflow.train.within_run`):
       then global_step goes on past ps task 0's journal bound. Without a checkpoint the ps tasks'
       state is kept, and a ps task that lost its variables stops the run
       (:class:`~psflow.train.state_loss.StateLostError`). The restore is
       recorded (:class:`RestoreAtStart`: the checkpoint's step and examples, and
       the examples ps task 0 held before it, the earlier processes' pushes in
       them) for the result file, and told to the session's hooks once it is
       entered (3.), so the summaries start again at the checkpoint's step;
    3. connect to every worker task's ``RunStep`` (:class:`~psflow.train.in_graph.Session`,
       a bounded wait) and enter the session: it initializes the
       variables or restores the newest checkpoint, saves checkpoints
       (``--save-checkpoints-steps/secs``, one when training starts, a final
       one), writes the chief's TensorBoard summaries and runs the periodic
       evaluation;
    4. open the data at the reader position recorded for ``in-graph client``
       (the restored checkpoint's; the start of the data on a fresh run);
    5. per batch of ``W x --batch-size`` examples: one slice per worker, each
       worker runs the model's step on its slice (pull and compute, in
       parallel) and returns its gradients; workers never push. Then the
       client pushes: ``async``, each slice's gradient (one global step each,
       in worker order); ``sync``, their average, each slice's weighted by its
       share of the batch (an epoch's last batch splits unevenly), once (one
       step): one process's gradient on the batch (but with a clip norm each
       worker clipped its slice's gradient first). Every push
       carries the examples it trained and the reader position after this
       batch; the hooks (checkpoints among them) run after the batch's last
       push, so a checkpoint never holds part of a batch, and its example
       count and reader position agree;
    6. log ``step=S loss=L`` (the step's own loss: the slice's in async mode,
       the slices' mean, weighted as the gradients, in sync mode) for every step ``S % --log-every == 0``;
       stop at the end of the data or at ``--max-steps``, and leave (``Leave``,
       as a between-graph worker whose data ended); then the session's end
       writes the final checkpoint and summaries.

Failures:
    * A worker task whose ``RunStep`` fails as unreachable or past its
      deadline (killed; hung, then killed by the launcher's liveness check):
      the client reconnects and waits for it, at most ``--connect-timeout``
      seconds, and runs the same slice on it again. A worker pushes nothing,
      so the slice's gradient is pushed once, by the client. After the wait,
      :class:`~psflow.train.recovery.RecoveryError` names the worker.
    * The client dies: its restarted process (``--restart-policy
      on-failure``) restores the newest checkpoint (2.) and resumes the data at
      its reader position: the records since that checkpoint are trained
      again, none twice relative to the model state, none skipped.
    * A ps task dies: the client's next push (or a worker's pull) fails and
      the client exits with that error, one line naming the task (a worker
      whose pull failed refuses the step with FAILED_PRECONDITION and logs one
      line); restarted, it restores every ps task from the newest checkpoint, as in 2.
    * A ps task that holds nothing dies (:mod:`psflow.train.idle_tasks`: no push or pull reaches it): the
      client's :class:`~psflow.train.idle_tasks.ReadmitIdleTasks` hook, unfenced (the client holds no lease),
      makes its replacement ready at the cluster's generation; nothing is restored and training goes on.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.cluster import ClusterSpec
from psflow.data import Batch, DatasetConfig, open_dataset
from psflow.errors import CheckpointError
from psflow.models.api import Model
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import RunStepReply
from psflow.rpc.api import ConnectConfig, DeadlineExceededError, RpcError, TaskUnavailableError
from psflow.rpc.tls import TlsConfig
from psflow.train.build import build_model, data_options
from psflow.train.config import ConfigError, TrainConfig
from psflow.train.duties import epochs_completed, make_session, resume_from_positions, run_id
from psflow.train.faults import NO_FAULTS, FaultInjection
from psflow.train.hooks import NanLossError, format_metrics, nan_loss_message
from psflow.train.in_graph import BUILTIN_STEPS, Session, average_gradients
from psflow.train.recovery import ClusterRecovery, RecoveryError
from psflow.train.session import MonitoredTrainingSession
from psflow.train.state_loss import ps_states
from psflow.train.step import LazyMetrics
from psflow.train.within_run import lost_within_run
from psflow.train.worker_result import evaluations_not_done

__all__ = ["CLIENT_NAME", "InGraphDriver", "InGraphStepResult", "RestoreAtStart", "run_in_graph_client"]

log = logging.getLogger("psflow.in_graph")

#: The client's name on the ps tasks: its pushes, reader position and chief duties go by it.
CLIENT_NAME = "in-graph client"


@dataclass(frozen=True)
class InGraphStepResult:
    """What one batch of the client produced (a :class:`~psflow.train.session.StepReport`).

    Attributes:
        step: the last global_step the batch's pushes produced.
        loss: that step's loss.
        examples: examples in the batch.
        metrics: the model's metrics of the whole batch, computed on first access.
        steps: every global_step the batch's pushes produced (async: one per slice).
        completed: True: the client's pushes own their steps (it logs them itself).
        min_clock: None: no ssp in-graph.
    """

    step: int
    loss: float
    examples: int
    metrics: Mapping[str, float] = field(default_factory=dict)
    steps: tuple[int, ...] = ()
    completed: bool = True
    min_clock: int | None = None


@dataclass(frozen=True)
class _Slice:
    """One worker's part of a batch and what its ``RunStep`` returned."""

    session: Session
    batch: Batch
    reply: RunStepReply
    grads: Any

    @property
    def loss(self) -> float:
        return self.reply.loss

    def outputs(self) -> dict[str, np.ndarray]:
        return {k: np.asarray(v) for k, v in self.reply.outputs.items()}


def _concat_outputs(slices: Sequence[_Slice]) -> dict[str, np.ndarray]:
    outputs = [s.outputs() for s in slices]
    return {k: np.concatenate([o[k] for o in outputs]) for k in outputs[0]}


class InGraphDriver:
    """Runs the batches of one client process (see the module docstring, 5.-6.); not thread-safe.

    ``client`` pushes (a connected :class:`ParameterClient`, chief); ``sessions`` reach the workers, one
    slice of each batch each, in this order; every push carries ``generation``, the cluster's restore
    generation (None: not checked).
    """

    def __init__(self, config: TrainConfig, model: Model, client: ParameterClient, sessions: Sequence[Session], *,
                 generation: int | None = None) -> None:
        self.config, self.model, self.client, self.sessions = config, model, client, sessions
        self.generation = generation
        self.step_fn = BUILTIN_STEPS[0]
        self.examples = 0
        self.steps = 0

    def run_batch(self, big: Batch, position: str) -> InGraphStepResult:
        """Runs ``big`` on the workers, pushes its gradients, logs its steps; blocks until pushed.

        Raises:
            NanLossError: a slice's loss is not finite (names the worker, the step, the batch).
            RecoveryError: a worker did not come back in time to run its slice again.
            RpcError: a ps task (or a worker, for another reason than its loss) failed.
        """
        n = big.num_examples
        bounds = np.linspace(0, n, len(self.sessions) + 1).astype(int)
        parts = [(s, big.slice(int(a), int(b))) for s, a, b in zip(self.sessions, bounds[:-1], bounds[1:], strict=True)
                 if b > a]
        slices = self._run_slices(parts)
        # Every push carries the position after the whole batch: checkpoints resume after it.
        if self.config.sync.mode == "sync":
            steps, losses = self._push_sync(slices, big, position)
        else:
            steps, losses = self._push_async(slices, big, position)
        self.examples += n
        self.steps += len(steps)
        metrics = LazyMetrics(lambda: self.model.metrics(big.labels, _concat_outputs(slices)))
        return InGraphStepResult(steps[-1], losses[-1], n, metrics, tuple(steps))

    def _push_sync(self, slices: Sequence[_Slice], big: Batch, position: str) -> tuple[list[int], list[float]]:
        """One push of the slices' mean gradient (one step); logs it."""
        sizes = [s.batch.num_examples for s in slices]  # each slice's mean counts by its share of the batch
        loss = float(np.average([s.loss for s in slices], weights=sizes))
        reads = [s.reply.read_step for s in slices if s.reply.read_step is not None]
        if not math.isfinite(loss):
            self._raise_nan(slices, big)
        grads = average_gradients([s.grads for s in slices], sizes)
        step = self.client.push_detailed(grads, examples=big.num_examples, loss=loss,
                                         read_step=min(reads) if reads else None, position=position,
                                         generation=self.generation).step
        if step % self.config.report.log_every == 0:
            self._log(step, loss, self.model.metrics(big.labels, _concat_outputs(slices)), len(slices))
        return [step], [loss]

    def _push_async(self, slices: Sequence[_Slice], big: Batch, position: str) -> tuple[list[int], list[float]]:
        """One push per slice, in worker order (one step each); logs each with its own loss."""
        if any(not math.isfinite(s.loss) for s in slices):
            self._raise_nan(slices, big)
        steps, losses = [], []
        for s in slices:
            step = self.client.push_detailed(s.grads, examples=s.batch.num_examples, loss=s.loss,
                                             read_step=s.reply.read_step, position=position,
                                             generation=self.generation).step
            steps.append(step)
            losses.append(s.loss)
            if step % self.config.report.log_every == 0:
                self._log(step, s.loss, self.model.metrics(s.batch.labels, s.outputs()), len(slices))
        return steps, losses

    def _log(self, step: int, loss: float, metrics: Mapping[str, float], workers: int) -> None:
        log.info("in-graph client: step=%d loss=%.4f %s workers=%d", step, loss, format_metrics(metrics), workers)

    def _raise_nan(self, slices: Sequence[_Slice], big: Batch) -> None:
        """Raises NanLossError naming the first worker whose loss is not finite, at the step its values were
        read at (nothing of this batch is pushed), and the batch it split."""
        first = next(s for s in slices if not math.isfinite(s.loss))
        read = first.reply.read_step
        step = read if read is not None else self.client.global_step()
        raise NanLossError(nan_loss_message(first.session.task, first.loss, step, big.source))

    def _run_slices(self, parts: Sequence[tuple[Session, Batch]]) -> list[_Slice]:
        """Each slice's ``RunStep`` on its worker, all in flight at once; a worker that failed as unreachable
        or past its deadline runs its slice again once it is back (:meth:`_rerun`)."""
        pending = [(s, batch, s.run_async(self.step_fn, batch, push=False)) for s, batch in parts]
        out = []
        for session, batch, result in pending:
            try:
                reply, grads = result()
            except (TaskUnavailableError, DeadlineExceededError) as e:
                reply, grads = self._rerun(session, batch, e)
            out.append(_Slice(session, batch, reply, grads))
        return out

    def _rerun(self, session: Session, batch: Batch, error: RpcError) -> tuple[RunStepReply, Any]:
        """Waits for ``session``'s worker to come back (at most ``connect_timeout`` s) and runs ``batch`` on it.

        Raises:
            RecoveryError: the worker did not run the slice within the wait (names it and the first error).
        """
        limit = self.config.cluster.connect_timeout
        started = time.monotonic()
        deadline = started + limit
        log.warning("in-graph client: %s failed its step (%s); waiting up to %.0f s for it to run the slice again",
                    session.task, str(error).splitlines()[0][:200], limit)
        while True:
            session.reconnect()
            try:
                session.connect(timeout=max(0.1, deadline - time.monotonic()))
                reply, grads = session.run(self.step_fn, batch, push=False)
            except (TaskUnavailableError, DeadlineExceededError) as e:
                if time.monotonic() >= deadline:
                    raise RecoveryError(f"in-graph client: {session.task} did not run its slice of the batch again "
                                        f"within {limit:g} s (--connect-timeout) after it failed: {error}; "
                                        f"last error: {e}") from e
                time.sleep(0.2)
                continue
            log.warning("in-graph client: %s ran the slice again after %.1f s", session.task,
                        time.monotonic() - started)
            return reply, grads


@dataclass(frozen=True)
class RestoreAtStart:
    """The restore this client process made before its session (module docstring, 2.) and what it threw away.

    Attributes:
        checkpoint: the checkpoint restored onto every ps task.
        restored_step: its global_step: the step of the model the run goes on from (global_step itself goes on
            past every value handed out).
        examples_restored: its example count, the model's after the restore.
        examples_before: the count of the task holding global_step just before the restore: the model's, every
            applied push of the client's earlier processes in it (None: that task had lost its state).
    """

    checkpoint: str
    restored_step: int
    examples_restored: int
    examples_before: int | None

    def record(self) -> dict[str, Any]:
        """The result file's ``restore`` (:mod:`psflow.launch.restore_loss` reads it): these fields and
        ``examples_discarded``, the examples the model held that the restore set back (None: not known)."""
        discarded = None if self.examples_before is None else max(0, self.examples_before - self.examples_restored)
        return {"checkpoint": self.checkpoint, "checkpoint_step": self.restored_step,
                "examples_restored": self.examples_restored, "examples_before": self.examples_before,
                "examples_discarded": discarded}


def _restore_initialized_cluster(config: TrainConfig, client: ParameterClient) -> RestoreAtStart | None:
    """(Module docstring, 2.) If the ps tasks were initialized already, restores every one of them from the
    newest checkpoint and returns what it did; None on a fresh cluster, or without a checkpoint (logged).

    Raises:
        RecoveryError: a ps task did not answer within ``connect_timeout``.
        CheckpointError, RpcError: the restore failed.
    """
    deadline = time.monotonic() + config.cluster.connect_timeout
    states = ps_states(client)
    while any(s is None for s in states.values()):
        if time.monotonic() > deadline:
            down = ", ".join(f"/job:ps/task:{t}" for t, s in sorted(states.items()) if s is None)
            raise RecoveryError(f"{client.client_name}: no answer from {down} within {config.cluster.connect_timeout:.0f} s")
        time.sleep(0.2)
        states = ps_states(client)
    if not any(s is not None and s.ready for s in states.values()) and not lost_within_run(
            config.checkpoint.dir, run_id(config, client.cluster), states, client.step_task):
        return None  # a fresh cluster (or one its chief never made ready, or a new run's): the session joins it
    latest = latest_checkpoint(config.checkpoint.dir) if config.checkpoint.dir else None
    if latest is None:
        log.warning("%s: the ps tasks were initialized before this client started and there is no checkpoint to "
                    "restore: training goes on from their state and the reader position they recorded",
                    client.client_name)
        return None
    manifest = read_manifest(latest)  # the client is the run's only chief: nothing saves or rotates meanwhile
    head = states[client.step_task]
    before = head.counters.get("examples") if head is not None and head.registered else None
    ClusterRecovery(client, config.optimizer_spec(), checkpoint_dir=config.checkpoint.dir, leader=lambda: None,
                    timeout=config.cluster.connect_timeout, run=run_id(config, client.cluster)).restore(None, states)
    return RestoreAtStart(latest, manifest.global_step, manifest.examples,
                          int(before) if isinstance(before, int) else None)


def _joined_restore(checkpoint: str) -> RestoreAtStart | None:
    """The restore the session's join made (a fresh cluster: a resumed run's, or one within the run whose ps tasks
    were all lost): what the model held before it is not known. None: its manifest is gone (rotated away)."""
    try:
        manifest = read_manifest(checkpoint)
    except CheckpointError as e:
        log.warning("in-graph client: the checkpoint its session restored is not readable now: %s", e)
        return None
    return RestoreAtStart(checkpoint, manifest.global_step, manifest.examples, None)


def _dataset_config(config: TrainConfig, workers: int) -> DatasetConfig:
    return DatasetConfig(paths=tuple(config.data.train), format=config.data.format, batch_size=config.data.batch_size * workers,
                         num_epochs=config.data.epochs, shuffle_buffer=config.data.shuffle_buffer, seed=config.data.seed,
                         **data_options(config))


def _train(config: TrainConfig, session: MonitoredTrainingSession, driver: InGraphDriver,
           data_config: DatasetConfig) -> tuple[int, str]:
    """Runs batches from the session's reader position to the end of the data or a stop; returns
    (the batches run, why it stopped)."""
    # Positions of another sharding (a between-graph run's, another --shuffle-buffer or --seed): the oldest epoch.
    resume = resume_from_positions(session.reader_position, session.reader_positions, data_config, CLIENT_NAME)
    batches, reason = 0, "end of data"
    with open_dataset(data_config, start=True, resume_from=resume) as data:
        for big in data:
            position = data.position()  # just after this batch
            ran = session.run(functools.partial(driver.run_batch, big, position.to_json()),
                              epochs_completed=epochs_completed(position), source=big.source)
            if ran is not None:
                batches += 1
            if session.should_stop():  # the hooks decide (max_steps: StopAtStepHook); the loop reads why
                reason = session.stop_reason or f"a hook stopped the session at global_step {session.global_step}"
                break
    return batches, reason


def _leave(client: ParameterClient) -> None:
    """The client's data ended (every push of it answered): it leaves, as a between-graph worker whose data
    ended does, before its session's end (the final checkpoint and evaluation): a replicated shard hears its
    final acknowledged counts, and the launcher counts training as ended at the step task's count of ``Leave``
    (:meth:`psflow.launch.resilience.Resilience._training_ended`: a ``--chaos`` fault left is then not fired
    during the final save or evaluation). The ps tasks forget it at a restore (a restarted client that trains
    again leaves again; it is one name, counted once). Never raises (a ps task that did not hear it is a WARNING)."""
    try:
        client.leave()
    except RpcError as e:
        log.warning("in-graph client: a ps task did not hear it leave (%s); its shard's pushes_acknowledged may "
                    "count the last push short", e)


def _report_run_over(config: TrainConfig, cluster: ClusterSpec, client: ParameterClient) -> None:
    """The session ended normally (its end wrote the final checkpoint): every ps task hears ``Done`` for each
    training worker of the cluster (:mod:`psflow.ps.run_end`), as each worker of a between-graph run sends its
    own, so that the ps tasks of ``psflow server`` exit. The in-graph workers run no session of their own: the
    client, which drives them all, speaks for them. Never raises: the run's work is done."""
    from psflow.ps.run_end import training_workers
    from psflow.train.final_duties import final_checkpoint

    final = final_checkpoint(config.checkpoint.dir)
    for worker in training_workers(cluster):
        client.report_done(checkpoint_dir=bool(config.checkpoint.dir), final_checkpoint=final, worker=worker)


def run_in_graph_client(config: TrainConfig, cluster: ClusterSpec, *, token: str | None = None,
                        tls: TlsConfig | None = None, faults: FaultInjection = NO_FAULTS) -> dict[str, Any]:
    """The in-graph client: reads all the data and drives every worker until it ends (module docstring).

    Blocks for the whole run. Returns ``{"steps", "examples", "wall_seconds", "restored", "restore",
    "eval_not_done"}`` of this process (``restored``: the checkpoint it restored at start, itself or by its session's
    join, or None; ``restore``: :meth:`RestoreAtStart.record` of that restore, or None; ``eval_not_done``: its
    evaluations not done, :mod:`psflow.train.worker_result`). A restore of its own, before its
    session, is reported to the session's hooks (``after_restore``) before the first step: the summaries'
    SessionLog START at the checkpoint's step, as a between-graph chief's restore within its session writes. Its
    channels (to every worker's StepService and every ps task) use ``tls`` (``None``: plain text).

    Raises:
        ConfigError: ``--mode ssp`` (between-graph only).
        NanLossError: a slice's loss is not finite.
        RecoveryError: a worker or ps task did not come back in time.
        StateLostError: a ps task lost its variables and there is no checkpoint to restore.
        CheckpointError, RpcError: a checkpoint could not be restored, or a task failed.
    """
    if config.sync.mode == "ssp":
        raise ConfigError("--mode ssp needs between-graph replication")
    started = time.monotonic()
    connect = ConnectConfig(connect_timeout=config.cluster.connect_timeout, rpc_timeout=config.cluster.rpc_timeout,
                            save_timeout=config.cluster.save_timeout, token=token, tls=tls, transport=config.cluster.transport)
    sessions = [Session(f"grpc://{cluster.task_address('worker', i)}", task=f"/job:worker/task:{i}", config=connect)
                for i in cluster.task_indices("worker")]
    model, variables = build_model(config, cluster)
    client = ParameterClient(cluster, variables.placements(), client_name=CLIENT_NAME, config=connect,
                             failover_timeout=config.cluster.ps_failover_timeout)
    try:
        client.connect()
        # Made before the restore: it takes the run's lock of the checkpoint directory and checks the newest
        # checkpoint against the run's model first.
        monitored = make_session(config, cluster, client, model, "client", 0, chief=True, faults=faults)
        restore = _restore_initialized_cluster(config, client)
        for s in sessions:
            s.connect()
        with monitored as session:
            restored = restore.checkpoint if restore is not None else None
            if restore is not None:  # before the session: its join found the tasks ready and restored nothing
                session.restored(restore.checkpoint, restore.restored_step)  # the summaries' START, as a chief's
            elif session.join_result is not None and session.join_result.restored is not None:
                restored = session.join_result.restored  # the join restored (a resume, or within the run)
                restore = _joined_restore(restored)
            steps_before = session.global_step
            driver = InGraphDriver(config, model, client, sessions, generation=client.ps_stats().generation)
            batches, reason = _train(config, session, driver, _dataset_config(config, len(sessions)))
            last_step = session.global_step
            _leave(client)  # before the session's end: its final save and evaluation are no training
        log.info("in-graph client: done after %d batches (%d examples), global_step %d -> %d: %s",
                 batches, driver.examples, steps_before, last_step, reason)
        _report_run_over(config, cluster, client)
    finally:
        for s in sessions:
            s.close()
        client.close()
    return {"steps": driver.steps, "examples": driver.examples, "wall_seconds": time.monotonic() - started,
            "restored": restored, "restore": restore.record() if restore is not None else None,
            "eval_not_done": evaluations_not_done(monitored)}
