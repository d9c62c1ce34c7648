"""The ``psflow`` command line.

``psflow train``   launch a local cluster of real processes and train
``psflow server``  run one task of a cluster that spans machines
``psflow shutdown --cluster FILE``  stop the ps tasks of a cluster started by hand
``psflow convert`` convert LIBSVM / Criteo TSV to TFRecord shards
``psflow schema infer FILE``  print the schema inferred from a TFRecord file (YAML, for --schema)
``psflow export``  write a checkpoint's model as safetensors + JSON
``psflow predict`` score a data file with an exported model
``psflow report``  PNG plots of a run's loss, eval AUC and throughput
``psflow status RUN_DIR_OR_URL``  the live status page's picture of a run, in the terminal
``psflow k8s render``  Kubernetes manifests (Services, StatefulSet, Jobs, a TFJob; or a JobSet) for a cluster (docs/deploying.md)

Settings are parsed here, once, into a :class:`~psflow.train.config.TrainConfig`;
``TF_CONFIG`` is read here and nowhere else; ``PSFLOW_TOKEN`` through
:func:`psflow.launch.token.cluster_token` (here, by ``psflow status`` and by each task process).

Errors a user can fix (a bad flag, input file, record or schema, a port in
use: every :class:`~psflow.errors.PsflowError`, and an ``OSError`` of the
command's own calls; :data:`psflow.launch.console.ONE_LINE_ERRORS`) print one line naming the
flag, file, record or port, and no traceback; a task that fails of one is
reported by that line. ``--verbose`` adds the tracebacks and gRPC's own log
lines, which are otherwise off: :func:`main` sets that before anything imports
``grpc``, so this module imports the modules that import it (the launcher,
the task, the status page, checkpoints) in the functions that use them.

Exit status: 0 done; 1 an error (named; a usage error too); ``128 + n`` after signal n:
``psflow train`` stops every task on SIGTERM, SIGHUP or SIGINT and reports
(143, 129, 130; see :mod:`psflow.launch.lifeline`), but one that arrives after the
run's end was written leaves the run's own status (0 finished, 1 failed:
:mod:`psflow.launch.launcher_signals`, *After the end*), to the process's exit (*To the process's exit*: where
:func:`main` reads the process's own command line); ``psflow server`` stops
its task in order on the same signals.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from psflow.cli.k8s import add_k8s_parser, run_k8s
from psflow.cli.parser import CommandParser
from psflow.cli.server import add_server_arguments, run_server
from psflow.cli.shutdown import add_shutdown_parser, run_shutdown
from psflow.cli.tools import TOOL_COMMANDS, add_tool_parsers, run_tool
from psflow.cli.train import run_train
from psflow.cli.training import add_training_arguments
from psflow.data.infer import add_schema_arguments, run_schema
from psflow.launch.console import ONE_LINE_ERRORS, quiet_grpc, wants_verbose
from psflow.launch.launcher_signals import hold_to_exit
from psflow.launch.lifeline import LaunchInterrupted

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    from psflow.cli.status import add_status_parser
    from psflow.launch.resilience_flags import add_resilience_arguments

    parser = CommandParser(prog="psflow", description="Parameter-server training in Python.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train on a local cluster of real processes")
    add_training_arguments(train)
    add_resilience_arguments(train)
    add_server_arguments(sub.add_parser("server", help="run one task of a cluster (ps tasks serve; workers train)"))
    try:
        from psflow.data.convert import add_convert_arguments
    except ImportError:  # pragma: no cover - convert ships with psflow.data
        pass
    else:
        add_convert_arguments(sub.add_parser("convert", help="convert LIBSVM / Criteo TSV to TFRecord"))
    add_schema_arguments(sub.add_parser("schema", help="TFRecord schemas: psflow schema infer FILE > schema.yaml"))
    add_tool_parsers(sub)
    add_status_parser(sub)
    add_k8s_parser(sub)
    add_shutdown_parser(sub)
    return parser


def _error_status(error: BaseException) -> int:
    """The exit status of a command ended by ``error``: 1, but 3 (``STATE_LOST_EXIT_CODE``) for a
    :class:`~psflow.train.state_loss.StateLostError`, as a task the launcher runs exits: a ``psflow server``
    worker or chief that found a ps task's variables lost, with no checkpoint to restore them (docs/deploying.md),
    which the launcher's restart policy never restarts."""
    from psflow.launch.supervisor import STATE_LOST_EXIT_CODE
    from psflow.train.state_loss import StateLostError

    return STATE_LOST_EXIT_CODE if isinstance(error, StateLostError) else 1


def main(argv: list[str] | None = None) -> int:
    """Runs the CLI; returns the exit status (0 on success).

    First, unless ``--verbose``: gRPC's C-core logs off (``GRPC_VERBOSITY=NONE`` in this process's
    environment, before anything imports ``grpc``, so for the tasks it starts too; a value set wins).
    ``argv`` None (the process's command line: the ``psflow`` script, ``python -m psflow``): ``psflow train``'s run's
    end, once written, holds its exit status to the process's exit (:func:`~psflow.launch.launcher_signals.hold_to_exit`:
    a signal after it is said and leaves the status); a caller passing ``argv`` gets its handlers back on return.
    """
    quiet_grpc(os.environ, verbose=wants_verbose(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    release = hold_to_exit() if args.command == "train" else None
    try:
        return _run(args)
    finally:
        if release is not None and argv is not None:
            release()


def _run(args: argparse.Namespace) -> int:
    """:func:`main` once its arguments are parsed: the command run, its errors reported; the exit status."""
    from psflow.cli.status import run_status

    try:
        if args.command == "train":
            return run_train(args)
        if args.command == "server":
            return run_server(args)
        if args.command in TOOL_COMMANDS:
            return run_tool(args)
        if args.command == "schema":
            return run_schema(args)
        if args.command == "status":
            return run_status(args)
        if args.command == "k8s":
            return run_k8s(args)
        if args.command == "shutdown":
            return run_shutdown(args)
        from psflow.data.convert import run_convert

        return int(run_convert(args))
    except ONE_LINE_ERRORS as e:  # psflow's errors (PsflowError), and the OS's refusals of this command's calls
        if getattr(args, "verbose", False):
            traceback.print_exc()
        print(f"psflow {args.command}: error: {e}", file=sys.stderr)
        return _error_status(e)
    except LaunchInterrupted as e:  # SIGTERM, SIGHUP or SIGINT to psflow train: every task stopped, reported
        print(f"psflow {args.command}: {e}", file=sys.stderr)
        return e.exit_code  # 128 + n; after the run's end was written, that end's (a failed run's 1)
    except KeyboardInterrupt:
        print(f"psflow {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
