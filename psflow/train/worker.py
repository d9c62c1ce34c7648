"""The between-graph training loop of one worker task.

Order of a worker's life (asynchronous mode):
    1. build the model (``--model``, through :mod:`psflow.models.registry`)
       and its variables' placement (:mod:`psflow.train.build`: the same pure
       computation on every worker);
    2. connect to every ps task (bounded wait) and enter its
       :class:`~psflow.train.session.MonitoredTrainingSession`: the chief
       initializes the variables or restores the newest checkpoint, the
       others wait for it (a differing layout fails here); see
       :mod:`psflow.train.chief` and :mod:`psflow.train.duties` for the hooks;
    3. open its own shard of the training data (see :mod:`psflow.data`),
       resuming at the reader position it last reported (or the restored
       checkpoint recorded); its reader starts at the shard's beginning
       before step 2 (:mod:`psflow.train.read_ahead`), so that the first
       batches are read while it joins, and is kept only where the data
       does start there;
    4. per batch: the model's step (:class:`~psflow.train.step.TrainStep`:
       pull, compute, push) run by the session between its hooks; the push
       returns the global_step that this worker's update produced; the
       session's :class:`~psflow.train.hooks.WorkerProgressHook` logs
       ``step=S`` with the loss and the batch's metrics when
       ``S % log_every == 0`` (so every multiple is logged exactly once
       across the cluster);
    5. stop at the end of its data or when a hook stops the session (once
       global_step reaches ``max_steps``: :class:`~psflow.train.hooks.StopAtStepHook`);
       the loop reads the session's decision and its reason, never decides itself;
    6. once its session has ended normally (the final checkpoint written, by
       whichever worker held the chief duties), tell every ps task it is done
       (``Done``, :mod:`psflow.ps.run_end`: ``psflow server``'s ps tasks exit once
       every worker did). Only with the worker's own gRPC client.

Stopping early (``run_worker(..., stop=...)``, a SIGTERM to the task, see
:mod:`psflow.launch.lifeline`): the request is checked before every step and
before waiting for the other workers; once it is seen, the worker raises
:class:`WorkerStopped` without another push, without ``Leave`` (a restarted
worker rejoins) and without its result file, its session ends without the
hooks' ``end()`` (no final checkpoint), and its channels are closed. A call
blocked at the request (a sync barrier) fails when the stop closes the
channels (``StopSource.on_interrupt``).

Only the chief initializes; no worker ever
waits a fixed time: all waits are bounded retries on the ps tasks.
"""

from __future__ import annotations

import collections
import functools
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from psflow import jsonio, storage
from psflow.cluster import ClusterSpec
from psflow.coord import CoordinationBackend, Lease, create_backend
from psflow.coord.embedded import EmbeddedBackend
from psflow.data import Batch, Dataset, ReaderPosition, read_all
from psflow.errors import TrainingError
from psflow.models.api import Model
from psflow.placement import VariableSet
from psflow.ps.client import ParameterClient
from psflow.ps.control_routes import ControlRouter
from psflow.ps.fencing import FencedWriter
from psflow.rpc.api import ConnectConfig, RpcError
from psflow.rpc.tls import TlsConfig
from psflow.train.build import build_model, data_options, dataset_config
from psflow.train.chief import is_chief
from psflow.train.config import ConfigError, TrainConfig
from psflow.train.duties import (
    coordination_config,
    elects_chief,
    epochs_completed,
    make_session,
    resume_from_positions,
    resume_position,
    run_id,
)
from psflow.train.faults import NO_FAULTS, FaultInjection
from psflow.train.final_duties import end_duties, final_checkpoint, resign
from psflow.train.pipeline import PipelinedStep
from psflow.train.read_ahead import ReadAhead
from psflow.train.recovery import ClusterRecovery, Leadership
from psflow.train.session import MonitoredTrainingSession
from psflow.train.step import StepResult, TrainStep
from psflow.train.take_over import TakeOver
from psflow.train.worker_result import WorkerResult, evaluations_not_done

