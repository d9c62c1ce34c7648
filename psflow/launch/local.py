"""Local launcher: a whole cluster of real processes on 127.0.0.1.

``run_local(config, output_dir)``:
    0. takes ``output_dir`` for the run (``run.lock``; another live run in it
       is refused, naming it, before anything is written there:
       :class:`~psflow.checkpoint.lock.RunDirLock`), then the
       checkpoint directory; both are released when the run ends;
    1. picks free ports on 127.0.0.1 for ``num_ps`` ps tasks,
       ``num_workers`` worker tasks and, with ``--ps-replicas N``, the
       ``num_ps * N`` tasks of job ``ps_backup`` (each shard's backups,
       :mod:`psflow.cluster.replicas`), and writes ``cluster.json``; if
       another process takes one of these ports before its task binds it,
       and training has not started, every task is stopped and steps 1
       to 3 are done again on new ports, at most 3 starts in all
       (:mod:`psflow.launch.port_retry`);
    2. starts one process per task (``python -m psflow.launch.task``), each
       logging to ``logs/<job>-<index>.log``; all share a fresh cluster token;
    3. watches them from the start (exits, restart policy, hang detection,
       chaos), printing a progress line (global step, examples/s, loss); its
       own client connects only after training, for evaluation;
    4. when every worker has exited 0: pulls the model (from the final
       checkpoint where a ps task lost its state after training, or exited:
       not waited for, :mod:`psflow.launch.final_model`), evaluates it on the
       eval set (read meanwhile, from step 2 on, by a thread of low CPU
       priority: :mod:`psflow.launch.eval_set`), checks that the newest
       checkpoint (with a checkpoint directory) is the run's final one at its
       last global_step (:func:`check_final_checkpoint`; if not, the run
       fails as in 5; with ``--max-failed-saves 0`` a warning line), writes the run's final
       snapshot (``metrics.json``, ``status.json``, ``metrics.prom``:
       :mod:`psflow.launch.run_end`), asks the ps tasks to shut down;
    5. if any task exits non-zero, reads the run's numbers while the ps tasks
       still answer, stops every other task, writes the final snapshot
       (``phase`` failed, ``error``) and raises :class:`LaunchError` naming
       each failed task (pid, exit code or signal), the first one as the root
       cause.

Every process started here is ended here, by pid (SIGTERM, then SIGKILL, to
the task's own process group), whatever happens (including KeyboardInterrupt):
the processes are a :class:`~psflow.launch.processes.LocalCluster`.

Tasks never outlive the launcher (:mod:`psflow.launch.lifeline`): each gets
the read end of a pipe whose write end only the launcher holds, and, on
Linux, a parent-death signal; when the launcher dies, SIGKILL included, every
task stops itself within a few seconds. SIGTERM, SIGHUP and SIGINT to the
launcher (``LocalCluster`` used as a context manager on the main thread)
raise :class:`~psflow.launch.lifeline.LaunchInterrupted`: every task is
stopped, the final snapshot records the interruption (``interrupted``: the
signal, ``global_step``, ``tasks``: how each one ended, plus ``faults``,
``restarts``, ``hangs``, the checkpoint ledger), and ``psflow train`` exits
with ``128 + n``. One the launcher inherited ignored (``nohup``'s SIGHUP)
stays ignored, by it and by its tasks (:mod:`psflow.launch.stop_signals`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import subprocess
import sys
import time
from typing import Any, TextIO

from psflow.checkpoint.ledger import SaveStatusWatcher, checkpoint_status
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.cluster.replicas import BACKUP_JOB
from psflow.errors import CheckpointError
from psflow.launch.chaos_plan import stop_without_liveness
from psflow.launch.eval_set import EvalSet, after_training
from psflow.launch.exits import wait_for_exit
from psflow.launch.final_model import STEP_TASK, connect_live, evaluate_final, gone_after_training, stats_or_silent, with_step_of
from psflow.launch.idle_ps import announce_idle, readmitted_lines
from psflow.launch.launcher_signals import LauncherSignals
from psflow.launch.lifeline import LaunchInterrupted
from psflow.launch.port_retry import PortTaken, StartupWatch, start_until_bound, taken_port
from psflow.launch.processes import LaunchError, LocalCluster, TaskHosts, TaskProcess, failure_report
from psflow.launch.resilience import Resilience, ResilienceConfig, with_recovery_checkpoints
from psflow.launch.restore_loss import restore_loss, restore_loss_line
from psflow.launch.run_end import RunEnd
from psflow.launch.run_status import LauncherStatus
from psflow.ps.client import ParameterClient
from psflow.ps.dynamic import table_totals
from psflow.rpc.api import PARAMETER_SERVICE, WORKER_SERVICE, ConnectConfig, RpcError
from psflow.rpc.grpc_client import TaskChannel
from psflow.status.final_snapshot import resumed_from
from psflow.status.progress import Progress, progress_total
from psflow.status.replication import ps_members
from psflow.status.server import StatusConfig
from psflow.train.build import build_model
from psflow.train.config import TrainConfig
from psflow.train.duties import claim_run
from psflow.train.faults import FaultInjection, task_config_json
from psflow.train.inputs import check_inputs
from psflow.train.preflight import check_settings
from psflow.train.worker_result import eval_not_done

__all__ = ["run_local", "exactly_once_examples", "check_final_checkpoint"]

log = logging.getLogger("psflow.launch")


def run_local(config: TrainConfig, output_dir: str, *, progress: TextIO | None = sys.stderr,
              progress_every: float = 2.0, resilience: ResilienceConfig | None = None,
              status: StatusConfig | None = None, verbose: bool = False,
              placement: TaskHosts | None = None, faults: FaultInjection | None = None) -> dict[str, Any]:
    """Trains on a local cluster of real processes; returns the metrics.

    Blocks until training and evaluation are done. Writes
    ``output_dir/{cluster.json,config.json,metrics.json,status.json,metrics.prom,logs/}``.

    ``status`` (default: on, 127.0.0.1, a free port) says where the live status
    page and ``/metrics`` are served while the run lasts; its address is printed
    first (:mod:`psflow.launch.run_status`).

    ``resilience`` (default: fail fast, hang detection after 30 s, no chaos)
    says what happens when a task dies or hangs; see :mod:`psflow.launch.resilience`. With a
    restart policy and no ``checkpoint_dir``, checkpoints go to ``output_dir/checkpoints``
    (one console line says so), so a ps task that dies is restored rather than lost.

    ``progress``: a bar or lines, then a last line with the run's examples/s
    (:mod:`psflow.status.progress`). ``verbose``: the tasks log gRPC's C-core
    lines and the tracebacks of expected errors (:mod:`psflow.launch.console`).
    ``placement``: where each task runs (:class:`TaskHosts`; default: every task on 127.0.0.1).
    ``faults``: tests' and drills' faults, written beside the config in config.json (:mod:`psflow.train.faults`).

    Raises:
        LaunchError: a task failed (every other task has been stopped); an expected error of the
            task is its one line (a bad record: the file and line), anything else its log's tail.
        DataError: ``--train`` or ``--eval`` holds no record, cannot be read, or has a malformed
            record among the first of a file (checked before anything starts).
        RunDirLockedError: another live run holds ``output_dir`` (names it; nothing written, nothing started).
        CheckpointLockedError: another live run holds the checkpoint directory (likewise).
        ConfigError: the ps tasks' variables do not fit this machine's memory, or a dynamic table's
            capacity cannot hold one row (:func:`psflow.train.preflight.check_settings`; before anything starts).
    """
    train_records = check_inputs(config)
    check_settings(config)  # memory, dynamic tables: refused in one line before any task starts
    config = with_recovery_checkpoints(config, resilience or ResilienceConfig(), output_dir, out=progress or sys.stderr)
    if resilience is not None and (line := stop_without_liveness(resilience.chaos,
                                                                 hang_detection=resilience.health is not None)):
        print(line, file=progress or sys.stderr, flush=True)
    # The run's id; its run directory, then its checkpoint directory, taken before anything is written there or
    # started (another live run's is refused, naming it); released when the run ends, however it ends.
    config, claimed = claim_run(config, output_dir, out=progress or sys.stderr)
    checkpoints = SaveStatusWatcher(max_failed_saves=config.checkpoint.max_failed_saves, every=progress_every) \
        if config.checkpoint.dir else None
    resumed = resumed_from(config.checkpoint.dir)  # what the chief restores: the examples before this run
    config_path = os.path.join(output_dir, "config.json")
    started = time.monotonic()
    eval_sets: list[EvalSet] = []  # read once, from the first start on
    signals = LauncherSignals()  # every start's: between two, its handlers stay (port_retry.start_until_bound)
    start_cluster = functools.partial(
        _run_cluster, config, output_dir, config_path, train_records=train_records, started=started, progress=progress,
        progress_every=progress_every, resilience=resilience, status=status, verbose=verbose, placement=placement,
        faults=faults, checkpoints=checkpoints, resumed=resumed, eval_sets=eval_sets, signals=signals)
    with claimed:  # again on new ports where one was taken: a signal between two starts is the run's (port_retry)
        return start_until_bound(lambda retry: start_cluster(retry_ports=retry), signals, progress or sys.stderr)


def _run_cluster(config: TrainConfig, output_dir: str, config_path: str, *, train_records: int | None,
                 started: float, progress: TextIO | None, progress_every: float,
                 resilience: ResilienceConfig | None, status: StatusConfig | None, verbose: bool,
                 placement: TaskHosts | None, faults: FaultInjection | None, checkpoints: SaveStatusWatcher | None,
                 resumed: Any, eval_sets: list[EvalSet], signals: LauncherSignals, retry_ports: bool) -> dict[str, Any]:
    """One start of the run's cluster (new ports, every task), to its end; see :func:`run_local`.

    Raises:
        PortTaken: ``retry_ports`` and a task's port was taken by another process before training
            started (every task stopped, no final snapshot written): the caller starts again.
    """
    replicas = (resilience or ResilienceConfig()).ps_replicas
    with LocalCluster.create(config.cluster.num_ps, config.cluster.num_workers, output_dir, placement=placement,
                             ps_replicas=replicas, signals=signals) as lc:
        with open(config_path, "w") as f:
            f.write(task_config_json(config, faults))
        # From here on, however the run ends, its end is one final snapshot (psflow.launch.run_end).
        end = RunEnd(lc, output_dir, started=started, checkpoints=checkpoints, resumed=resumed,
                     checkpoint_dir=config.checkpoint.dir, says_kept=True,
                     run={**config.sync.reported(), "replication": config.sync.replication}, out=progress or sys.stderr)
        lc.on_interrupt = end.interrupted
        lc.verbose = verbose
        lc.resilience = Resilience(lc, resilience or ResilienceConfig(), in_graph=config.sync.replication == "in-graph")
        lc.resilience.start()
        # Serves the page unless --no-status; writes status.json and metrics.prom at the end either way.
        page = end.page = LauncherStatus(config, lc, output_dir, status or StatusConfig(), progress or sys.stderr)
        startup = StartupWatch(output_dir) if retry_ports else None  # before any task starts
        lc.signals.check()  # one that came between this start and the one before (port_retry): reported as any
        for i in range(config.cluster.num_ps):
            lc.start_task("ps", i, config_path)
        for j in range(config.cluster.num_ps * replicas):  # the shards' backups (--ps-replicas; none by default)
            lc.start_task(BACKUP_JOB, j, config_path)
        for i in range(config.cluster.num_workers):
            lc.start_task("worker", i, config_path)
        driver = "client" if config.sync.replication == "in-graph" else "worker"
        if driver == "client":  # the in-graph client: reads the data, drives every worker
            lc.start_task("client", 0, config_path)
        model, variables = build_model(config, lc.cluster)
        if not eval_sets:
            eval_sets.append(EvalSet(config))
        eval_set = eval_sets[0]  # read while the tasks start and train: evaluated once they are done
        # Not connected yet: watching (exits, restarts, chaos, progress) starts at once, so a task
        # that dies early is reported at once rather than after the connect timeout.
        client = ParameterClient(lc.cluster, variables.placements(), client_name="launcher", config=ConnectConfig(
            connect_timeout=config.cluster.connect_timeout, rpc_timeout=config.cluster.rpc_timeout,
            save_timeout=config.cluster.save_timeout, token=lc.token),
            failover_timeout=config.cluster.ps_failover_timeout)
        announce_idle(client, sync=config.sync.mode == "sync", out=end.out, resilience=lc.resilience)
        ended = "failed"
        bar = None if progress is None else Progress(progress, progress_total(
            max_steps=config.data.max_steps, epochs=config.data.epochs, records=train_records), started=started)
        try:
            page.set_phase("training")
            _watch(lc, client, progress, progress_every, started, driver, checkpoints=checkpoints, bar=bar, end=end,
                   startup=startup)
            train_seconds = time.monotonic() - started
            gone = gone_after_training(lc)  # ps tasks that exited, not restarted: not waited for (final_model)
            connect_live(client, gone)
            page.set_phase("evaluating")
            metrics = _finish(config, client, model, train_seconds, output_dir, driver, end=end, eval_set=eval_set,
                              gone=gone)
            ended = "finished"
            # The end is written. A signal from here on (or during its writing: RunEnd._write) is a LaunchInterrupted
            # carrying that end, raised here once the tasks were asked to end (the last line whole): it stops those
            # still running, is said to have come after the end, and leaves the exit status 0 (launcher_signals).
            # One that came here used to be swallowed without a word; one a line earlier made the launcher exit 143.
            with lc.signals.deferring():
                if bar is not None:
                    bar.close(metrics)  # the last line, from the final snapshot: this run's examples/s, the last loss
                if not gone:  # else the client's would call each task gone; the others are asked below
                    client.shutdown_servers()
                if replicas or gone:
                    _shut_down_members(lc)
                if driver == "client":
                    _shut_down_step_servers(lc)
                deadline = time.monotonic() + 5.0
                for t in lc.tasks:
                    try:
                        t.popen.wait(timeout=max(0.0, deadline - time.monotonic()))
                    except subprocess.TimeoutExpired:
                        pass
        except PortTaken:
            raise  # no snapshot: the run starts again (LocalCluster.__exit__ stops every task)
        except LaunchInterrupted:
            ended = "interrupted"  # LocalCluster.__exit__ ends it: RunEnd.interrupted
            raise
        except Exception as e:
            if end.snapshot is None:  # a task failed (captured before its tasks stopped), or the evaluation did
                end.failed(str(e))
            raise
        finally:
            if bar is not None:  # ends the bar (no-op after the line above): a failed run's, or a finished run's whose
                # end a signal followed before that line, or whose metrics.json could not be written (EndNotWritten:
                # the run trained): its last line all the same, from its end (taken once: RunEnd.snapshot)
                bar.close(end.snapshot if (end.snapshot or {}).get("phase") == "finished" else None)
            client.close()
            page.close()
    log.debug("run ended: %s", ended)
    return metrics


def _watch(lc: LocalCluster, client: Any, progress: TextIO | None, every: float, started: float,
           driver: str = "worker", *, checkpoints: SaveStatusWatcher | None = None, bar: Progress | None = None,
           end: RunEnd | None = None, startup: StartupWatch | None = None) -> None:
    """Waits until every ``driver`` task (workers, or the in-graph client) exited 0.

    Feeds ``bar`` the cluster's counters every ``every`` s (the caller closes it, with the run's metrics).
    With ``checkpoints``, prints a line for every failed checkpoint save (even without ``progress``).
    When a task fails, ``end`` captures the run's numbers before the other tasks are stopped.
    With ``startup``: a task that exits because another process took its port, before training started,
    stops every task and raises :class:`~psflow.launch.port_retry.PortTaken` (before any restart policy sees it).
    """
    with lc.signals.deferring():  # a signal is raised at the next check below, never inside a step of the loop
        _watch_loop(lc, client, progress, every, started, driver, checkpoints, bar, end, startup)


def _watch_loop(lc: LocalCluster, client: Any, progress: TextIO | None, every: float, started: float,
                driver: str, checkpoints: SaveStatusWatcher | None = None, bar: Progress | None = None,
                end: RunEnd | None = None, startup: StartupWatch | None = None) -> None:
    last_print = time.monotonic()
    failed: list[TaskProcess] = []
    while True:
        lc.signals.check()
        for t in lc.poll():
            if startup is not None and (port := taken_port(t)) is not None and not startup.training_started():
                lc.stop_all()
                raise PortTaken(t.error_line() or f"{t.name}: port {port} is taken", task=t.name, port=port)
            if t.exit_code != 0 and not (lc.resilience is not None and lc.resilience.on_exit(
                    t, refuse=_saves_failed(lc, t, checkpoints, client, progress))):
                failed.append(t)
        if lc.resilience is not None and not failed:
            lc.resilience.tick(client)
        if failed:
            time.sleep(0.2)  # let simultaneous failures land so the report lists them in order
            failed += [t for t in lc.poll() if t.exit_code != 0]
            _report_checkpoints(checkpoints, client, progress, force=True)  # before the ps tasks stop
            if end is not None:
                end.capture()  # the final snapshot's numbers, read while the ps tasks still answer
            stopped = [t for t in lc.tasks if t.exit_code is None]
            lc.stop_all()
            raise LaunchError(failure_report(failed, stopped) + (lc.resilience.on_failure() if lc.resilience else ""))
        done = all(t.exit_code == 0 for t in lc.tasks if t.job == driver)
        _report_checkpoints(checkpoints, client, progress, force=done)
        if bar is not None and not done and time.monotonic() - last_print >= every:  # done: the caller's last line
            try:
                bar.update(client.stats(timeout=2.0))  # bounded: this loop also restarts dead tasks
            except RpcError as e:
                bar.unavailable(e)
            last_print = time.monotonic()
        if done:
            return
        # Woken at once when a task exits (the last worker's exit ends the training phase), else after 0.05 s.
        wait_for_exit([t.popen for t in lc.tasks if t.exit_code is None], 0.05)


def _shut_down_members(lc: LocalCluster) -> None:
    """(Replicated shards, the run finished) asks every shard member still running to stop serving: the client
    stopped each shard's primary; its backups (``ps_backup`` tasks, or ps tasks a failover made backups) end
    here too, so each exits 0 rather than being stopped at the run's end. A member that does not answer is
    stopped with the others (``LocalCluster.stop_all``)."""
    _send_shutdown(lc, list(ps_members(lc.cluster)), PARAMETER_SERVICE)


def _shut_down_step_servers(lc: LocalCluster) -> None:
    """(In-graph runs, the client finished) asks every worker task still running to stop serving ``RunStep``:
    nothing else ends them (the client stopped only the ps tasks), and the caller waits up to 5 s for every
    task to exit before the rest are stopped by SIGTERM. A worker that does not answer is stopped with the
    others (``LocalCluster.stop_all``). Never raises."""
    workers = [(f"/job:worker/task:{i}", lc.cluster.task_address("worker", i))
               for i in lc.cluster.task_indices("worker")]
    _send_shutdown(lc, workers, WORKER_SERVICE)


def _send_shutdown(lc: LocalCluster, tasks: list[tuple[str, str]], service: str) -> None:
    """One ``Shutdown`` call (1 s) to each of ``tasks`` (name, address) still running, on ``service``; a task that
    does not answer is logged at debug level and left to ``LocalCluster.stop_all``. Never raises an RpcError."""
    connect = ConnectConfig(connect_timeout=1.0, rpc_timeout=1.0, token=lc.token)
    running = {t.name for t in lc.tasks if t.exit_code is None and t.popen.poll() is None}
    for name, address in tasks:
        if name not in running:
            continue
        channel = TaskChannel(name, address, service, connect)
        try:
            channel.call("Shutdown", timeout=1.0)
        except RpcError as e:
            log.debug("%s: shutdown: %s", name, e)
        finally:
            channel.close()


def _saves_failed(lc: LocalCluster, task: TaskProcess, checkpoints: SaveStatusWatcher | None, client: Any,
                  progress: TextIO | None) -> str | None:
    """(``task`` exited non-zero) Why it is not restarted, whatever the policy: the cluster's ledger shows
    ``--max-failed-saves`` checkpoint saves failed in a row, so the run stops as the launcher's line said. The
    limit counts the cluster's saves, not one process's: a chief restarted after its limit, or after a failed final
    save, would save again from a count of zero, up to ``--max-restarts`` times. Reads the ledger now (one call,
    2 s at most; the last reading if it fails) and prints its new failures. None for a ps task, a run without
    checkpoints or without the limit, or a policy that restarts nothing (no call then)."""
    if (checkpoints is None or checkpoints.max_failed_saves <= 0 or lc.resilience is None
            or not lc.resilience.restarts or task.job in ("ps", BACKUP_JOB)):
        return None
    try:
        for line in checkpoints.update(checkpoint_status(client, timeout=2.0)):
            print(line, file=progress or sys.stderr, flush=True)
    except RpcError as e:
        log.debug("checkpoint ledger not read after %s exited: %s", task.name, e)
    in_a_row, limit = int(checkpoints.ledger()["failed_in_a_row"] or 0), checkpoints.max_failed_saves
    if in_a_row < limit:
        return None
    return f"{in_a_row} checkpoint saves failed in a row (--max-failed-saves {limit}): not restarted, the run stops"


def _report_checkpoints(checkpoints: SaveStatusWatcher | None, client: Any, progress: TextIO | None, *,
                        force: bool) -> None:
    """Failed checkpoint saves are loud: a console line each (on stderr without ``progress``)."""
    if checkpoints is not None:
        for line in checkpoints.poll(client, force=force):
            print(line, file=progress or sys.stderr, flush=True)


def _finish(config: TrainConfig, client: Any, model: Any, train_seconds: float, output_dir: str,
            driver: str, *, end: RunEnd, eval_set: EvalSet, gone: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Every driver task exited 0: evaluates the model, then ends the run with its final snapshot (the ps
    tasks' ``Stats`` read after the evaluation, the workers' results, the ledger's last poll), written to
    metrics.json, status.json and metrics.prom; returns it. ``gone``: the ps tasks that exited after training
    (:func:`~psflow.launch.final_model.gone_after_training`), their stand-ins in place of their ``Stats``."""
    results = []
    for i in range(config.cluster.num_workers if driver == "worker" else 1):
        with open(os.path.join(output_dir, f"result-{driver}-{i}.json")) as f:
            results.append(json.load(f))
    eval_batch = after_training(eval_set.result)
    # The live ps tasks' model, or the final checkpoint's where a ps task lost its state past it (final_model).
    reached = max((int(r["last_step"]) for r in results if r.get("last_step") is not None), default=None)
    evaluation, from_checkpoint = evaluate_final(
        model, client, eval_batch, _ps_stats(config, client, end, gone, before=True),
        checkpoint_dir=config.checkpoint.dir, moving_averages=config.report.eval_moving_averages, reached=reached,
        out=end.out)
    ps_stats = with_step_of(_ps_stats(config, client, end, gone), from_checkpoint)
    exactly_once_examples(ps_stats)  # raises if no ps task holds global_step
    if config.checkpoint.dir:
        try:
            check_final_checkpoint(config.checkpoint.dir, next(int(s["global_step"]) for s in ps_stats
                                                               if s.get("global_step") is not None))
        except LaunchError as e:
            if config.checkpoint.max_failed_saves:
                raise
            # --max-failed-saves 0: no failed save fails the run (each one was reported); said all the same
            print(f"psflow: warning: {e} (--max-failed-saves 0: the run does not fail for it)",
                  file=end.out or sys.stderr, flush=True)
    extra: dict[str, Any] = {
        "examples_processed": sum(int(r["examples"]) for r in results),
        "stale_dropped": sum(int(r.get("stale_dropped", 0)) for r in results),
        "bad_records_skipped": sum(int(r.get("bad_records_skipped", 0)) for r in results),
        "workers" if driver == "worker" else "client": results,
        "eval_not_done": eval_not_done(results),  # the chief duties' evaluations not done (psflow.train.worker_result)
    }
    if from_checkpoint is not None:
        extra["eval_model"] = from_checkpoint.record()
    # What a restore within the run took from the final model (psflow.launch.restore_loss); None: no restore.
    # (a push dropped as stale held at most one batch: never applied, restore or not)
    extra["restore_loss"] = loss = restore_loss(ps_stats, examples_pushed=extra["examples_processed"],
                                                examples_at_start=end.resumed.examples if end.resumed else 0,
                                                examples_stale_at_most=extra["stale_dropped"] * config.data.batch_size,
                                                restores=[r.get("restore") for r in results],
                                                drivers_restarted=_drivers_restarted(end.lc, driver))
    dynamic = table_totals(ps_stats, tables=[v.name for v in model.variables() if v.dynamic is not None])
    if dynamic:  # admission, rejections, dropped gradients, evictions and memory of each dynamic table
        extra["dynamic_tables"] = dynamic
    if (line := restore_loss_line(loss)) is not None:  # before the end's writing: a signal there or EndNotWritten
        print(line, file=end.out or sys.stderr, flush=True)  # (raised on leaving it) would skip the run's report
    events = [e.to_json() for e in end.lc.resilience.supervisor.events] if end.lc.resilience is not None else []
    for line in readmitted_lines(client, events, sync=config.sync.mode == "sync", restored=loss is not None,
                                 ps_stats=ps_stats):
        print(line, file=end.out or sys.stderr, flush=True)
    return end.finished(ps_stats=ps_stats, train_seconds=train_seconds, evaluation=evaluation, extra=extra,
                        client=client, ledger_gone=STEP_TASK in gone)


