"""``psflow shutdown --cluster FILE``: stops the ps tasks of a cluster started by hand.

``psflow server``'s ps tasks exit by themselves once the run is over
(:mod:`psflow.ps.run_end`); this command is for the others: a run that
failed, tasks started with ``--keep-serving``, a ps task restarted after the
run ended. It sends ``Shutdown`` to every ps task of the cluster at once (and
to every ``ps_backup`` task, the backups of replicated shards, listed after them),
authenticated as every call is (the cluster token; TLS as ``psflow server``
takes it), then checks that the task no longer answers at its address.

One line per task on stdout, ``/job:ps/task:N (host:port): OUTCOME``, where
OUTCOME is one of:

``stopped``
    it took the request and no longer answers;
``unreachable (why)``
    nothing answered within ``--timeout`` (already stopped, or not reachable);
``refused (unauthenticated: why)``, ``refused (why)``
    the task refused the request; an unauthenticated one (a missing or wrong
    token) always is, and the task keeps serving;
``still serving (why)``
    it took the request but still answers after ``--timeout``.

Exit status: 0 when every ps task stopped; 1 otherwise (or on a usage error).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent import futures
from typing import Any, TextIO

from psflow.cli.tls_flags import add_tls_arguments, tls_config
from psflow.cluster import ClusterSpec, parse_tf_config
from psflow.launch.token import TOKEN_ENV, cluster_token
from psflow.rpc.api import WORKER_SERVICE, ConnectConfig, RpcError, TaskUnavailableError, UnauthenticatedError
from psflow.rpc.tls import TlsConfig
from psflow.status.replication import ps_members
from psflow.train.config import ConfigError

__all__ = ["add_shutdown_parser", "run_shutdown", "shutdown_cluster", "print_outcomes"]

_POLL = 0.1  # s between the checks that a task stopped answering


def add_shutdown_parser(sub: Any) -> None:
    """Adds ``psflow shutdown`` to the CLI's subcommands."""
    p = sub.add_parser("shutdown", help="stop the ps tasks of a cluster started by hand (psflow server)")
    p.add_argument("--cluster", help="cluster JSON file (else TF_CONFIG's cluster)")
    p.add_argument("--insecure", action="store_true",
                   help="call without a cluster token (PSFLOW_TOKEN unset): only a cluster started with --insecure "
                        "accepts it; refused without this flag")
    p.add_argument("--timeout", type=float, default=10.0, metavar="S",
                   help="seconds to reach each task, and then to see it stop (%(default)s)")
    add_tls_arguments(p)
    p.set_defaults(transport="grpc")  # what the --tls-* checks read


def shutdown_cluster(cluster: ClusterSpec, *, token: str | None, tls: TlsConfig | None = None,
                     timeout: float = 10.0) -> dict[str, str]:
    """Asks every ps task of ``cluster`` to stop (and every ``ps_backup`` task: replicated shards), all at once;
    blocks until each answered or ``timeout``.

    Returns:
        Task name -> outcome (``stopped``, ``unreachable (...)``, ``refused (...)``, ``still serving (...)``),
        in task order. Never raises for a task's failure: it is that task's outcome.
    """
    from psflow.rpc.grpc_client import TaskChannel  # imports grpc: after the CLI set gRPC's logging

    config = ConnectConfig(token=token, tls=tls, connect_timeout=timeout, rpc_timeout=timeout)
    tasks = ps_members(cluster)

    def stop(task: str, address: str) -> str:
        channel = TaskChannel(task, address, WORKER_SERVICE, config)
        try:
            return _stop_one(channel, timeout)
        finally:
            channel.close()

    if not tasks:
        return {}
    with futures.ThreadPoolExecutor(len(tasks)) as pool:
        outcomes = [pool.submit(stop, task, address) for task, address in tasks]
        return {f"{task} ({address})": f.result() for (task, address), f in zip(tasks, outcomes, strict=True)}


def _stop_one(channel: Any, timeout: float) -> str:
    try:
        channel.wait_ready(timeout)
        channel.call("Shutdown", timeout=timeout)
    except TaskUnavailableError as e:
        return f"unreachable ({e})"
    except UnauthenticatedError as e:
        return f"refused (unauthenticated: {e})"
    except RpcError as e:
        return f"refused ({e})"
    deadline = time.monotonic() + timeout
    while True:  # stopped once it no longer answers (it stops within its grace, then its process exits)
        try:
            channel.call("Ping", timeout=max(0.1, min(1.0, deadline - time.monotonic())))
        except TaskUnavailableError:
            return "stopped"
        except RpcError as e:
            if time.monotonic() >= deadline:
                return f"still serving ({e})"
        if time.monotonic() >= deadline:
            return f"still serving after {timeout:g} s"
        time.sleep(_POLL)


def print_outcomes(outcomes: dict[str, str], out: TextIO = sys.stdout) -> int:
    """Prints one line per task; returns the exit status (0: every task stopped)."""
    for task, outcome in outcomes.items():
        print(f"{task}: {outcome}", file=out, flush=True)
    if not outcomes:
        print("psflow shutdown: the cluster has no ps task", file=sys.stderr)
        return 1
    stopped = sum(outcome == "stopped" for outcome in outcomes.values())
    if stopped < len(outcomes):
        print(f"psflow shutdown: {stopped} of {len(outcomes)} ps tasks stopped", file=sys.stderr)
        return 1
    return 0


def run_shutdown(args: argparse.Namespace) -> int:
    """``psflow shutdown``: the cluster (``--cluster``, else ``TF_CONFIG``) and the token read here (:func:`shutdown_cluster`)."""
    token = cluster_token(os.environ)
    if token is None and not args.insecure:
        raise ConfigError(f"no cluster token: set {TOKEN_ENV} (the cluster's secret), or pass --insecure for a "
                          "cluster started with --insecure")
    if args.cluster:
        with open(args.cluster) as f:
            cluster = ClusterSpec.from_json(f.read())
    elif os.environ.get("TF_CONFIG"):
        cluster = parse_tf_config(os.environ["TF_CONFIG"]).cluster
    else:
        raise ConfigError("psflow shutdown needs --cluster FILE (or TF_CONFIG in the environment)")
    if args.timeout <= 0:
        raise ConfigError(f"--timeout {args.timeout}: want seconds > 0")
    tls = tls_config(args, task="psflow shutdown", serves=False)
    return print_outcomes(shutdown_cluster(cluster, token=token, tls=tls, timeout=args.timeout))