__all__ = ["connect_client", "run_worker", "WorkerResult", "WorkerStopped", "StopSource", "load_eval"]

log = logging.getLogger("psflow.worker")


class WorkerStopped(TrainingError):
    """The worker was asked to stop (a signal to its task, its launcher's death) and left its loop."""


class StopSource(Protocol):
    """Where a worker learns that it is to stop (:class:`psflow.launch.lifeline.StopRequest` is one)."""

    def requested(self) -> str | None:
        """Why the worker is to stop, or None; never blocks (read before every step)."""

    def on_interrupt(self, callback: Callable[[], object]) -> None:
        """Runs ``callback`` (another thread) when a stop needs a blocked call failed."""


def _check_stop(stop: StopSource | None, task: str, where: str) -> None:
    why = stop.requested() if stop is not None else None
    if why is not None:
        raise WorkerStopped(f"{task}: stopped {where} ({why})")


def connect_client(config: TrainConfig, cluster: ClusterSpec, variables: VariableSet, client_name: str,
                   token: str | None = None, *, register: bool = True, tls: TlsConfig | None = None) -> ParameterClient:
    """A connected client; with ``register``, its layout is registered on every ps task as the chief.

    ``tls``: every channel to the ps tasks uses it (``None``: plain text).

    Workers pass ``register=False`` (their session joins the cluster, see
    :mod:`psflow.train.chief`); so does the launcher, which never initializes.
    """
    client = ParameterClient(
        cluster,
        variables.placements(),
        client_name=client_name,
        config=ConnectConfig(connect_timeout=config.cluster.connect_timeout, rpc_timeout=config.cluster.rpc_timeout,
                             save_timeout=config.cluster.save_timeout, token=token, tls=tls, transport=config.cluster.transport),
        sync=config.sync_config(),
        failover_timeout=config.cluster.ps_failover_timeout,
    )
    client.connect()
    if register:
        client.register(config.optimizer_spec(), chief=True)
    return client