def _drivers_restarted(lc: LocalCluster, driver: str) -> int:
    """How many times a process that pushes was restarted: the in-graph client, or a between-graph run's workers
    and chief (an in-graph worker pushes nothing). Each earlier life's pushes are in no result file."""
    jobs = ("client",) if driver == "client" else ("worker", "chief")
    events = lc.resilience.supervisor.events if lc.resilience is not None else []
    return sum(1 for e in events if e.restarted and any(e.task.startswith(f"/job:{j}/") for j in jobs))


def _ps_stats(config: TrainConfig, client: Any, end: RunEnd, gone: dict[str, dict[str, Any]], *,
              before: bool = False) -> list[dict[str, Any]]:
    """Each ps task's ``Stats`` (replicated shards: each shard's primary's, asked of every member; a shard none
    answered for, its stand-in), a task ``gone`` its stand-in (not asked). ``before`` (the evaluation): a task that
    does not answer is counted lost (:func:`~psflow.launch.final_model.stats_or_silent`), not raised."""
    if BACKUP_JOB in end.lc.cluster.jobs:
        return end.read_shards(config.cluster.rpc_timeout, gone)
    live = [i for i in sorted(client.channels) if client.channels[i].task not in gone]
    read = stats_or_silent(client.stats, live) if before else [client.stats(i) for i in live]
    return sorted([*read, *(dict(g) for g in gone.values())], key=lambda s: int(str(s["task"]).rsplit(":", 1)[1]))


