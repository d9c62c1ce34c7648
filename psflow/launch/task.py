"""Entry point of one task process: ``python -m psflow.launch.task``.

Started by the local launcher (or by hand / a cluster manager through
``psflow server``). A ps task serves until asked to shut down; a worker task
serves its WorkerService and runs the training loop, then exits 0.
The cluster token comes from the ``PSFLOW_TOKEN`` environment variable,
read here, at the edge.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from types import FrameType

from psflow.cluster import ClusterSpec
from psflow.server import Server
from psflow.train.config import TrainConfig

__all__ = ["main", "run_task"]

#: Environment variable carrying the cluster token to task processes (read here, at the edge).
TOKEN_ENV = "PSFLOW_TOKEN"


def configure_logging() -> None:
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run_task(cluster: ClusterSpec, job: str, index: int, config: TrainConfig | None, *,
             token: str | None, result_path: str | None = None, state_dir: str | None = None) -> int:
    """Runs one task until it is done; returns the process exit status.

    ``state_dir`` (ps tasks): see :class:`psflow.server.Server`.

    ``job == "client"`` is the in-graph client (not a task of the cluster):
    it reads the data and drives every worker. A worker of an in-graph run
    serves ``RunStep`` until it is shut down.
    """
    if job == "client":
        if config is None:
            raise SystemExit("the in-graph client needs a training config")
        from psflow.train.in_graph import run_in_graph_client

        result = run_in_graph_client(config, cluster, token=token)
        if result_path:
            with open(result_path, "w") as f:
                json.dump(result, f)
        return 0
    in_graph = config is not None and config.replication == "in-graph" and job != "ps"
    handlers = None
    if in_graph and config is not None:
        from psflow.train.in_graph import StepService

        handlers = StepService(config, cluster, index, token=token).handlers()
    server = Server(cluster, job, index, token=token, worker_handlers=handlers, state_dir=state_dir)

    def _terminate(signum: int, frame: FrameType | None) -> None:
        server.stop(grace=0.0)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _terminate)
    try:
        if job == "ps" or in_graph:
            server.join()
            return 0
        if config is None:
            raise SystemExit(f"{server.task.name}: a worker task needs a training config")
        from psflow.train.worker import run_worker  # ps tasks never import the data stack

        run_worker(config, cluster, index, token=token, result_path=result_path)
        return 0
    finally:
        server.stop(grace=0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m psflow.launch.task")
    parser.add_argument("--cluster", required=True, help="cluster JSON file")
    parser.add_argument("--job", required=True)
    parser.add_argument("--task", type=int, required=True)
    parser.add_argument("--config", help="TrainConfig JSON file")
    parser.add_argument("--result", help="where a worker writes its result JSON")
    parser.add_argument("--state-dir", help="ps task: where global_step's bound survives a restart")
    args = parser.parse_args(argv)
    configure_logging()
    with open(args.cluster) as f:
        cluster = ClusterSpec.from_json(f.read())
    config = None
    if args.config:
        with open(args.config) as f:
            config = TrainConfig.from_json(f.read())
    return run_task(cluster, args.job, args.task, config, token=os.environ.get(TOKEN_ENV) or None,
                    result_path=args.result, state_dir=args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
