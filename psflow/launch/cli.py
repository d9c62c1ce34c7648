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
(143, 129, 130; see :mod:`psflow.launch.lifeline`); ``psflow server`` stops
its task in order on the same signals.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, NoReturn

from psflow import jsonio
from psflow.cluster import ClusterSpec, parse_tf_config
from psflow.data.infer import add_schema_arguments, run_schema, schema_yaml
from psflow.launch.chief_cli import TOOL_COMMANDS, add_chief_arguments, add_tool_parsers, chief_config_fields, run_tool
from psflow.launch.console import ONE_LINE_ERRORS, quiet_grpc, wants_verbose
from psflow.launch.lifeline import LaunchInterrupted
from psflow.launch.tls_flags import add_tls_arguments, tls_config
from psflow.models.api import DYNAMIC_TABLE_PARAM, Model, ModelError
from psflow.models.registry import create_model, model_class, model_names
from psflow.optim import OPTIMIZER_NAMES, OptimizerError, parse_optimizer
from psflow.optim.schedules import SCHEDULE_NAMES, ScheduleError, parse_schedule
from psflow.ps.dynamic import DynamicTableError, share_spec
from psflow.status.progress import final_line
from psflow.status.report import RUN_SUMMARIES
from psflow.train.build import inferred_schema, model_config
from psflow.train.config import ConfigError, TrainConfig
from psflow.train.inputs import check_inputs

if TYPE_CHECKING:  # these import grpc: imported where used, after main() set gRPC's logging (see above)
    from psflow.rpc.tcp_server import TcpLimits

__all__ = ["main", "build_parser"]


