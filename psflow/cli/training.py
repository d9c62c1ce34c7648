"""The training flags (``psflow train``, ``psflow server``), read into a checked
:class:`~psflow.train.config.TrainConfig`: data, model, optimizer and schedule, cluster and sync settings,
devices, and the chief's checkpoint, summary, evaluation and election flags.

:func:`train_config` checks the settings (ranges, combinations, the optimizer and schedule, model
parameters given by their own flags) and reads nothing; :func:`config_from_args` also builds the model
once, so that an unknown model, a module that does not import, a bad schema or devices the model cannot
use fail before any process starts. A bad flag is a :class:`~psflow.errors.ConfigError` naming it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
from typing import Any

from psflow.extras import require
from psflow.models.api import DYNAMIC_TABLE_FLAGS, DYNAMIC_TABLE_PARAM, Model, ModelError
from psflow.models.registry import create_model, model_names
from psflow.optim import OPTIMIZER_NAMES, OptimizerError, parse_optimizer
from psflow.optim.schedules import SCHEDULE_NAMES, ScheduleError, parse_schedule
from psflow.ps.dynamic import OPTIONS, DynamicTableError, share_spec
from psflow.train.build import model_config
from psflow.train.config import (
    MAX_STEPS_IN_FLIGHT,
    MODE_FLAGS,
    CheckpointSettings,
    ChiefSettings,
    ClusterSettings,
    ComputeSettings,
    ConfigError,
    DataSettings,
    ModelSettings,
    OptimizerSettings,
    ReportSettings,
    SyncSettings,
    TrainConfig,
    in_graph_timeout_refusal,
    other_mode_refusal,
)
from psflow.train.faults import FaultInjection

__all__ = ["add_training_arguments", "add_chief_arguments", "config_from_args", "faults_from_args",
           "train_config"]


def add_training_arguments(p: argparse.ArgumentParser) -> None:
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
    # default None: typed static is refused beside --model-param dynamic_table (_flag_params), which makes tables dynamic
    g.add_argument("--embedding-table", choices=("static", "dynamic"),
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
    g.add_argument("--ps-failover-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="(--ps-replicas) seconds a replicated shard's primary may answer nothing before a worker "
                        "promotes its backup (10); a primary whose process is gone (connection refused) or that "
                        "says it is not primary is replaced at once, a slow one never")
    g = p.add_argument_group("update mode")
    g.add_argument("--mode", default="async", choices=["async", "sync", "ssp"],
                   help="async: apply on arrival; sync: aggregate N gradients per step; ssp: bounded staleness "
                        "(the flags below marked for one mode are refused in another)")
    # The flags of one mode (MODE_FLAGS: --replicas-to-aggregate, --staleness, --sync-timeout, --on-timeout,
    # --averaging) default to None so that another mode refuses them given at all, even at their default values
    # (train_config), as in-graph replication refuses --sync-timeout and --on-timeout: SyncSettings holds the defaults.
    g.add_argument("--replicas-to-aggregate", type=int, help="sync: gradients per step (default: every worker; "
                   "fewer makes the rest backups)")
    g.add_argument("--staleness", type=int, help="ssp: steps a worker may run ahead of the slowest (2)")
    g.add_argument("--steps-in-flight", type=int, default=1, metavar="K",  # 1 .. MAX_STEPS_IN_FLIGHT: checked by SyncSettings
                   help="async/ssp: 2 computes a worker's next step while its push travels (the step's gradient "
                        "then lacks the worker's own previous update); 3 to 8 (async, gRPC) keep K-1 pushes in "
                        "flight, for ps tasks a long round trip away (a gradient lacks the worker's own K-1 latest "
                        f"updates; at most {MAX_STEPS_IN_FLIGHT}); 1 waits for each push first (the default). Not with "
                        "--mode sync or --ps-replicas")
    g.add_argument("--sync-timeout", type=float, help="sync/ssp: seconds to wait for a missing worker (30); "
                   "between-graph only")
    g.add_argument("--on-timeout", choices=["fail", "proceed"],
                   help="when a worker is missing past --sync-timeout: stop naming it (fail, the default), or go on "
                        "without it (proceed); between-graph only")
    g.add_argument("--averaging", choices=["replicas", "per_row", "sparse_sum"],
                   help="sync: divide by N (replicas, the default), per row by its contributors (TF's sparse "
                        "accumulator), or sum sparse rows (what TF's SyncReplicas measured like in the peer benchmark)")
    g.add_argument("--rpc-timeout", type=float, default=60.0, help="deadline of one RPC, seconds (60)")
    g.add_argument("--save-timeout", type=float, default=600.0, metavar="SECONDS",
                   help="deadline of a ps task's checkpoint shard save or load, which takes as long as its shard is "
                        "big, and the other workers' wait for the chief's restore or initial checkpoint (600); a ps "
                        "task that dies fails the save at once, one that hangs after this long")
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


def add_chief_arguments(p: argparse.ArgumentParser) -> None:
    """Checkpoint, summary and evaluation flags of ``psflow train`` / ``psflow server``."""
    g = p.add_argument_group("chief: checkpoints, summaries, evaluation")
    g.add_argument("--checkpoint-dir", help="restore the newest checkpoint here at start; save checkpoints here")
    g.add_argument("--save-checkpoints-secs", type=float, help="save every N seconds (default 600 unless --save-checkpoints-steps)")
    g.add_argument("--save-checkpoints-steps", type=int, help="save every N global steps")
    g.add_argument("--max-to-keep", type=int, default=5, help="complete checkpoints kept (5)")
    g.add_argument("--full-checkpoint-every", type=int, default=10, metavar="K",
                   help="every K-th save is full, the others hold only the rows changed since the previous one "
                        "(10; 1: every save full)")
    g.add_argument("--max-failed-saves", type=int, default=3, metavar="N",
                   help="fail the run once N checkpoint saves in a row failed, or the final one "
                        "failed (3; 0: never, each is still reported)")
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


def _dynamic_refusal(message: str, typed: bool, flagged: set[str]) -> str:
    """share_spec's refusal of the run's dynamic table options, each named where the user gave it: ``flagged`` by
    its flag, the others in ``--model-param dynamic_table`` (the line's head when ``--embedding-table dynamic`` was
    not ``typed``); the known options of an unknown one's line by the names --model-param takes."""
    message = message.removeprefix("dynamic table 'embedding table': ")
    head, known, tail = message.partition(" (known: ")
    for key in DYNAMIC_TABLE_FLAGS.keys() | set(OPTIONS):
        if key in flagged:
            head = re.sub(rf"\b{key}\b", DYNAMIC_TABLE_FLAGS[key], head)
        elif typed:
            head = re.sub(rf"\b{key}\b", f"--model-param {DYNAMIC_TABLE_PARAM}'s {key}", head)
    where = "--embedding-table dynamic" if typed else f"--model-param {DYNAMIC_TABLE_PARAM}"
    return f"{where}: {head}{known}{tail}"


