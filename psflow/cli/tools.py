"""The tools that read what a run left behind: ``psflow export`` and ``psflow predict`` (:mod:`psflow.export`)
and ``psflow report`` (:mod:`psflow.status.report`): their flags and their runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from psflow import jsonio

__all__ = ["add_tool_parsers", "run_tool", "TOOL_COMMANDS"]

TOOL_COMMANDS = ("export", "predict", "report")


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
    predict.add_argument("--output", help="write predictions here (default: stdout), one line per example; written whole "
                              "once all are made: an error leaves no file, or the earlier one as it was")
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


def _predict_to_file(output: str, model: str, data: list[str], options: dict[str, Any]) -> None:
    """``predict --output FILE``: the predictions are written whole, once they are all made
    (storage.write_atomically): a refusal (a bad model, record or file) leaves no FILE and an earlier FILE as it
    was (before, FILE was opened first: a refusal left it empty). FILE may be an object-store URL."""
    import io

    from psflow import storage
    from psflow.export import predict_file

    try:
        storage.check_location(output)  # an unknown scheme or a missing client: before the model is read
    except storage.StorageError as e:
        raise storage.StorageError(f"--output {e}") from None
    text = io.StringIO()
    predict_file(model, data, out=text, **options)
    storage.write_atomically(output, text.getvalue().encode())


def run_tool(args: argparse.Namespace) -> int:
    """Runs ``export``/``predict``/``report``; returns the exit status.

    Raises:
        CheckpointError, ReportError, DataError, OSError: reported by the CLI.
    """
    if args.command == "export":
        from psflow.export import export_model

        path = export_model(args.checkpoint, args.out, moving_averages=args.moving_averages)
        print(jsonio.dumps({"exported": path, "out": args.out}))
        return 0
    if args.command == "predict":
        from psflow.export import predict_file

        options: dict[str, Any] = {"format": args.format, "moving_averages": args.moving_averages,
                                   "model": args.model_class, "trust_model_module": args.trust_model_module}
        if args.output:
            _predict_to_file(args.output, args.model, list(args.data), options)
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