def _add_training_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("data")
    g.add_argument("--train", action="append", default=[], metavar="PATH_OR_GLOB", help="training files (repeatable)")
    g.add_argument("--eval", action="append", default=[], metavar="PATH", help="evaluation file(s)")
    g.add_argument("--format", default="libsvm", choices=["libsvm", "tfrecord", "criteo"])
    g.add_argument("--schema", help="TFRecord schema file (JSON/YAML); default: inferred from the first records of the "
                   "first --train file (label/ids/values files: the sparse-LR schema; see psflow schema infer)")
    g.add_argument("--feature", action="append", default=[], metavar="SPEC",
                   help="TFRecord feature, instead of --schema (repeatable): NAME:int64[:VOCAB], NAME:string:BUCKETS, "
                        "NAME:float[:SHAPE][:log1p|signed_log1p], NAME:sparse:IDS_KEY[:VALUES_KEY[:VOCAB]]")
    g.add_argument("--label", default="label",
                   help="with --feature, or when the TFRecord schema is inferred: the label's Example key (label)")
    g.add_argument("--shuffle-buffer", type=int, default=0, help="records in the shuffle buffer (0: no shuffle)")
    g.add_argument("--skip-bad-records", action="store_true", help="skip and count malformed records")
    g.add_argument("--max-bad-records", type=int, default=100,
                   help="with --skip-bad-records: stop once more than N are skipped in an epoch (100)")
    g = p.add_argument_group("model and optimizer")
    g.add_argument("--model", default="logistic", metavar="NAME",
                   help=f"a built-in model ({', '.join(model_names())}) or package.module:Class for your own, imported "
                        "from the directory psflow is started in (logistic)")
    g.add_argument("--model-param", action="append", default=[], metavar="KEY=VALUE",
                   help="a model-specific setting (repeatable); VALUE is read as JSON when it parses, else as a string")
    g.add_argument("--num-features", type=int, default=1 << 20,
                   help="rows of the shared hashed table (logistic, fm) and hash buckets of each hashed feature (2^20)")
    g.add_argument("--embedding-dim", type=int, default=8, help="width of embedding tables (8)")
    g.add_argument("--embedding-table", choices=("static", "dynamic"), default="static",
                   help="static: tables of --num-features rows, ids folded in; dynamic: rows keyed by the raw 64-bit id, "
                        "created on first use, spread over the ps tasks by id (static)")
    g.add_argument("--capacity", type=int, metavar="ROWS", help="dynamic tables: most rows of each table (all ps tasks "
                   "together); beyond it the least frequently (--eviction-policy) used rows are evicted (no limit)")
    g.add_argument("--capacity-bytes", type=int, metavar="BYTES", help="dynamic tables: most bytes of each table's rows, "
                   "optimizer slots, metadata and index (all ps tasks together; no limit)")
    g.add_argument("--admit-after", type=int, metavar="N", help="dynamic tables: an id gets a row once seen in N batches "
                   "(a count-min sketch of 4 MiB per table share); until then it reads zeros and its gradient is dropped (1)")
    g.add_argument("--admit-probability", type=float, metavar="P",
                   help="dynamic tables: admit an unseen id with probability P at each sighting (instead of --admit-after)")
    g.add_argument("--ttl-steps", type=int, metavar="T", help="dynamic tables: drop rows not used for T global steps")
    g.add_argument("--eviction-policy", choices=("lfu", "lru"), default=None,
                   help="dynamic tables: which rows --capacity evicts: least frequently or least recently used (lfu)")
    g.add_argument("--hidden", metavar="N,N,...", help="wide_deep, deepfm, dnn: hidden layer sizes (256,128)")
    g.add_argument("--wide-optimizer", metavar="SPEC", help="wide_deep, deepfm: optimizer of the wide (linear) part, "
                   "NAME[:KEY=VALUE,...] (ftrl, learning rate 0.3; TF's DNNLinearCombinedClassifier: min(0.2, 1/sqrt(columns)))")
    g.add_argument("--deep-optimizer", metavar="SPEC", help="wide_deep, deepfm, dnn: optimizer of the deep part "
                   "(adagrad:learning_rate=0.05,initial_accumulator_value=0.1)")
    g.add_argument("--warm-start", metavar="PATH", help="when the chief initializes (not when it restores), load these "
                   "variables: a .safetensors file, an exported model or a checkpoint (directory)")
    g.add_argument("--optimizer", default="ftrl", type=_optimizer_flag, metavar=f"{{{','.join(OPTIMIZER_NAMES)}}}[:KEY=VALUE,...]",
                   help="applied on the ps tasks, with TF's hyperparameters after a colon, e.g. "
                        "rmsprop:decay=0.9,momentum=0.9,epsilon=1.0 (ftrl)")
    g.add_argument("--learning-rate", type=float, help="default depends on the optimizer")
    g.add_argument("--learning-rate-schedule", type=_schedule_flag, metavar="NAME[:KEY=VALUE,...]",
                   help=f"decay the learning rate with global_step ({', '.join(SCHEDULE_NAMES)}; warmup_steps=N puts a "
                        "linear warm-up in front), e.g. exponential_decay:decay_steps=100,decay_rate=0.96,staircase=true")
    g.add_argument("--moving-average-decay", type=float, metavar="D",
                   help="keep a moving average of every trainable variable on the ps tasks, moved after each step with "
                        "decay min(D, (1+step)/(10+step)) (TensorFlow's ExponentialMovingAverage; e.g. 0.9999); used by "
                        "--eval-moving-averages and psflow export --moving-averages (none)")
    g.add_argument("--l1", type=float, default=0.0, help="FTRL l1 regularization strength")
    g.add_argument("--l2", type=float, default=0.0, help="FTRL l2 regularization strength")
    g.add_argument("--batch-size", type=int, default=512)
    g.add_argument("--epochs", type=int, default=1)
    g.add_argument("--max-steps", type=int, help="stop once global_step reaches N")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("gradients and devices")
    g.add_argument("--clip-gradient-norm", type=float, metavar="N",
                   help="clip each step's gradients, all of them together, to global norm N on the worker before the push "
                        "(TensorFlow's clip_by_global_norm; default: the model's own, none)")
    g.add_argument("--device", default="cpu", help="where each worker's model computes: cpu, cuda or cuda:N (PyTorch models; cpu)")
    g.add_argument("--towers", type=int, default=1, metavar="N",
                   help="replicas of the model in each worker, each on --device: a batch is split over them, their "
                        "gradients summed, pushed once (PyTorch models; 1)")
    g.add_argument("--devices", metavar="D,D,...", help="a tower on each device, e.g. cuda:0,cuda:1 (instead of --device, --towers)")
    g = p.add_argument_group("cluster")
    g.add_argument("--ps", type=int, default=2, help="ps tasks")
    g.add_argument("--workers", type=int, help="worker tasks (2; 1 with --in-process)")
    g.add_argument("--in-process", action="store_true",
                   help="no processes, no RPC: the ps services and one worker in this process (the fast path)")
    g.add_argument("--placement", default="round-robin", choices=["round-robin", "greedy"])
    g.add_argument("--partitions", type=int, default=1, help="partitions of each large table along axis 0 (1)")
    g.add_argument("--replication", default="between-graph", choices=["between-graph", "in-graph"],
                   help="a client per worker, or one client driving every worker")
    g.add_argument("--transport", choices=["grpc", "tcp"],
                   help="carrier of the ps data path: gRPC, or psflow's lean TCP framing (no TLS); "
                        "default: tcp for psflow train (one machine, loopback), grpc for psflow server")
    g.add_argument("--connect-timeout", type=float, default=60.0, help="seconds to wait for other tasks")
    g = p.add_argument_group("update mode")
    g.add_argument("--mode", default="async", choices=["async", "sync", "ssp"],
                   help="async: apply on arrival; sync: aggregate N gradients per step; ssp: bounded staleness")
    g.add_argument("--replicas-to-aggregate", type=int, help="sync: gradients per step (default: every worker; "
                   "fewer makes the rest backups)")
    g.add_argument("--staleness", type=int, default=2, help="ssp: steps a worker may run ahead of the slowest (2)")
    g.add_argument("--sync-timeout", type=float, default=30.0, help="sync/ssp: seconds to wait for a missing worker (30)")
    g.add_argument("--on-timeout", default="fail", choices=["fail", "proceed"],
                   help="when a worker is missing past --sync-timeout: stop naming it, or go on without it")
    g.add_argument("--averaging", default="replicas", choices=["replicas", "per_row", "sparse_sum"],
                   help="sync: divide by N (replicas), per row by its contributors (TF's sparse accumulator), "
                        "or sum sparse rows (what TF's SyncReplicas measured like in the peer benchmark)")
    g.add_argument("--rpc-timeout", type=float, default=60.0, help="deadline of one RPC, seconds")
    g = p.add_argument_group("output")
    g.add_argument("--log-every", type=int, default=100, help="a worker logs step=S when S %% N == 0")
    g.add_argument("--output", help="run directory: logs/, metrics.json (default: a new temp dir)")
    g.add_argument("--quiet", action="store_true", help="no progress bar or lines")
    g.add_argument("--verbose", action="store_true",
                   help="gRPC's own log lines (its defaults, or GRPC_VERBOSITY / GRPC_TRACE as set; otherwise off), "
                        "psflow's DEBUG lines and the tracebacks of expected errors, here and in every task")
    g = p.add_argument_group("status page")
    g.add_argument("--status-host", default="127.0.0.1", metavar="ADDRESS",
                   help="address of the live status page and /metrics (127.0.0.1; any other requires the cluster token)")
    g.add_argument("--status-port", type=int, default=0, metavar="PORT",
                   help="port of the status page (0: a free one, printed at start); psflow server: the chief's")
    g.add_argument("--no-status", action="store_true", help="serve no status page")
    add_chief_arguments(p)


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


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line naming the flag, exit status 1 (as every other error); ``--help`` has the usage."""

    def error(self, message: str) -> NoReturn:
        self.exit(1, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from psflow.cli.k8s import add_k8s_parser
    from psflow.launch.resilience import add_resilience_arguments
    from psflow.launch.shutdown import add_shutdown_parser
    from psflow.launch.status_cli import add_status_parser

    parser = _Parser(prog="psflow", description="Parameter-server training in Python.")
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="train on a local cluster of real processes")
    _add_training_arguments(train)
    add_resilience_arguments(train)
    _add_server_arguments(sub.add_parser("server", help="run one task of a cluster (ps tasks serve; workers train)"))
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


def _add_server_arguments(server: argparse.ArgumentParser) -> None:
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
    _add_server_security_arguments(server)
    _add_training_arguments(server)


class _TrainingArgsParser(_Parser):
    """``psflow server``'s flags, checked for ``psflow k8s render``: an error raises ConfigError (one line)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"the training arguments after --: {message}")


