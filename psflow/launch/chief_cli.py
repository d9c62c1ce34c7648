"""Command-line pieces for chief duties: checkpoint/summary flags and the
``psflow export``, ``psflow predict`` and ``psflow report`` commands.

:mod:`psflow.launch.cli` adds these to its parser; this module only parses
flags into :class:`~psflow.train.config.TrainConfig` fields and runs the tools.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from psflow import jsonio
from psflow.extras import require

__all__ = ["add_chief_arguments", "chief_config_fields", "add_tool_parsers", "run_tool", "TOOL_COMMANDS"]

TOOL_COMMANDS = ("export", "predict", "report")


def add_chief_arguments(p: argparse.ArgumentParser) -> None:
    """Checkpoint, summary and evaluation flags of ``psflow train`` / ``psflow server``."""
    g = p.add_argument_group("chief: checkpoints, summaries, evaluation")
    g.add_argument("--checkpoint-dir", help="restore the newest checkpoint here at start; save checkpoints here")
    g.add_argument("--save-checkpoints-secs", type=float, help="save every N seconds (default 600 unless --save-checkpoints-steps)")
    g.add_argument("--save-checkpoints-steps", type=int, help="save every N global steps")
    g.add_argument("--max-to-keep", type=int, default=5, help="complete checkpoints kept (5)")
    g.add_argument("--max-failed-saves", type=int, default=3, metavar="N",
                   help="fail the run once N checkpoint saves in a row failed (3; 0: never, each is still reported)")
    g.add_argument("--checkpoint-transport", default="local", choices=["local", "rpc"],
                   help="local: each ps task writes its shard (shared filesystem); rpc: shards streamed to the chief")
    g.add_argument("--summary-dir", help="TensorBoard event files (train: default the run directory)")
    g.add_argument("--save-summaries-steps", type=int, default=100, help="summaries every N global steps (100)")
    g.add_argument("--eval-every-steps", type=int, help="the chief evaluates on --eval every N global steps")
    g.add_argument("--eval-moving-averages", action="store_true",
                   help="evaluate with the variables' moving averages (--moving-average-decay) in place of the "
                        "variables: the chief's and the final evaluation, and the evaluator task")
    g.add_argument("--fault-point", help=argparse.SUPPRESS)  # tests: the chief exits at this checkpoint phase
    g.add_argument("--coordination", default="embedded", choices=["embedded", "zookeeper"],
                   help="chief election backend: leases on ps task 0 (embedded) or a ZooKeeper ensemble")
    g.add_argument("--zookeeper", metavar="HOSTS", help="ZooKeeper connection string h1:2181,h2:2181")
    g.add_argument("--lease-ttl", type=float, default=10.0,
                   help="seconds before a dead or stopped chief's duties move to another worker (10)")


def chief_config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields set by :func:`add_chief_arguments`.

    Raises:
        MissingExtraError: ``psflow train --coordination zookeeper`` without kazoo
            (``psflow[zookeeper]``): refused here, before any task process starts.
    """
    if args.coordination == "zookeeper" and args.command == "train":
        require("kazoo", "zookeeper", "--coordination zookeeper")
    return {
        "checkpoint_dir": args.checkpoint_dir,
        "save_checkpoints_secs": args.save_checkpoints_secs,
        "save_checkpoints_steps": args.save_checkpoints_steps,
        "max_to_keep": args.max_to_keep,
        "max_failed_saves": args.max_failed_saves,
        "checkpoint_transport": args.checkpoint_transport,
        "summary_dir": args.summary_dir,
        "save_summaries_steps": args.save_summaries_steps,
        "eval_every_steps": args.eval_every_steps,
        "eval_moving_averages": args.eval_moving_averages,
        "fault_point": args.fault_point,
        "coordination": args.coordination,
        "zookeeper": args.zookeeper,
        "lease_ttl": args.lease_ttl,
    }


def add_tool_parsers(sub: Any) -> None:
    """Adds ``export``, ``predict`` and ``report`` to the CLI's subparsers."""
    export = sub.add_parser("export", help="write a checkpoint's model as safetensors + JSON")
    export.add_argument("checkpoint", metavar="CHECKPOINT_DIR", help="a checkpoint directory (its newest) or one checkpoint")
    export.add_argument("out", metavar="OUT", help="output directory")
    export.add_argument("--moving-averages", action="store_true",
                        help="write the variables' moving averages (--moving-average-decay) in place of the variables")
    predict = sub.add_parser("predict", help="score a data file with an exported model")
    predict.add_argument("model", metavar="MODEL", help="directory written by psflow export")
    predict.add_argument("data", metavar="DATA", nargs="+", help="data file(s)")
    predict.add_argument("--format", choices=["libsvm", "tfrecord", "criteo"],
                         help="input format (default: the one the model was trained on)")
    predict.add_argument("--output", help="write predictions here (default: stdout), one line per example")
    predict.add_argument("--moving-averages", action="store_true",
                         help="score with the variables' moving averages (an export of a run with --moving-average-decay)")
    predict.add_argument("--model", dest="model_class", metavar="package.module:Class",
                         help="your own model's class, as model.json names it: psflow imports a module that "
                              "model.json names only when you name it too (importing runs its code)")
    predict.add_argument("--trust-model-module", action="store_true",
                         help="import whatever module model.json names (only for a model.json you trust)")
    report = sub.add_parser("report", help="PNG plots of loss, eval AUC and throughput from a run's summaries")
    report.add_argument("run_dir", metavar="RUN_DIR")
    report.add_argument("--out", help="output directory (default RUN_DIR/report)")


def run_tool(args: argparse.Namespace) -> int:
    """Runs ``export``/``predict``/``report``; returns the exit status.

    Raises:
        CheckpointError, ReportError, DataError, OSError: reported by the CLI.
    """
    if args.command == "export":
        from psflow.launch.export import export_model

        path = export_model(args.checkpoint, args.out, moving_averages=args.moving_averages)
        print(jsonio.dumps({"exported": path, "out": args.out}))
        return 0
    if args.command == "predict":
        from psflow.launch.export import predict_file

        options: dict[str, Any] = {"format": args.format, "moving_averages": args.moving_averages,
                                   "model": args.model_class, "trust_model_module": args.trust_model_module}
        if args.output:
            with open(args.output, "w") as f:
                predict_file(args.model, list(args.data), out=f, **options)
        else:
            predict_file(args.model, list(args.data), out=sys.stdout, **options)
        return 0
    from psflow.status.report import render_report

    done = render_report(args.run_dir, args.out)
    if done["earlier_runs"]:
        print(f"psflow report: plotting the latest run only, {done['summaries']} ({done['earlier_runs']} earlier "
              f"run(s) beside it are not plotted)", file=sys.stderr)
    for name, why in done["skipped"].items():
        print(f"psflow report: {name}.png not drawn: {why}", file=sys.stderr)
    print(jsonio.dumps(done, indent=1))
    return 0
