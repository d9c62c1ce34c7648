"""``psflow train``'s ``failures`` flags (restart policy, hang detection, ``--chaos``, ``--ps-replicas``) and the
:class:`~psflow.launch.resilience.ResilienceConfig` they build, each flag checked (a bad one is a
:class:`~psflow.train.config.ConfigError` naming it) before anything starts."""

from __future__ import annotations

import argparse

from psflow.launch.chaos_plan import ChaosError, ChaosPlan
from psflow.launch.health import HealthConfig
from psflow.launch.resilience import ResilienceConfig
from psflow.launch.supervisor import RESTART_POLICIES, RestartConfig
from psflow.train.config import ConfigError

__all__ = ["add_resilience_arguments", "resilience_config"]


def add_resilience_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the ``failures`` flags of ``psflow train``."""
    g = parser.add_argument_group("failures")
    g.add_argument("--restart-policy", default="never", choices=list(RESTART_POLICIES[:2]),
                   help="restart a task that dies (on-failure; without --checkpoint-dir, checkpoints then go to "
                        "OUTPUT/checkpoints, so a dead ps task is restored) or stop the run naming it (never, default; "
                        "with --ps-replicas a dead shard member is not restarted and the run goes on while its shard "
                        "has a member running)")
    g.add_argument("--max-restarts", type=int, default=3, help="restarts allowed per task (3)")
    g.add_argument("--liveness-timeout", type=float, default=30.0,
                   help="seconds without an answer to a 1 s ping before a task is killed as hung (30; 0: off)")
    g.add_argument("--chaos", action="append", default=[], metavar="SPEC",
                   help="inject a fault: kill:JOB:INDEX@step=N, kill:chief@step=N, stop:JOB:INDEX@step=N (repeatable; "
                        "an in-graph run's client is client:0, and its chief; with --ps-replicas, ps:N is shard N's "
                        "current primary and ps-backup:N one of its backups; a stop holds its task until --liveness-timeout "
                        "kills it: no duration; not with --in-process)")
    g.add_argument("--ps-replicas", type=int, default=0, metavar="N",
                   help="backup tasks of every ps shard (0, default: none): a push is acknowledged once every backup "
                        "has it, and a dead primary's backup takes over with nothing lost (docs/replication.md)")


def resilience_config(args: argparse.Namespace) -> ResilienceConfig:
    """Builds the config from parsed flags.

    Raises:
        ConfigError: a flag is out of range or a --chaos spec is malformed (names it).
    """
    try:
        chaos = ChaosPlan.parse(args.chaos)
        health = HealthConfig(unresponsive_after=args.liveness_timeout) if args.liveness_timeout > 0 else None
        restart = RestartConfig(args.restart_policy, max_restarts=args.max_restarts)
    except (ChaosError, ValueError) as e:
        raise ConfigError(str(e)) from e
    return ResilienceConfig(restart, health, chaos, ps_replicas=getattr(args, "ps_replicas", 0))