def _k8s(args: argparse.Namespace) -> int:
    """``psflow k8s render``: checks the training arguments as ``psflow server`` will parse them, and their
    settings as ``psflow train`` checks them (:func:`_check_k8s_training`), then renders."""
    from psflow.cli.k8s import run_k8s

    check = _TrainingArgsParser(prog="psflow server", add_help=False)
    _add_server_arguments(check)
    given = check.parse_args(args.train_args)
    for flag in ("cluster", "job", "task", "bind_host"):
        if getattr(given, flag) is not None:
            raise ConfigError(f"the training arguments after --: --{flag.replace('_', '-')}: the manifests set it "
                              "for each task")
    given.command = "server"
    return run_k8s(args, check_training=lambda cluster: _check_k8s_training(given, cluster))


def _check_k8s_training(given: argparse.Namespace, cluster: ClusterSpec) -> None:
    """The training settings of ``psflow k8s render`` checked as ``psflow train`` checks its own, for
    ``cluster``'s tasks: ranges and combinations, the optimizer and schedule, the model's own flags, a
    built-in model's name. Nothing is read: the paths are the pods' (a schema inferred from the first
    training file, ``--schema``, a user's model module in the image), and no device is looked for.

    Raises:
        ConfigError: the first setting refused, after ``the training arguments after --: ``.
    """
    try:
        if not given.train:
            raise ConfigError("--train is required: the chief and the workers train on it (e.g. --train /data/...)")
        trainers = sum(cluster.num_tasks(j) for j in ("chief", "worker") if j in cluster.jobs)
        config = _train_config(given, num_ps=cluster.num_tasks("ps"), num_workers=trainers)
        if ":" not in config.model and config.model not in model_names():
            model_class(config.model)  # refuses the unknown name, naming the known ones (imports nothing)
    except (ConfigError, ModelError, OptimizerError, ScheduleError, DynamicTableError) as e:
        raise ConfigError(f"the training arguments after --: {e}") from None