def check_final_checkpoint(directory: str, global_step: int) -> None:
    """(Every driver task exited 0) The newest checkpoint in ``directory`` must be the run's final one (its
    manifest says ``final``) at ``global_step``, the run's last: the last line of defence against a run that
    ends with an older checkpoint as the newest, which a restore, the evaluator and ``psflow export`` would
    read. The chief writes it after every worker finished and nothing pushes after it, so the two steps agree
    in every finished run: a run that resumed a final checkpoint and had nothing left to train marks it
    again, at the same step. Reads the pointer and one manifest.

    Raises:
        LaunchError: it is not (names the directory, the run's last step, and the newest checkpoint: its name,
            step and whether it is final), or it cannot be read.
    """
    problem = f"the run ended at global_step {global_step}, but"
    try:
        latest = latest_checkpoint(directory)
        manifest = read_manifest(latest) if latest is not None else None
    except (CheckpointError, OSError) as e:
        raise LaunchError(f"{problem} the newest checkpoint in {directory} cannot be read: {e}") from e
    if latest is None or manifest is None:
        raise LaunchError(f"{problem} {directory} holds no complete checkpoint: its final checkpoint was not "
                          "written (see the chief's log)")
    if not manifest.final or manifest.global_step != global_step:
        raise LaunchError(f"{problem} the newest checkpoint in {directory} is {os.path.basename(latest)} (global_step "
                          f"{manifest.global_step}, {'final' if manifest.final else 'not final'}): the run's final "
                          "checkpoint was not written (see the chief's log)")


def exactly_once_examples(ps_stats: list[dict[str, Any]]) -> int:
    """The examples in the model's history, each record counted once per epoch: the count of the ps task
    holding global_step (its ``Stats``), which every push adds its examples to and every restore sets back
    to the checkpoint's count, so work redone after a restore and pushes lost with a killed worker are
    neither counted twice nor missing.

    Raises:
        LaunchError: no ps task reports holding global_step (names the tasks asked).
    """
    for stats in ps_stats:
        if stats.get("global_step") is not None:
            return int(stats.get("examples") or 0)
    raise LaunchError("no ps task reports holding global_step (asked " +
                      ", ".join(str(s.get("task")) for s in ps_stats) + "): cannot count the examples trained")