def run_worker(
    config: TrainConfig,
    cluster: ClusterSpec,
    task_index: int,
    *,
    token: str | None = None,
    tls: TlsConfig | None = None,
    result_path: str | None = None,
    client: ParameterClient | None = None,
    stop: StopSource | None = None,
    faults: FaultInjection = NO_FAULTS,
    save_section: Callable[[], AbstractContextManager[object]] | None = None,
    take_over: bool = True,
) -> WorkerResult:
    """Trains worker ``task_index`` until its data ends or ``max_steps`` is reached.

    Blocks for the whole run. Writes ``result_path`` (JSON) at the end if given.
    ``client`` replaces the gRPC client (e.g. one on in-process channels).
    With a gRPC client and chief duties configured, the worker joins the
    chief election and survives ps task restarts (:mod:`psflow.train.recovery`).
    ``stop``: checked before every step; see the module docstring.
    ``faults``: tests' and drills' faults (:mod:`psflow.train.faults`): this worker's step delay and lag,
    the chief's checkpoint exit.
    ``save_section``: entered around each of its checkpoint saves (``--in-process``: no signal cuts one).
    ``take_over``: once its data ended, it takes the chief duties over when nobody pushed or held the lease for
    the lease's ttl (:mod:`psflow.train.take_over`); False where a supervisor restarts a dead worker (the local launcher,
    a cluster manager: ``psflow server --restarted-by-manager``).
    ``tls``: the gRPC client's channels (to the ps tasks, checkpoints included, and to the
    embedded coordination backend) use it; ``None``: plain text.

    Raises:
        WorkerStopped: ``stop`` was requested (no result file is written).
        DataError: malformed input (names file and record).
        RpcError: a ps task refused or could not be reached in time.
        RecoveryError: the cluster was not restored in time after a ps task died.
    """
    task = f"/job:worker/task:{task_index}"
    model, variables = build_model(config, cluster)
    log.info("worker %d: %s", task_index, model.describe())
    leadership, control = None, None
    own_client = client is None
    if client is None:
        if config.data.reader_process:
            # fork() with live gRPC channels is unsafe (the child crashed with SIGSEGV in a cluster worker).
            raise ConfigError("reader_process is for the in-process fast path only: a worker with gRPC "
                              "channels cannot fork its reader")
        client = connect_client(config, cluster, variables, task, token, register=False, tls=tls)
        if elects_chief(config):
            leadership, control = _leadership(config, cluster, task, token, client, tls)
    if stop is not None:
        stop.on_interrupt(client.close)  # fails a call blocked when a stop comes (a sync barrier)
    data_config = dataset_config(config, task_index, cluster.num_tasks("worker"))
    steps_in_flight = _steps_in_flight(config, client)
    progress = _Progress(time.monotonic())
    data: ReadAhead | None = None
    try:
        # Its first batches are read while it joins (the chief initializes, the others wait): psflow.train.read_ahead.
        # The model's prepare step (e.g. each batch's unique ids) runs where the batch is made: the reader
        # process (the in-process fast path) or the prefetch thread, so it overlaps the step's PyTorch work and
        # its wait for the ps tasks (a W&D worker: ~25% more examples/s than preparing on the step's thread).
        data = ReadAhead(data_config, model.prepare, start=not config.data.reader_process)
        if leadership is not None and is_chief(cluster, "worker", task_index) and _never_ready(client):
            # The configured chief leads first until the cluster was first made ready (its session saves the
            # initial checkpoint before that): at a run's start, or restarted after its predecessor died before
            # (that one's lease lapses within lease_ttl; nobody else campaigns before training). A chief
            # restarted later campaigns once it trains or waits for a restore, like any worker (CampaignWhileTrainingHook).
            ttl = config.chief.lease_ttl
            leadership.campaign(timeout=ttl + max(2.0, ttl / 2))
        with make_session(config, cluster, client, model, "worker", task_index, leadership=leadership,
                          faults=faults, save_section=save_section, take_over=take_over) as session:
            recovery = ClusterRecovery(client, config.optimizer_spec(), checkpoint_dir=config.checkpoint.dir,
                                       generation=session.join_result.generation if session.join_result else 0,
                                       leader=leadership.confirmed_lease if leadership is not None else lambda: None,
                                       timeout=config.cluster.connect_timeout, run=run_id(config, cluster), on_restored=session.restored)
            resume = resume_position(session, data_config)
            if recovery.generation is None:  # its join left the restore within the run to the lease holder: it waits
                resume = resume_from_positions(recovery.await_restore(leadership), client.reader_positions(), data_config, task)
            # Runs that can be restored keep a finished worker until every worker finished, so a restore after a
            # later ps death rewinds its records too (ClusterRecovery.linger).
            linger = leadership is not None and cluster.num_tasks("worker") > 1
            duties = TakeOver(leadership, client, task_index, lease_ttl=config.chief.lease_ttl,
                              checkpoint_dir=config.checkpoint.dir) if take_over and leadership is not None else None
            while True:
                left: float | None = None  # when its Leave began: a failure there may be an idle task's restart
                try:
                    reason = _train(session, model, data, resume, task_index, progress, stop,
                                    generation=recovery.generation, faults=faults, steps_in_flight=steps_in_flight)
                    if leadership is not None:  # its data ended: it takes no new lease (a holder must run steps)
                        leadership.stop_campaigning()
                    left = time.monotonic()
                    client.leave()  # sync/ssp: the others stop waiting for this worker
                    left = None  # (left: a later error is not the Leave's)
                    if not linger or leadership is None:
                        break
                    _check_stop(stop, task, f"after its data ended ({reason})")
                    # The chief duties go to a worker that still trains, if any; back to this one if none is left
                    # (take_over: where no supervisor restarts a dead chief).
                    restored, text = recovery.linger(cluster.num_tasks("worker"), before_waiting=functools.partial(
                        resign, leadership, task_index, reason), take_over=duties)
                except RpcError as e:
                    if stop is not None and stop.requested() is not None:  # the stop closed the channels
                        raise WorkerStopped(f"{task}: stopped ({stop.requested()}): {e}") from e
                    if leadership is None or not recovery.needed(since=left):
                        raise
                    log.warning("worker %d: a ps task failed (%s); waiting for the chief to restore the cluster",
                                task_index, e)
                    if not leadership.campaigning():  # no step yet (a chief restarted beside an empty ps task 1:
                        leadership.start()  # its join restored nothing); else nobody may take the lease to restore
                    restored, text = recovery.wait(since=left)  # an idle task restarted since: readmitted
                    if not restored:
                        raise
                if not restored:
                    break
                if leadership is not None:  # its handover, if it had finished, is void: it finishes again
                    leadership.rewound()
                # Rewound (it campaigns again from its next step); the checkpoint may hold another sharding's positions.
                resume = resume_from_positions(text, client.reader_positions(), data_config, task)
            if leadership is not None:  # the last to finish writes the final checkpoint
                if duties is not None and leadership.resigned:  # handed on: the holder's end, or its duties taken
                    duties.await_holder(cluster.num_tasks("worker"))
                end_duties(leadership, config.chief.lease_ttl, config.cluster.connect_timeout, config.checkpoint.dir)
        if own_client:  # the session ended normally: its final checkpoint is written
            if leadership is not None:  # resign first: the lease lives on ps task 0, which may now exit
                leadership.close()
            client.report_done(checkpoint_dir=bool(config.checkpoint.dir),
                               final_checkpoint=final_checkpoint(config.checkpoint.dir))
    finally:
        if data is not None:
            data.close()
        if leadership is not None:
            leadership.close()
        if control is not None:
            control.close()
        client.close()
    out = WorkerResult(task, progress.local_steps, progress.examples, progress.first_step, progress.step,
                       time.monotonic() - progress.started, reason, progress.stale, progress.bad_records,
                       time.process_time(), time.process_time() - progress.cpu_started, evaluations_not_done(session))
    log.info("worker %d: done after %d local steps (%d examples), %s: %s", task_index, progress.local_steps,
             progress.examples, "no global step read" if progress.step is None else f"last global step {progress.step}", reason)
    if result_path:
        _write_json(result_path, asdict(out))
    return out


