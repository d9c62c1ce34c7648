"""Entry point of one task process: ``python -m psflow.launch.task``.

Started by the local launcher (or by hand / a cluster manager through
``psflow server``). A ps task serves until asked to shut down (or, under
``psflow server``, until the run is over: :mod:`psflow.ps.run_end`); a worker
task serves its WorkerService and runs the training loop, then exits 0.
The cluster token comes from the ``PSFLOW_TOKEN`` environment variable,
read here, at the edge.

Stopping (see :mod:`psflow.launch.lifeline`): SIGTERM, SIGHUP or SIGINT
(but one the process inherited ignored, as ``nohup`` leaves SIGHUP: it stays
ignored, and the task's log says so once), or the launcher's death
(``--lifeline FD``, ``--exit-with-parent``), ends a task in order, without
a lock taken or an exception raised in a signal handler: a ps task stops
serving, a worker leaves its loop before its next step (a call blocked in a
sync barrier is failed by closing its channels), and the process exits
with ``128 + n`` (143 on SIGTERM; 129 when the launcher died) within the
stop's grace (2 s), by force if it must.

Errors: an expected one (a :class:`~psflow.errors.PsflowError` that
:func:`psflow.launch.console.expected_in_task` accepts: a malformed record,
a bad setting, a port in use, a ps task's refusal of a sync step that timed out; not a
call to another task that failed for another reason) ends the task with exit
status 1 and one ERROR line in its log, no traceback (``--verbose`` adds it);
with ``--error-file`` the line is also written there as JSON (``task``,
``type``, ``message``) for the launcher's failure report. A ps task's variables
lost with no checkpoint to restore them from (:mod:`psflow.train.state_loss`)
is such an error, with exit status 3 (``STATE_LOST_EXIT_CODE``: no restart
policy restarts the task). Anything else is a bug: its traceback goes to the log.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import sys
from typing import Any

from psflow import jsonio, storage
from psflow.cluster import ClusterSpec
from psflow.errors import PsflowError
from psflow.launch.console import expected_in_task
from psflow.launch.lifeline import StopRequest, set_parent_death_signal
from psflow.launch.log_format import LineFormatter, lean_records
from psflow.launch.token import TOKEN_ENV, cluster_token
from psflow.rpc.api import ListenError
from psflow.rpc.tcp_server import TcpLimits
from psflow.rpc.tls import TlsConfig
from psflow.server import Server
from psflow.train.config import TrainConfig
from psflow.train.faults import NO_FAULTS, FaultInjection, read_task_config

__all__ = ["main", "run_task", "TOKEN_ENV"]

log = logging.getLogger("psflow.launch")


def configure_logging(*, verbose: bool = False) -> None:
    """INFO lines to stderr (a task's log); ``verbose``: psflow's DEBUG lines too.

    Lines in :data:`~psflow.launch.log_format.LOG_FORMAT`, made by a
    :class:`~psflow.launch.log_format.LineFormatter`; records without the fields that format never shows
    (:func:`~psflow.launch.log_format.lean_records`: this process is psflow's). Does nothing to a process whose
    root logger already has a handler, but the level of psflow's logger with ``verbose``.
    """
    if not logging.getLogger().handlers:
        lean_records()
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(LineFormatter())
        logging.basicConfig(level=logging.INFO, handlers=[handler])
    if verbose:
        logging.getLogger("psflow").setLevel(logging.DEBUG)


def run_task(cluster: ClusterSpec, job: str, index: int, config: TrainConfig | None, *,
             token: str | None, result_path: str | None = None, state_dir: str | None = None,
             checkpoint_root: str | None = None, tcp_limits: TcpLimits | None = None,
             stop: StopRequest | None = None, bind_address: str | None = None, tls: TlsConfig | None = None,
             stop_when_run_over: bool = False, faults: FaultInjection = NO_FAULTS,
             save_ledger_file: str | None = None, supervised: bool = False) -> int:
    """Runs one task until it is done or stopped; returns the process exit status.

    Blocks. Returns 0 when the task finished (a ps task: asked to shut down, or with
    ``stop_when_run_over`` the run is over, see :class:`psflow.server.Server`),
    ``stop.exit_code`` (``128 + n``) when it was stopped (see the module docstring).

    ``stop``: the task's started :class:`~psflow.launch.lifeline.StopRequest`
    (:func:`main` starts one on the launcher's lifeline); None: one is made
    here, its signal handlers installed (main thread only) and its watcher started,
    and closed when the task returns: the caller's own SIGTERM, SIGHUP and SIGINT
    handlers and wakeup fd (``signal.set_wakeup_fd``) are back, so a program can run
    a task and go on, or run another (a stop signal that came during the task still
    ends the process within the stop's grace, as it asked).

    ``state_dir``, ``checkpoint_root``, ``tcp_limits``, ``save_ledger_file`` (ps tasks), ``bind_address``: see
    :class:`psflow.server.Server`; ``checkpoint_root`` defaults to the
    config's ``checkpoint_dir`` (what the local launcher passes).

    ``tls``: the task's server serves TLS with it, and every gRPC channel the task opens uses it
    (to the ps tasks, including checkpoint streaming, the embedded coordination backend, and an
    in-graph run's workers); ``None``: plain text, as every task of the local launcher runs.

    ``job == "client"`` is the in-graph client (not a task of the cluster):
    it reads the data and drives every worker. A worker of an in-graph run
    serves ``RunStep`` until it is shut down. A ``chief`` task trains as the
    first of the training workers (:func:`psflow.train.chief.training_view`).

    ``faults``: tests' and drills' faults for a worker or the in-graph client (:mod:`psflow.train.faults`).

    ``supervised``: the local launcher watches this task and restarts a dead worker or stops the run
    (:mod:`psflow.launch.supervisor`), or a cluster manager restarts it (``psflow server
    --restarted-by-manager``), so a worker whose data ended never takes the chief duties over from a
    chief that is only restarting (:mod:`psflow.train.take_over` is for a chief that nothing restarts).
    """
    if stop is None:
        with StopRequest(f"/job:{job}/task:{index}") as own:
            own.install_handlers()
            own.start()
            return run_task(cluster, job, index, config, token=token, result_path=result_path, state_dir=state_dir,
                            checkpoint_root=checkpoint_root, tcp_limits=tcp_limits, stop=own,
                            bind_address=bind_address, tls=tls, stop_when_run_over=stop_when_run_over,
                            faults=faults, save_ledger_file=save_ledger_file, supervised=supervised)
    if job == "client":
        if config is None:
            raise SystemExit("the in-graph client needs a training config")
        from psflow.train.in_graph_client import run_in_graph_client

        result = run_in_graph_client(config, cluster, token=token, tls=tls, faults=faults)  # a stop ends it by the stop's deadline
        if result_path:
            with open(result_path, "w") as f:
                jsonio.dump(result, f)
        return 0
    in_graph = config is not None and config.sync.replication == "in-graph" and job not in ("ps", "ps_backup")
    handlers = None
    if in_graph and config is not None:
        from psflow.train.in_graph import StepService

        handlers = StepService(config, cluster, index, token=token, tls=tls).handlers()
    if checkpoint_root is None and config is not None:
        checkpoint_root = config.checkpoint.dir
    server = Server(cluster, job, index, token=token, worker_handlers=handlers, state_dir=state_dir,
                    checkpoint_root=checkpoint_root, tcp_limits=tcp_limits, bind_address=bind_address, tls=tls,
                    stop_when_run_over=stop_when_run_over, save_ledger_file=save_ledger_file)
    try:
        if job in ("ps", "ps_backup") or in_graph:  # a ps shard's backup serves as its primary does
            stop.on_stop(functools.partial(server.stop, grace=0.0))  # ends join() below
            server.join()
            return _stopped(server.task.name, stop) if stop.requested() else 0
        if config is None:
            raise SystemExit(f"{server.task.name}: a worker task needs a training config")
        from psflow.train.chief import training_view
        from psflow.train.worker import run_worker  # ps tasks never import the data stack

        trainers, trainer_index = training_view(cluster, job, index)  # a chief job trains too, as worker 0
        try:
            run_worker(config, trainers, trainer_index, token=token, tls=tls, result_path=result_path, stop=stop,
                       faults=faults, take_over=not supervised)
        except Exception as e:
            if stop.requested() is None:
                raise
            # WorkerStopped, or a call failed by the stop closing the channels: either way, stopped.
            log.info("%s: left training: %s", server.task.name, e)
            return _stopped(server.task.name, stop)
        return 0
    finally:
        server.stop(grace=0.0 if stop.requested() else 0.5)


def _stopped(task: str, stop: StopRequest) -> int:
    log.warning("%s: stopped (%s); exit status %d", task, stop.requested(), stop.exit_code)
    return stop.exit_code


def expected_failure(task: str, error: Exception, *, error_file: str | None, verbose: bool) -> int:
    """An expected error ended ``task``: logs it as one ERROR line (with its traceback if ``verbose``),
    writes it to ``error_file`` (JSON: ``task``, ``type``, ``message``, and ``port_taken`` when another process
    held the task's port; best effort) and returns 1."""
    named = str(error).startswith(f"{task}: ")  # a message that names the task already (a NaN loss) keeps one name
    log.error("%s", error if named else f"{task}: {error}", exc_info=error if verbose else None)
    if error_file:
        record: dict[str, Any] = {"task": task, "type": type(error).__name__, "message": str(error)}
        if isinstance(error, ListenError) and error.port_taken is not None:  # another process holds the task's port
            record["port_taken"] = error.port_taken
        try:
            storage.write_atomically(error_file, jsonio.dumps(record).encode(), durable=False)
        except OSError as e:
            log.warning("%s: could not write %s: %s", task, error_file, e)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m psflow.launch.task")
    parser.add_argument("--cluster", required=True, help="cluster JSON file")
    parser.add_argument("--job", required=True)
    parser.add_argument("--task", type=int, required=True)
    parser.add_argument("--config", help="the task config file: TrainConfig JSON, with the tests' faults beside "
                        "it (psflow.train.faults)")
    parser.add_argument("--result", help="where a worker writes its result JSON")
    parser.add_argument("--state-dir", help="ps task: where global_step's bound survives a restart")
    parser.add_argument("--save-ledger", help="ps task 0: where its checkpoint ledger survives a restart "
                        "(the local launcher's, one per run)")
    parser.add_argument("--checkpoint-root", help="ps task: write checkpoint shards only under this directory "
                        "(default: the config's checkpoint_dir)")
    parser.add_argument("--lifeline", type=int, metavar="FD",
                        help="read end of the launcher's lifeline pipe: EOF (the launcher died) stops the task")
    parser.add_argument("--exit-with-parent", action="store_true",
                        help="Linux: SIGHUP when the thread that started this task exits (prctl PR_SET_PDEATHSIG)")
    parser.add_argument("--error-file", help="where an expected error's one line is written (JSON), for the launcher")
    parser.add_argument("--verbose", action="store_true", help="DEBUG lines; tracebacks of expected errors too")
    parser.add_argument("--supervised", action="store_true", help="started by the local launcher, which restarts "
                        "a dead worker or stops the run: a finished worker never takes the chief duties over")
    args = parser.parse_args(argv)
    configure_logging(verbose=args.verbose)
    # First, before anything slow: from here on a signal or the launcher's death stops the task in order.
    stop = StopRequest(f"/job:{args.job}/task:{args.task}")
    stop.install_handlers()
    if args.exit_with_parent:
        set_parent_death_signal(signal.SIGHUP)
    stop.start(args.lifeline)  # after prctl: a launcher that died before it is seen on the pipe
    with open(args.cluster) as f:
        cluster = ClusterSpec.from_json(f.read())
    config, faults = None, NO_FAULTS
    if args.config:
        with open(args.config) as f:
            config, faults = read_task_config(f.read())
    try:
        code = run_task(cluster, args.job, args.task, config, token=cluster_token(os.environ),
                        result_path=args.result, state_dir=args.state_dir, stop=stop,
                        checkpoint_root=args.checkpoint_root, faults=faults, save_ledger_file=args.save_ledger,
                        supervised=args.supervised)
    except PsflowError as e:
        # The in-graph client drives every task: another task's failure (a ps task killed, a worker not
        # back in time) is its error too, told in one line naming that task, as a between-graph worker does.
        if not expected_in_task(e) and args.job != "client":
            raise
        from psflow.launch.supervisor import STATE_LOST_EXIT_CODE
        from psflow.train.state_loss import StateLostError

        failed = expected_failure(f"/job:{args.job}/task:{args.task}", e, error_file=args.error_file,
                                  verbose=args.verbose)
        return STATE_LOST_EXIT_CODE if isinstance(e, StateLostError) else failed  # never restarted
    if stop.requested() is not None:
        # Stopped in order: the server is stopped and the channels closed. The interpreter's teardown
        # adds nothing but time (a worker's final garbage collection took seconds), so skip it.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