def _flag_params(args: argparse.Namespace, model_param: object) -> dict[str, Any]:
    """Model parameters given by their own flags (--hidden, --wide-optimizer, --deep-optimizer, dynamic tables).

    A dynamic table's flags are merged into the options ``--model-param dynamic_table={...}`` gave (``model_param``,
    the only way to set those without a flag), which also make the table dynamic; an option given both ways is
    refused.
    """
    params: dict[str, Any] = {}
    given = {flag: getattr(args, flag.removeprefix("--").replace("-", "_")) for flag in DYNAMIC_TABLE_FLAGS.values()}
    dynamic = {key: given[flag] for key, flag in DYNAMIC_TABLE_FLAGS.items() if given[flag] is not None}
    flagged = set(dynamic)
    base = model_param if isinstance(model_param, dict) else None
    if args.embedding_table == "static" and base is not None:
        raise ConfigError(f"--embedding-table static and --model-param {DYNAMIC_TABLE_PARAM} (which makes the tables "
                          "dynamic): give one")
    if args.embedding_table == "dynamic" or base is not None:  # checked here, without flags too (psflow k8s render)
        base = base or {}
        both = [key for key in dynamic if key in base]  # in the flags' order: the same line on every run
        if both:
            raise ConfigError(f"{DYNAMIC_TABLE_FLAGS[both[0]]} {dynamic[both[0]]} and --model-param "
                              f"{DYNAMIC_TABLE_PARAM}'s {both[0]} {base[both[0]]}: give it once")
        dynamic = {**base, **dynamic}
        try:
            share_spec("embedding table", 1, dynamic, optimizer=None, initializer={"name": "zeros"}, num_shares=1)
        except DynamicTableError as e:
            raise ConfigError(_dynamic_refusal(str(e), args.embedding_table == "dynamic", flagged)) from None
        params[DYNAMIC_TABLE_PARAM] = dynamic
    elif dynamic:
        flags = ", ".join(f"{flag} {value}" for flag, value in given.items() if value is not None)
        raise ConfigError(f"{flags}: these options are for dynamic tables; add --embedding-table dynamic")
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


def faults_from_args(args: argparse.Namespace) -> FaultInjection:
    """The faults a test asks for with the hidden ``--fault-point PHASE`` (the chief exits at that checkpoint
    phase); none without it. Not a setting of the run: :mod:`psflow.train.faults`."""
    return FaultInjection(checkpoint_exit=args.fault_point or None)


def config_from_args(args: argparse.Namespace, *, num_ps: int | None = None, num_workers: int | None = None) -> TrainConfig:
    config = train_config(args, num_ps=num_ps, num_workers=num_workers)
    # Fail here, before any process starts: an unknown model, a module that does not import, a bad schema,
    # devices the model cannot use.
    model = create_model(config.model.name, model_config(config), search_path=config.model.path)
    _check_devices(config, model)
    return config