@dataclass
class _Progress:
    """A worker's counters over its whole life (across data re-opens after restores)."""

    started: float
    cpu_started: float = field(default_factory=time.process_time)
    local_steps: int = 0
    examples: int = 0
    stale: int = 0
    bad_records: int = 0
    first_step: int | None = None
    step: int | None = None

    def count(self, result: StepResult, examples: int) -> None:
        """Counts a step whose push produced ``result``, of a batch of ``examples``."""
        self.step = result.step
        self.first_step = result.step if self.first_step is None else self.first_step
        self.local_steps += 1
        self.examples += examples
        self.stale += int(not result.accepted)


def _steps_in_flight(config: TrainConfig, client: ParameterClient) -> int:
    """Steps this worker keeps in flight (``--steps-in-flight``); replicated ps shards (``--ps-replicas``) take 1
    or 2: with 2 (:mod:`psflow.train.step`) there is still one call per shard in flight, collected before the
    next is sent, so a call that fails over is resent alone, with its ``push_id``, and applied once; 3 or more
    (:mod:`psflow.train.pipeline`) would keep several in flight, which a failover's resend does not order.

    Raises:
        ConfigError: ``--steps-in-flight`` above 2 with replicated ps shards.
    """
    k = config.sync.steps_in_flight
    if client.router is not None and k > 2:
        raise ConfigError(f"{client.client_name}: --steps-in-flight {k} is not supported with replicated ps shards "
                          "(--ps-replicas): use 1 or 2")
    return k


def _never_ready(client: ParameterClient) -> bool:
    """Whether ps task 0 was never made ready (generation 0, not ready: the cluster not initialized yet, or a chief
    died before making it ready; not a restore within the run, whose generation is above 0), or it cannot tell."""
    try:
        return not (stats := client.ps_stats()).ready and stats.generation == 0
    except RpcError:
        return True