def _model_params(pairs: list[str]) -> dict[str, Any]:
    params: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--model-param {pair!r}: want KEY=VALUE")
        try:
            params[key] = json.loads(text)
        except ValueError:
            params[key] = text
        if not _finite(params[key]):
            raise ConfigError(f"--model-param {pair!r}: want a finite value (a setting cannot be NaN or infinite)")
    return params


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_finite(v) for v in value)
    return True


def _optimizer_flag(text: str) -> dict[str, Any]:
    """``--optimizer NAME[:KEY=VALUE,...]`` as :func:`parse_optimizer`'s JSON (checked with the rest of the config)."""
    try:
        return parse_optimizer(text)
    except OptimizerError as e:
        name = text.partition(":")[0].strip()
        if name not in OPTIMIZER_NAMES and not text.lstrip().startswith("{"):
            raise argparse.ArgumentTypeError(f"invalid choice: {name!r} (choose from {', '.join(OPTIMIZER_NAMES)})") from None
        raise argparse.ArgumentTypeError(str(e)) from None


def _schedule_flag(text: str) -> dict[str, Any]:
    """``--learning-rate-schedule NAME[:KEY=VALUE,...]`` as :func:`parse_schedule`'s JSON (its parameters are
    checked with the rest of the config, once the optimizer's learning rate is known)."""
    try:
        return parse_schedule(text)
    except ScheduleError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _flag_params(args: argparse.Namespace) -> dict[str, Any]:
    """Model parameters given by their own flags (--hidden, --wide-optimizer, --deep-optimizer, dynamic tables)."""
    params: dict[str, Any] = {}
    dynamic = {key: value for key, value in (
        ("capacity_rows", args.capacity), ("capacity_bytes", args.capacity_bytes), ("admit_after", args.admit_after),
        ("admit_probability", args.admit_probability), ("ttl_steps", args.ttl_steps), ("policy", args.eviction_policy),
    ) if value is not None}
    if args.embedding_table == "dynamic":
        try:
            share_spec("embedding table", 1, dynamic, optimizer=None, initializer={"name": "zeros"}, num_shares=1)
        except DynamicTableError as e:
            flags = {"capacity_rows": "--capacity", "capacity_bytes": "--capacity-bytes", "admit_after": "--admit-after",
                     "admit_probability": "--admit-probability", "ttl_steps": "--ttl-steps", "policy": "--eviction-policy"}
            message = str(e).removeprefix("dynamic table 'embedding table': ")
            for key, flag in flags.items():
                message = message.replace(key, flag)
            raise ConfigError(f"--embedding-table dynamic: {message}") from None
        params[DYNAMIC_TABLE_PARAM] = dynamic
    elif dynamic:
        raise ConfigError(f"{', '.join(sorted(dynamic))}: these options are for dynamic tables; add --embedding-table dynamic")
    if args.hidden is not None:
        try:
            params["hidden"] = [int(h) for h in args.hidden.split(",") if h.strip()]
        except ValueError:
            raise ConfigError(f"--hidden {args.hidden!r}: want layer sizes like 256,128") from None
        if not params["hidden"] or min(params["hidden"]) < 1:
            raise ConfigError(f"--hidden {args.hidden!r}: want layer sizes >= 1, like 256,128")
    for flag, key in (("--wide-optimizer", "wide_optimizer"), ("--deep-optimizer", "deep_optimizer")):
        text = getattr(args, key)
        if text is not None:
            try:
                params[key] = parse_optimizer(text)
            except OptimizerError as e:
                raise ConfigError(f"{flag}: {e}") from e
    return params