def train_config(args: argparse.Namespace, *, num_ps: int | None, num_workers: int | None) -> TrainConfig:
    """The settings of the training flags, checked (ranges, combinations, optimizer, schedule, model parameters
    given by their own flags); no file is read and no model built.

    Raises:
        MissingExtraError: ``psflow train --coordination zookeeper`` without kazoo
            (``psflow[zookeeper]``): refused here, before any task process starts.
    """
    model_params = _model_params(args.model_param)
    model_params |= _flag_params(args, model_params.get(DYNAMIC_TABLE_PARAM))
    if args.coordination == "zookeeper" and args.command == "train":
        require("kazoo", "zookeeper", "--coordination zookeeper")
    _check_mode_flags(args)
    defaults = SyncSettings()
    return TrainConfig(
        data=DataSettings(
            train=tuple(args.train), eval=tuple(args.eval), format=args.format, num_features=args.num_features,
            schema=args.schema, features=tuple(args.feature), label=args.label, batch_size=args.batch_size,
            epochs=args.epochs, max_steps=args.max_steps, seed=args.seed, shuffle_buffer=args.shuffle_buffer,
            skip_bad_records=args.skip_bad_records, max_bad_records=args.max_bad_records),
        model=ModelSettings(
            name=args.model, path=os.getcwd() if ":" in args.model else None,
            params=model_params, embedding_dim=args.embedding_dim,
            warm_start=args.warm_start),
        optimizer=OptimizerSettings(
            name=args.optimizer["name"], params=args.optimizer["hyperparameters"], learning_rate=args.learning_rate,
            schedule=args.learning_rate_schedule, l1=args.l1, l2=args.l2,
            moving_average_decay=args.moving_average_decay, clip_gradient_norm=args.clip_gradient_norm),
        cluster=ClusterSettings(
            num_ps=num_ps if num_ps is not None else args.ps,
            num_workers=num_workers if num_workers is not None else (
                args.workers if args.workers is not None else (1 if args.in_process else 2)),
            placement=args.placement, partitions=args.partitions,
            transport=args.transport or ("tcp" if args.command == "train" else "grpc"),
            connect_timeout=args.connect_timeout, rpc_timeout=args.rpc_timeout, save_timeout=args.save_timeout,
            ps_failover_timeout=args.ps_failover_timeout),
        sync=SyncSettings(
            mode=args.mode, replicas_to_aggregate=args.replicas_to_aggregate,
            staleness=defaults.staleness if args.staleness is None else args.staleness,
            timeout=defaults.timeout if args.sync_timeout is None else args.sync_timeout,
            on_timeout=args.on_timeout or defaults.on_timeout, averaging=args.averaging or defaults.averaging,
            replication=args.replication, steps_in_flight=args.steps_in_flight),
        checkpoint=CheckpointSettings(
            dir=args.checkpoint_dir, save_secs=args.save_checkpoints_secs, save_steps=args.save_checkpoints_steps,
            max_to_keep=args.max_to_keep, max_failed_saves=args.max_failed_saves,
            transport=args.checkpoint_transport, full_every=args.full_checkpoint_every),
        report=ReportSettings(
            log_every=args.log_every, summary_dir=args.summary_dir, save_summaries_steps=args.save_summaries_steps,
            eval_every_steps=args.eval_every_steps, eval_moving_averages=args.eval_moving_averages),
        chief=ChiefSettings(coordination=args.coordination, zookeeper=args.zookeeper, lease_ttl=args.lease_ttl),
        compute=ComputeSettings(
            device=args.device, towers=args.towers,
            devices=tuple(d.strip() for d in (args.devices or "").split(",") if d.strip())),
    )


def _check_mode_flags(args: argparse.Namespace) -> None:
    """A sync flag the run would not read, given at all (even at its default value: the config cannot tell), is
    refused naming it: with --replication in-graph, --sync-timeout and --on-timeout; then each flag of another
    --mode (MODE_FLAGS)."""
    if args.replication == "in-graph":
        for flag, value in (("--sync-timeout", args.sync_timeout), ("--on-timeout", args.on_timeout)):
            if value is not None:
                raise ConfigError(in_graph_timeout_refusal(flag, value))
    for flag in MODE_FLAGS:
        value = getattr(args, flag.removeprefix("--").replace("-", "_"))
        refusal = other_mode_refusal(flag, value, args.mode) if value is not None else None
        if refusal:
            raise ConfigError(refusal)


def _check_devices(config: TrainConfig, model: Model) -> None:
    """``--device``, ``--towers``, ``--devices`` against the model and what PyTorch sees: one line naming the flag."""
    devices = config.compute_devices()
    if devices == ("cpu",):
        return
    if config.compute.devices:
        flag = f"--devices {','.join(config.compute.devices)}"
    else:
        flag = " ".join(f for f in (f"--device {config.compute.device}" if config.compute.device != "cpu" else "",
                                    f"--towers {config.compute.towers}" if config.compute.towers != 1 else "") if f)
    try:
        model.place(devices)  # cheap: a PyTorch model checks the devices and builds its towers when it first steps
    except ModelError as e:
        raise ConfigError(f"{flag}: {e}") from None