def _leadership(config: TrainConfig, cluster: ClusterSpec, task: str, token: str | None,
                client: ParameterClient, tls: TlsConfig | None = None) -> tuple[Leadership, ControlRouter | None]:
    """The worker's part in the chief election, and (replicated ps shards) the router its calls off the training
    thread use: the election's client gets shard 0's backup promoted over a dead primary through it, and the
    new chief's fence follows each shard's primary (a deposed member refuses it) within the fence's timeout."""
    coord = coordination_config(config, cluster, token=token, tls=tls)
    timeout = min(5.0, config.cluster.rpc_timeout)
    control = ControlRouter(client.router.twin(f"{task} (chief election)")) if client.router is not None else None
    channels = control.channels(wait=timeout) if control is not None else client.channels

    def fence(lease: Lease) -> None:  # a new chief fences every ps task at once: no write of its predecessor after
        FencedWriter(channels, lease, timeout=timeout).check()

    if control is not None and coord.members:  # embedded, served by shard 0's members
        shard = min(cluster.task_indices("ps"))
        backend: CoordinationBackend = EmbeddedBackend(
            coord, promote=lambda reached: control.primary(shard, reached))
    else:
        backend = create_backend(coord)
    return Leadership(backend, task, on_elected=fence), control


def _train(session: MonitoredTrainingSession, model: Model,
           data: ReadAhead, resume: ReaderPosition | None, task_index: int, progress: _Progress,
           stop: StopSource | None = None, *, generation: int | None = None,
           faults: FaultInjection = NO_FAULTS, steps_in_flight: int = 1) -> str:
    """Trains on this worker's data (opened by ``data``) from ``resume`` to its end (or a stop); returns why
    it stopped.
    Its pushes carry ``generation`` (the cluster's restore generation) and each batch's reader position.
    ``steps_in_flight`` (1 or 2): see :mod:`psflow.train.step`; with 2, a batch computed when the loop
    stops is not pushed (the reader position recorded is the last pushed batch's).

    Raises:
        WorkerStopped: ``stop`` was requested (checked before every step).
    """
    client = session.client
    # Fault injection for tests and drills: a slow worker (seconds between its pull and push), and a
    # straggler: before each push, wait until global_step moved "lag" steps past its read.
    delay, lag = faults.delay(task_index), faults.lag(task_index)
    reason = "end of data"
    if steps_in_flight > 2:
        return _train_pipelined(session, model, data, resume, task_index, progress, stop,
                                generation=generation, faults=faults, steps_in_flight=steps_in_flight)
    train_step = TrainStep(model, client, prepared=True, steps_in_flight=steps_in_flight)
    with data.open(resume) as dataset:
        # One batch of lookahead: the push of a step and the pull of the next share one RPC per ps task.
        # Two steps in flight: two, as the push of a step carries the pull of the one after the next.
        for (batch, position), following in _windows(dataset, steps_in_flight):
            _check_stop(stop, session.client.client_name, f"at global_step {session.global_step}")
            step_fn = functools.partial(train_step, batch, clock=progress.local_steps + 1, pause=delay, lag=lag,
                                        next_batch=following[0] if following else None, position=position.to_json(),
                                        generation=generation,
                                        after_next=following[1] if len(following) > 1 else None)
            # The hooks log the progress (WorkerProgressHook) and decide when to stop (StopAtStepHook: max_steps).
            result = session.run(step_fn, epochs_completed=epochs_completed(position), source=batch.source)
            if result is not None:
                progress.count(result, batch.num_examples)
                if not result.accepted:
                    log.info("worker %d: gradient computed at step %s was stale and dropped", task_index,
                             client.last_pull_step)
            if session.should_stop():
                reason = session.stop_reason or f"a hook stopped the session at global_step {session.global_step}"
                break
    _count_bad_records(dataset, progress, task_index)
    return reason