def _config(args: argparse.Namespace, *, num_ps: int | None = None, num_workers: int | None = None) -> TrainConfig:
    config = _train_config(args, num_ps=num_ps, num_workers=num_workers)
    # Fail here, before any process starts: an unknown model, a module that does not import, a bad schema,
    # devices the model cannot use.
    model = create_model(config.model, model_config(config), search_path=config.model_path)
    _check_devices(config, model)
    return config


def _train_config(args: argparse.Namespace, *, num_ps: int | None, num_workers: int | None) -> TrainConfig:
    """The settings of the training flags, checked (ranges, combinations, optimizer, schedule, model parameters
    given by their own flags); no file is read and no model built."""
    return TrainConfig(
        train=tuple(args.train), eval=tuple(args.eval), format=args.format, num_features=args.num_features,
        model=args.model, model_path=os.getcwd() if ":" in args.model else None,
        model_params=_model_params(args.model_param) | _flag_params(args), embedding_dim=args.embedding_dim, warm_start=args.warm_start,
        optimizer=args.optimizer["name"], optimizer_params=args.optimizer["hyperparameters"],
        learning_rate=args.learning_rate, learning_rate_schedule=args.learning_rate_schedule, l1=args.l1, l2=args.l2,
        moving_average_decay=args.moving_average_decay,
        batch_size=args.batch_size, epochs=args.epochs, max_steps=args.max_steps, seed=args.seed,
        num_ps=num_ps if num_ps is not None else args.ps,
        num_workers=num_workers if num_workers is not None else (
            args.workers if args.workers is not None else (1 if args.in_process else 2)),
        placement=args.placement, partitions=args.partitions, log_every=args.log_every,
        shuffle_buffer=args.shuffle_buffer, skip_bad_records=args.skip_bad_records, schema=args.schema,
        features=tuple(args.feature), label=args.label,
        max_bad_records=args.max_bad_records,
        connect_timeout=args.connect_timeout, rpc_timeout=args.rpc_timeout,
        mode=args.mode, replicas_to_aggregate=args.replicas_to_aggregate, staleness=args.staleness,
        sync_timeout=args.sync_timeout, on_timeout=args.on_timeout, averaging=args.averaging,
        replication=args.replication,
        transport=args.transport or ("tcp" if args.command == "train" else "grpc"),
        clip_gradient_norm=args.clip_gradient_norm, device=args.device, towers=args.towers,
        devices=tuple(d.strip() for d in (args.devices or "").split(",") if d.strip()),
        **chief_config_fields(args),
    )


def _check_devices(config: TrainConfig, model: Model) -> None:
    """``--device``, ``--towers``, ``--devices`` against the model and what PyTorch sees: one line naming the flag."""
    devices = config.compute_devices()
    if devices == ("cpu",):
        return
    if config.devices:
        flag = f"--devices {','.join(config.devices)}"
    else:
        flag = " ".join(f for f in (f"--device {config.device}" if config.device != "cpu" else "",
                                    f"--towers {config.towers}" if config.towers != 1 else "") if f)
    try:
        model.place(devices)  # cheap: a PyTorch model checks the devices and builds its towers when it first steps
    except ModelError as e:
        raise ConfigError(f"{flag}: {e}") from None


