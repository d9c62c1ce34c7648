"""A whole run in one process: the fast path with no RPC (``psflow train --in-process``).

The ps tasks' :class:`~psflow.ps.service.ParameterService` objects live in
this process and the worker's :class:`~psflow.train.client.ParameterClient`
reaches them through :class:`~psflow.rpc.inprocess.InProcessChannel`: the same
placement, optimizers, step accounting, hooks and checkpoints as a cluster,
without sockets, framing or copies. One worker; its input is read and parsed
in a child process (``reader_process``, see :mod:`psflow.data.reader_process`)
so that parsing runs on another core while this one trains.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, replace
from typing import Any

from psflow import jsonio
from psflow.cluster import ClusterSpec
from psflow.ps.dynamic import table_totals
from psflow.ps.service import ParameterService
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.build import build_model
from psflow.train.checkpoint import checkpoint_status
from psflow.train.client import ParameterClient
from psflow.train.config import TORCH_THREADS_ENV, ConfigError, TrainConfig
from psflow.train.duties import claim_checkpoint_dir
from psflow.train.evaluation import evaluate
from psflow.train.inputs import check_inputs
from psflow.train.preflight import check_settings
from psflow.train.worker import load_eval, run_worker

__all__ = ["run_in_process"]


@contextlib.contextmanager
def _log_to(path: str) -> Iterator[None]:
    """Sends psflow's INFO log lines to ``path`` while the block runs (the task log of a cluster run)."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("psflow")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        handler.close()


def run_in_process(config: TrainConfig, output_dir: str) -> dict[str, Any]:
    """Trains with ``config.num_ps`` in-process ps services and one worker; returns the metrics.

    Blocks for the whole run; writes ``output_dir/metrics.json`` (the same
    fields as a cluster run) and, as a cluster run does, the worker's log to
    ``output_dir/logs/worker-0.log`` (the ps services' lines too).

    Raises:
        ConfigError: more than one worker asked for.
        DataError: malformed input, or an empty ``--train`` or ``--eval`` (before anything starts).
    """
    if config.num_workers != 1:
        raise ConfigError(f"--in-process runs one worker, got --workers {config.num_workers}")
    if config.replication != "between-graph":
        raise ConfigError("--in-process has no in-graph replication")
    check_inputs(config)
    check_settings(config)  # memory, dynamic tables: refused in one line before anything starts
    config = replace(config, mode="async") if config.mode == "ssp" else config
    config = replace(config, reader_process=True)
    # The run's id, and its checkpoint directory taken up front (another live run's is refused).
    config, checkpoint_lock = claim_checkpoint_dir(config, run_dir=output_dir, out=sys.stderr)
    # PyTorch models: the reader process parses on one core; this process's intra-op threads take the rest
    # (psflow.torch.configure_threads; OpenMP's spinning threads degrade badly on oversubscribed cores).
    os.environ.setdefault(TORCH_THREADS_ENV, str(max(1, (os.cpu_count() or 1) - 1)))
    # Placeholder addresses: nothing listens or connects; the channels below replace them.
    cluster = ClusterSpec({"ps": [f"127.0.0.1:{i + 1}" for i in range(config.num_ps)], "worker": ["127.0.0.1:65535"]})
    services = [ParameterService(i, holds_global_step=i == 0) for i in range(config.num_ps)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    model, variables = build_model(config, cluster)
    client = ParameterClient(cluster, variables.placements(), client_name="/job:worker/task:0",
                             sync=config.sync_config(), channels=channels)
    os.makedirs(os.path.join(output_dir, "logs"), exist_ok=True)
    started = time.monotonic()
    with checkpoint_lock or contextlib.nullcontext(), _log_to(os.path.join(output_dir, "logs", "worker-0.log")):
        result = run_worker(config, cluster, 0, client=client)
    wall = time.monotonic() - started
    ps_stats = [client.stats(i) for i in sorted(channels)]
    examples = int(ps_stats[0]["examples"])  # ps service 0 holds global_step: the exactly-once count, as a cluster's
    metrics: dict[str, Any] = {
        "global_step": client.global_step(),
        "examples": examples,
        "examples_processed": result.examples,
        "wall_seconds": wall,
        "examples_per_sec": examples / max(result.wall_seconds, 1e-9),
        "mode": config.mode,
        "replication": "in-process",
        "workers": [asdict(result)],
        "ps": ps_stats,
    }
    if config.checkpoint_dir:  # the ledger on ps service 0, which never restarts here
        ledger = checkpoint_status(client)
        metrics.update(checkpoints_saved=ledger["saved"], checkpoints_failed=ledger["failed"])
        if ledger["failed"]:
            print(f"psflow: {ledger['failed']} checkpoint saves FAILED (see {output_dir}/logs/worker-0.log)",
                  file=sys.stderr, flush=True)
    dynamic = table_totals(ps_stats)
    if dynamic:
        metrics["dynamic_tables"] = dynamic
    eval_batch = load_eval(config)
    if eval_batch is not None:
        metrics["eval"] = evaluate(model, client, eval_batch)
    with open(os.path.join(output_dir, "metrics.json"), "w") as f:
        jsonio.dump(metrics, f, indent=1)
    return metrics