def _train_pipelined(session: MonitoredTrainingSession, model: Model, data: ReadAhead,
                     resume: ReaderPosition | None, task_index: int, progress: _Progress, stop: StopSource | None,
                     *, generation: int | None, faults: FaultInjection, steps_in_flight: int) -> str:
    """:func:`_train` with ``steps_in_flight`` >= 3 (:mod:`psflow.train.pipeline`): each step's result comes
    K-1 steps later, so the hooks see each push's result (its batch's epochs and source with it) when it
    arrives; at the end of the data, a stop by a hook or a stop request, the pushes in flight are collected
    (applied: counted, and shown to the hooks; a stop request raises after that); a batch computed and not
    sent is not counted."""
    client = session.client
    delay, lag = faults.delay(task_index), faults.lag(task_index)
    reason = "end of data"
    pipe = PipelinedStep(model, client, prepared=True, steps_in_flight=steps_in_flight)
    sent: collections.deque[tuple[Batch, ReaderPosition]] = collections.deque()  # batches whose push is in flight

    def count(result: StepResult) -> tuple[Batch, ReaderPosition]:
        batch, position = sent.popleft()
        progress.count(result, batch.num_examples)
        return batch, position

    with data.open(resume) as dataset:
        def finish() -> None:  # the pushes in flight: collected, counted, shown to the hooks
            for result in pipe.drain():
                batch, position = count(result)
                session.report(result, epochs_completed=epochs_completed(position), source=batch.source)

        try:
            for (batch, position), ahead in _windows(dataset, steps_in_flight):
                _check_stop(stop, client.client_name, f"at global_step {session.global_step}")
                owner = sent[0] if pipe.full else None  # the batch whose result this call returns
                step_fn = functools.partial(pipe.step, batch, ahead=ahead, clock=progress.local_steps + len(sent) + 1,
                                            position=position.to_json(), generation=generation, pause=delay, lag=lag)
                before = pipe.sent
                result = session.run(step_fn, epochs_completed=epochs_completed(owner[1]) if owner else None,
                                     source=owner[0].source if owner else None)
                if pipe.sent != before:  # it ran (no before_run hook stopped it): this batch's push is out
                    sent.append((batch, position))
                if result is not None:
                    count(result)
                if session.should_stop():
                    reason = session.stop_reason or f"a hook stopped the session at global_step {session.global_step}"
                    break
        except WorkerStopped:
            finish()
            raise
        except BaseException as e:
            pipe.discard(e)
            raise
        finish()
    _count_bad_records(dataset, progress, task_index)
    return reason


def _windows(dataset: Dataset, ahead: int) -> Iterator[tuple[tuple[Batch, ReaderPosition], list[Batch]]]:
    """Each batch of ``dataset`` with the reader position just after it, and up to ``ahead`` batches that
    follow it (fewer at the end of the data). The next batches are read only when the caller asks for the
    next window: a loop that breaks reads nothing more."""
    batches = iter(dataset)
    window: list[tuple[Batch, ReaderPosition]] = []

    def fill() -> None:
        while len(window) < 1 + ahead:
            got = next(batches, None)
            if got is None:
                return
            window.append((got, dataset.position()))

    fill()
    while window:
        yield window[0], [b for b, _ in window[1:]]
        window.pop(0)
        fill()


def _count_bad_records(dataset: Dataset, progress: _Progress, task_index: int) -> None:
    """Adds the bad records ``dataset`` skipped to ``progress``, and logs the last one."""
    progress.bad_records += dataset.stats.bad_records
    if dataset.stats.bad_records:
        log.warning("worker %d: skipped %d bad records (last: %s)", task_index, dataset.stats.bad_records,
                    dataset.stats.last_bad)


def _write_json(path: str, data: Any) -> None:
    storage.write_atomically(path, jsonio.dumps(data, indent=1).encode(), durable=False)


def load_eval(config: TrainConfig) -> Batch | None:
    """The whole eval set as one batch, or None without ``--eval``."""
    if not config.data.eval:
        return None
    return read_all(list(config.data.eval), config.data.format, **data_options(config))