def _train(args: argparse.Namespace) -> int:
    from psflow.checkpoint.lock import RunDirLock, new_run_id
    from psflow.launch.local import run_local
    from psflow.launch.resilience import resilience_config
    from psflow.launch.status_cli import status_config
    from psflow.launch.task import configure_logging

    if not args.train:
        raise ConfigError("--train is required")
    if args.verbose:
        configure_logging(verbose=True)
    config = _config(args)
    status = status_config(args)  # before anything is written: a PSFLOW_TOKEN of only whitespace is refused
    output = args.output or tempfile.mkdtemp(prefix=f"psflow-{time.strftime('%Y%m%d-%H%M%S')}-")
    # One run per run directory, taken before anything is written there: another live run's is refused, naming it
    # (psflow.checkpoint.lock.RunDirLock). The launcher finds it held by this process and leaves it to this.
    run = config.run_id or new_run_id()
    config = dataclasses.replace(config, run_id=run)
    if config.summary_dir is None:  # the chief's TensorBoard summaries: a fresh directory per run (psflow report)
        config = dataclasses.replace(config, summary_dir=os.path.abspath(os.path.join(output, RUN_SUMMARIES, run)))
    with RunDirLock(output, run):
        _show_inferred_schema(config, output)
        if args.in_process:
            print(f"psflow: in-process, {config.num_ps} ps services + 1 worker, run directory {output}", file=sys.stderr)
            metrics = _in_process(config, output)
            if not args.quiet:
                print(final_line(metrics), file=sys.stderr, flush=True)
        else:
            # The status URL is the run's first line, then "N ps + M workers, run directory ..." (LauncherStatus).
            metrics = run_local(config, output, progress=None if args.quiet else sys.stderr,
                                resilience=resilience_config(args), status=status, verbose=args.verbose)
    summary = {k: metrics[k] for k in ("global_step", "examples", "examples_this_run", "wall_seconds",
                                       "examples_per_sec")}
    if metrics.get("bad_records_skipped"):
        summary["bad_records_skipped"] = metrics["bad_records_skipped"]
        print(f"psflow: skipped {metrics['bad_records_skipped']} bad records (see the worker logs)", file=sys.stderr)
    for name, table in (metrics.get("dynamic_tables") or {}).items():
        print(f"psflow: dynamic table {name!r}: {table.get('rows', 0):,} rows ({table.get('memory_bytes', 0) / 2**20:.1f} MiB), "
              f"{table.get('admitted', 0):,} admitted, {table.get('rejected_lookups', 0):,} lookups of ids not admitted "
              f"(read as zeros), {table.get('dropped_gradients', 0):,} gradients dropped, "
              f"{table.get('evicted_capacity', 0):,} evicted by capacity, {table.get('evicted_ttl', 0):,} by ttl",
              file=sys.stderr)
    if "eval" in metrics:
        summary["eval"] = metrics["eval"]
    print(jsonio.dumps(summary, indent=1))
    return 0


def _in_process(config: TrainConfig, output: str) -> dict[str, Any]:
    """``--in-process``: the run, its end written as a cluster run's (metrics.json, status.json, metrics.prom from
    one final snapshot), SIGTERM, SIGHUP and SIGINT included (they end it as :class:`LaunchInterrupted`)."""
    from psflow.launch.in_process import run_in_process
    from psflow.launch.lifeline import LauncherSignals, signal_name
    from psflow.launch.run_status import METRICS_JSON, InProcessEnding

    ending = InProcessEnding(config, output, sys.stderr)
    signals = LauncherSignals()
    signals.install()  # main thread only (else a no-op)
    try:
        return run_in_process(config, output, on_end=ending)
    except LaunchInterrupted as e:
        final = ending.final or {}
        e.report = (f"interrupted by {signal_name(e.signum)} at global_step {final.get('global_step')} after "
                    f"{float(final.get('wall_seconds') or 0.0):.1f} s\nmetrics: {os.path.join(output, METRICS_JSON)}")
        raise
    finally:
        signals.restore()


