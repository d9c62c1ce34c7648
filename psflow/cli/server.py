"""``psflow server``: one task of a cluster that spans machines (a ps task serves, a worker trains, the
evaluator evaluates each new checkpoint), its flags, token, TLS and TCP limits read here.

A cluster (``--cluster`` or ``TF_CONFIG``) with a ``ps_backup`` job replicates its ps shards: a
``ps_backup`` task serves as a ps task does, as a backup of shard ``index % num_ps``
(:mod:`psflow.cluster.replicas`); ``psflow k8s render --ps-replicas N`` writes such a cluster.

``--restarted-by-manager``: something restarts this task when it dies (Kubernetes' ``restartPolicy: OnFailure``, as
``psflow k8s render`` writes its pods), so a worker whose data ended waits for a restarting chief instead of taking
the chief duties over (``run_task(supervised=True)``, :mod:`psflow.train.take_over`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import threading
from typing import TYPE_CHECKING

from psflow.cli.tls_flags import add_tls_arguments, tls_config
from psflow.cli.training import add_training_arguments, config_from_args, faults_from_args
from psflow.cluster import ClusterSpec, parse_tf_config
from psflow.cluster.replicas import BACKUP_JOB, PS_JOB, ps_replicas
from psflow.train.config import ConfigError
from psflow.train.inputs import check_inputs

if TYPE_CHECKING:  # imports grpc: imported where used, after main() set gRPC's logging (psflow.cli.main)
    from psflow.rpc.tcp_server import TcpLimits

__all__ = ["add_server_arguments", "run_server"]


def _add_server_security_arguments(p: argparse.ArgumentParser) -> None:
    from psflow.launch.task import TOKEN_ENV
    from psflow.rpc.tcp_server import TcpLimits

    g = p.add_argument_group("security and limits (psflow server)")
    g.add_argument("--insecure", action="store_true",
                   help=f"run without a cluster token ({TOKEN_ENV} unset): any peer that reaches the task can call it, "
                        "Shutdown included; refused without this flag")
    g.add_argument("--checkpoint-root", metavar="DIR",
                   help="ps task: write checkpoint shards only under DIR (default: --checkpoint-dir; neither: no shard "
                        "files, use --checkpoint-transport rpc)")
    g.add_argument("--tcp-handshake-timeout", type=float, default=TcpLimits.handshake_timeout, metavar="S",
                   help="ps task: seconds a TCP data-path connection has to authenticate (%(default)s)")
    g.add_argument("--tcp-idle-timeout", type=float, default=TcpLimits.idle_timeout, metavar="S",
                   help="ps task: seconds an idle TCP data-path connection is kept; clients reconnect (%(default)s)")
    g.add_argument("--tcp-max-connections", type=int, default=TcpLimits.max_connections, metavar="N",
                   help="ps task: authenticated TCP data-path connections served at once (%(default)s)")
    add_tls_arguments(p)


def add_server_arguments(server: argparse.ArgumentParser) -> None:
    server.add_argument("--cluster", help="cluster JSON file (else TF_CONFIG)")
    server.add_argument("--job", help="job name (else TF_CONFIG)")
    server.add_argument("--task", type=int, help="task index (else PSFLOW_TASK_INDEX, else TF_CONFIG)")
    server.add_argument("--state-dir", help="ps task 0 keeps global_step's bound here (global_step.json), so that "
                        "restarted it never hands out a step value twice; use storage that outlives the process")
    server.add_argument("--eval-poll-secs", type=float, default=5.0, metavar="S",
                        help="evaluator task (TF_CONFIG type 'evaluator'): look for a new checkpoint in "
                             "--checkpoint-dir every S seconds (%(default)s)")
    server.add_argument("--bind-host", metavar="ADDRESS", help="listen on ADDRESS (e.g. 0.0.0.0) at the task's port "
                        "instead of on its cluster address's host (in a container, where that is a Service name)")
    server.add_argument("--keep-serving", action="store_true",
                        help="ps task: serve until stopped (psflow shutdown, a signal), as TensorFlow's server.join(); "
                             "default: exit 0 once every training worker finished (after the final checkpoint)")
    server.add_argument("--restarted-by-manager", action="store_true",
                        help="a cluster manager restarts this task when it dies (Kubernetes restartPolicy "
                             "OnFailure): a finished worker waits for the chief instead of taking its duties over "
                             "(default: it takes them over once nobody pushed or held the chief lease for "
                             "--lease-ttl); psflow k8s render gives it to every worker and chief")
    _add_server_security_arguments(server)
    add_training_arguments(server)


def _tcp_limits(args: argparse.Namespace) -> TcpLimits:
    from psflow.rpc.tcp_server import TcpLimits

    flags = {"handshake_timeout": "--tcp-handshake-timeout", "idle_timeout": "--tcp-idle-timeout",
             "max_connections": "--tcp-max-connections"}
    try:
        return TcpLimits(**{field: getattr(args, f"tcp_{field}") for field in flags})
    except ValueError as e:
        field = next((f for f in flags if f"TcpLimits.{f} " in str(e)), "")
        raise ConfigError(f"{flags.get(field, '--tcp-*')}: {e}") from None


def run_server(args: argparse.Namespace) -> int:
    from psflow.cli.status import status_config
    from psflow.deploy.config import TASK_INDEX_ENV, task_index_from_env
    from psflow.launch.run_status import chief_status_page
    from psflow.launch.task import configure_logging, run_task
    from psflow.launch.token import TOKEN_ENV, cluster_token

    token = cluster_token(os.environ)
    if token is None and not args.insecure:
        raise ConfigError(f"no cluster token: set {TOKEN_ENV} (the same secret on every task), "
                          "or pass --insecure to run without authentication")
    limits = _tcp_limits(args)
    task = args.task if args.task is not None else task_index_from_env(os.environ.get(TASK_INDEX_ENV))
    tf_config = os.environ.get("TF_CONFIG")
    if args.cluster:
        with open(args.cluster) as f:
            cluster = ClusterSpec.from_json(f.read())
        job, index = args.job, task
    elif tf_config:
        parsed = parse_tf_config(tf_config)
        cluster = parsed.cluster
        job = args.job or (parsed.task.job if parsed.task else None)
        index = task if task is not None else (parsed.task.index if parsed.task else None)
    else:
        raise ConfigError("psflow server needs --cluster FILE (or TF_CONFIG in the environment)")
    if job is None or index is None:
        raise ConfigError("psflow server needs --job and --task (or a 'task' in TF_CONFIG)")
    tls = tls_config(args, task=f"/job:{job}/task:{index}", serves=job != "client")  # files read once, here
    if job == "evaluator" and "evaluator" not in cluster.jobs:  # outside the cluster, as TensorFlow runs it
        return _evaluator(args, cluster, index)
    port = cluster.task_address(job, index).rsplit(":", 1)[1]  # names the job/task if it is not in the cluster
    bind = None if args.bind_host is None else (
        f"[{args.bind_host}]:{port}" if ":" in args.bind_host else f"{args.bind_host}:{port}")
    ps_replicas(cluster)  # a ps_backup job that is not N backups per shard is refused here, naming both counts
    serves = job in (PS_JOB, BACKUP_JOB)  # a ps task, or a backup of a replicated ps shard (psflow.cluster.replicas)
    config = None
    if not serves:
        if not args.train:
            raise ConfigError(f"/job:{job}/task:{index} trains: --train is required")
        trainers = sum(cluster.num_tasks(j) for j in ("chief", "worker") if j in cluster.jobs)  # a chief trains too
        config = config_from_args(args, num_ps=cluster.num_tasks("ps"), num_workers=trainers)
        if config.data.eval:  # no launcher evaluates at the end, as psflow train's does: the chief duties do
            config = dataclasses.replace(config, report=dataclasses.replace(config.report, eval_at_end=True))
        if job == "client" or config.sync.replication == "between-graph":  # this task reads the data
            check_inputs(config)
        from psflow.train.preflight import check_settings  # imports grpc (checkpoints): here, see the module docstring

        check_settings(config, memory=False)  # dynamic tables, another optimizer on resume (the ps may be elsewhere)
    configure_logging(verbose=args.verbose)
    status = status_config(args)
    page = chief_status_page(cluster, job, index, config, token=token, tls=tls, status=status) \
        if config is not None and status.enabled else None
    try:
        return run_task(cluster, job, index, config, token=token, state_dir=args.state_dir, tcp_limits=limits,
                        checkpoint_root=args.checkpoint_root or args.checkpoint_dir, bind_address=bind, tls=tls,
                        stop_when_run_over=serves and not args.keep_serving,
                        faults=faults_from_args(args), supervised=args.restarted_by_manager)
    finally:
        if page is not None:
            page.close()


def _evaluator(args: argparse.Namespace, cluster: ClusterSpec, index: int) -> int:
    """``psflow server`` as TensorFlow's evaluator task (:mod:`psflow.launch.evaluator`)."""
    from psflow.launch.evaluator import run_evaluator
    from psflow.launch.lifeline import StopRequest
    from psflow.launch.task import configure_logging

    trainers = sum(cluster.num_tasks(j) for j in ("chief", "worker") if j in cluster.jobs)
    config = config_from_args(args, num_ps=cluster.num_tasks("ps"), num_workers=max(trainers, 1))
    configure_logging(verbose=args.verbose)  # run_evaluator reads --eval first: a bad file is one clear line
    with StopRequest(f"/job:evaluator/task:{index}") as stop:  # closed: a program calling main() gets its handlers back
        stop.install_handlers()
        stop.start()
        stopped = threading.Event()
        stop.on_stop(stopped.set)
        run_evaluator(config, poll_secs=args.eval_poll_secs, stop=stopped)
        return stop.exit_code if stop.requested() is not None else 0