def _show_inferred_schema(config: TrainConfig, output: str) -> None:
    """Without --schema or --feature: prints the TFRecord schema inferred and writes it to the run directory."""
    inferred = inferred_schema(config)  # cached: _config inferred it already
    if inferred is None or inferred.is_default:
        return
    os.makedirs(output, exist_ok=True)
    path = os.path.join(output, "schema.inferred.yaml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(schema_yaml(inferred))
    print("psflow: " + inferred.describe(), file=sys.stderr)
    print(f"psflow: no --schema given; the schema above is in {path}: edit it and pass --schema to change it",
          file=sys.stderr)


def _tcp_limits(args: argparse.Namespace) -> TcpLimits:
    from psflow.rpc.tcp_server import TcpLimits

    flags = {"handshake_timeout": "--tcp-handshake-timeout", "idle_timeout": "--tcp-idle-timeout",
             "max_connections": "--tcp-max-connections"}
    try:
        return TcpLimits(**{field: getattr(args, f"tcp_{field}") for field in flags})
    except ValueError as e:
        field = next((f for f in flags if f"TcpLimits.{f} " in str(e)), "")
        raise ConfigError(f"{flags.get(field, '--tcp-*')}: {e}") from None


def _server(args: argparse.Namespace) -> int:
    from psflow.deploy.config import TASK_INDEX_ENV, task_index_from_env
    from psflow.launch.run_status import chief_status_page
    from psflow.launch.status_cli import status_config
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
    config = None
    if job != "ps":
        if not args.train:
            raise ConfigError(f"/job:{job}/task:{index} trains: --train is required")
        trainers = sum(cluster.num_tasks(j) for j in ("chief", "worker") if j in cluster.jobs)  # a chief trains too
        config = _config(args, num_ps=cluster.num_tasks("ps"), num_workers=trainers)
        if job == "client" or config.replication == "between-graph":  # this task reads the data
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
                        stop_when_run_over=job == "ps" and not args.keep_serving)
    finally:
        if page is not None:
            page.close()


def _shutdown(args: argparse.Namespace) -> int:
    """``psflow shutdown``: the cluster (``--cluster``, else ``TF_CONFIG``) and the token read here (:mod:`psflow.launch.shutdown`)."""
    from psflow.launch.shutdown import print_outcomes, shutdown_cluster
    from psflow.launch.token import TOKEN_ENV, cluster_token

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


def _evaluator(args: argparse.Namespace, cluster: ClusterSpec, index: int) -> int:
    """``psflow server`` as TensorFlow's evaluator task (:mod:`psflow.launch.evaluator`)."""
    from psflow.launch.evaluator import run_evaluator
    from psflow.launch.lifeline import StopRequest
    from psflow.launch.task import configure_logging

    trainers = sum(cluster.num_tasks(j) for j in ("chief", "worker") if j in cluster.jobs)
    config = _config(args, num_ps=cluster.num_tasks("ps"), num_workers=max(trainers, 1))
    configure_logging(verbose=args.verbose)  # run_evaluator reads --eval first: a bad file is one clear line
    stop = StopRequest(f"/job:evaluator/task:{index}")
    stop.install_handlers()
    stop.start()
    stopped = threading.Event()
    stop.on_stop(stopped.set)
    run_evaluator(config, poll_secs=args.eval_poll_secs, stop=stopped)
    return stop.exit_code if stop.requested() is not None else 0


def main(argv: list[str] | None = None) -> int:
    """Runs the CLI; returns the exit status (0 on success).

    First, unless ``--verbose``: gRPC's C-core logs off (``GRPC_VERBOSITY=NONE`` in this process's
    environment, before anything imports ``grpc``, so for the tasks it starts too; a value set wins).
    """
    quiet_grpc(os.environ, verbose=wants_verbose(sys.argv[1:] if argv is None else argv))
    args = build_parser().parse_args(argv)
    from psflow.launch.status_cli import run_status

    try:
        if args.command == "train":
            return _train(args)
        if args.command == "server":
            return _server(args)
        if args.command in TOOL_COMMANDS:
            return run_tool(args)
        if args.command == "schema":
            return run_schema(args)
        if args.command == "status":
            return run_status(args)
        if args.command == "k8s":
            return _k8s(args)
        if args.command == "shutdown":
            return _shutdown(args)
        from psflow.data.convert import run_convert

        return int(run_convert(args))
    except ONE_LINE_ERRORS as e:  # psflow's errors (PsflowError), and the OS's refusals of this command's calls
        if getattr(args, "verbose", False):
            traceback.print_exc()
        print(f"psflow {args.command}: error: {e}", file=sys.stderr)
        return 1
    except LaunchInterrupted as e:  # SIGTERM, SIGHUP or SIGINT to psflow train: every task stopped, reported
        print(f"psflow {args.command}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print(f"psflow {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
