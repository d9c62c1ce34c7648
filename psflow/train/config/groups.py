"""The setting groups of a run, one frozen dataclass per concern, each checking its own fields.

:class:`~psflow.train.config.TrainConfig` holds one of each and checks the rules that span groups. A check
that fails raises :class:`~psflow.errors.ConfigError` naming the command-line flag, as the flat config did.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from psflow.errors import ConfigError
from psflow.optim import OptimizerError, OptimizerSpec
from psflow.optim.schedules import ScheduleError, ScheduleSpec, schedule_parameters
from psflow.ps.optimizers import make_optimizer
from psflow.ps.sync import AVERAGINGS, MODES

__all__ = ["DataSettings", "ModelSettings", "OptimizerSettings", "ClusterSettings", "SyncSettings",
           "CheckpointSettings", "ReportSettings", "ChiefSettings", "ComputeSettings",
           "DEFAULT_LEARNING_RATES", "MAX_STEPS_IN_FLIGHT", "MAX_SEED"]

#: Per-optimizer default learning rates for sparse logistic regression on
#: one-hot features. Measured on a9a (2 ps + 2 workers, 3 epochs, eval AUC):
#: ftrl 0.1 -> 0.8955, 0.5 -> 0.9021; adagrad 0.1 -> 0.8956, 0.5 -> 0.9021;
#: sgd 0.5 -> 0.8996, 2.0 -> 0.9014; adam 0.01 -> 0.9012; momentum 0.1 -> 0.9016;
#: rmsprop (TF1's defaults otherwise) 0.001 -> 0.8764, 0.01 -> 0.9017, 0.05 -> 0.9015, 0.1 -> 0.9001.
#: The per-coordinate methods (FTRL, Adagrad) tolerate large steps.
DEFAULT_LEARNING_RATES = {"sgd": 2.0, "momentum": 0.1, "adagrad": 0.5, "adam": 0.01, "ftrl": 0.5, "rmsprop": 0.01}

#: A device a worker's model may compute on (--device, --devices).
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")

#: The largest --seed: seeds are int64 as TensorFlow's (the data shuffle, initializers and PyTorch take any of them).
MAX_SEED = 2**63 - 1


def _check(checks: list[tuple[bool, str]]) -> None:
    """Raises ConfigError with the message of the first failed check."""
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


@dataclass(frozen=True)
class DataSettings:
    """The input: files, their format and schema, batching, epochs and the shuffle."""

    train: tuple[str, ...] = ()
    eval: tuple[str, ...] = ()
    format: str = "libsvm"
    num_features: int = 1 << 20          # rows of a shared hashed table; the id space of each hashed feature
    schema: str | None = None            # tfrecord schema file (none, no --feature: inferred from the first train file)
    features: tuple[str, ...] = ()       # tfrecord schema from flags: --feature NAME:KIND[:...] (instead of --schema)
    label: str = "label"                 # with --feature, or when the schema is inferred: the label's Example key
    batch_size: int = 512
    epochs: int | None = 1               # None: until --max-steps
    max_steps: int | None = None         # stop once global_step reaches this
    seed: int = 0
    shuffle_buffer: int = 0
    skip_bad_records: bool = False
    max_bad_records: int = 100           # with skip_bad_records: stop once more are skipped (per epoch)
    reader_process: bool = False         # parse input in a forked child process (shared memory); --in-process only, which turns it on

    def __post_init__(self) -> None:
        _check([
            (self.num_features >= 1, f"--num-features must be >= 1, got {self.num_features}"),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (0 <= self.seed <= MAX_SEED, f"--seed must be in [0, 2**63 - 1], got {self.seed}"),
            (self.epochs is None or self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}"),
            (self.max_steps is None or self.max_steps >= 1, f"--max-steps must be >= 1, got {self.max_steps}"),
            (self.epochs is not None or self.max_steps is not None, "unbounded epochs need --max-steps"),
            (not (self.schema and self.features), "give --schema FILE or --feature flags, not both"),
            (self.format == "tfrecord" or not (self.schema or self.features),
             f"--schema and --feature describe TFRecord data; --format is {self.format!r}"),
        ])


@dataclass(frozen=True)
class ModelSettings:
    """The model: its name, where to import it from, its parameters and the values it starts from."""

    name: str = "logistic"               # a registered name (psflow.models.registry) or package.module:Class
    path: str | None = None              # directory put first on sys.path to import a user's model (the launch dir)
    params: dict[str, Any] = field(default_factory=dict)  # model-specific settings (--model-param KEY=VALUE)
    embedding_dim: int = 8               # width of embedding tables
    warm_start: str | None = None        # the chief loads these variable values when it initializes (not on restore)

    def __post_init__(self) -> None:
        _check([
            (bool(self.name), "--model must name a model"),
            (self.embedding_dim >= 1, f"--embedding-dim must be >= 1, got {self.embedding_dim}"),
        ])


@dataclass(frozen=True)
class OptimizerSettings:
    """How the ps tasks apply gradients: the optimizer, its learning rate and schedule, averages, clipping."""

    name: str = "ftrl"
    params: dict[str, Any] = field(default_factory=dict)  # TF hyperparameters (--optimizer NAME:KEY=VALUE,...)
    learning_rate: float | None = None   # None: DEFAULT_LEARNING_RATES[optimizer]
    schedule: dict[str, Any] | None = None  # psflow.optim.schedules JSON (--learning-rate-schedule); None: constant
    moving_average_decay: float | None = None  # moving averages of the trainable variables (psflow.ps.averages); None: none
    l1: float = 0.0                      # FTRL only
    l2: float = 0.0                      # FTRL only
    clip_gradient_norm: float | None = None  # each step's gradients clipped to this global norm before the push; None: the model's

    def __post_init__(self) -> None:
        decay, clip = self.moving_average_decay, self.clip_gradient_norm
        _check([(decay is None or (isinstance(decay, (int, float)) and 0.0 <= decay <= 1.0),
                 f"--moving-average-decay must be in [0, 1] (0: none), got {decay}")])
        if clip is not None and not (isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0):
            raise ConfigError(f"--clip-gradient-norm must be a finite number > 0, got {clip}")
        self.spec()  # validates name and hyperparameters

    def spec(self) -> OptimizerSpec:
        """The optimizer and its hyperparameters, with defaults filled in.

        Raises:
            OptimizerError: an invalid hyperparameter; ConfigError: the initial
                learning rate given twice, or an invalid schedule, or one the optimizer refuses (FTRL: a rate
                of 0 at some step): names the flag.
        """
        given = [flag for flag, ok in (("--learning-rate", self.learning_rate is not None),
                                       ("--optimizer ...:learning_rate", "learning_rate" in self.params),
                                       ("--learning-rate-schedule ...:learning_rate",
                                        "learning_rate" in (self.schedule or {}))) if ok]
        if len(given) > 1:
            raise ConfigError(f"{' and '.join(given)} both set the initial learning rate; give one")
        lr = self.learning_rate if self.learning_rate is not None else DEFAULT_LEARNING_RATES.get(self.name, 0.1)
        hp: dict[str, Any] = {"learning_rate": lr}
        if self.name == "ftrl":
            hp.update(learning_rate_power=-0.5, initial_accumulator_value=0.1,
                      l1_regularization_strength=self.l1, l2_regularization_strength=self.l2)
        elif self.name == "adagrad":
            hp.update(initial_accumulator_value=0.1)
        elif self.name == "momentum":
            hp.update(momentum=0.9)
        hp.update(self.params)
        spec = OptimizerSpec(self.name, hp)  # the optimizer's own hyperparameters (an error names the optimizer)
        if self.schedule is not None:
            hp["learning_rate"] = self._schedule(hp["learning_rate"])
            try:
                spec = OptimizerSpec(self.name, hp)
            except OptimizerError as e:  # the optimizer refuses the schedule's rates (FTRL: > 0 at every step)
                raise ConfigError(f"--learning-rate-schedule: {e}") from None
        make_optimizer(spec)  # raises OptimizerError with the valid names
        return spec

    def _schedule(self, initial: float) -> ScheduleSpec:
        """``--learning-rate-schedule``, its learning_rate (where it takes one) the optimizer's unless given."""
        data = dict(self.schedule or {})
        try:
            if "learning_rate" in schedule_parameters(data.get("schedule")):
                data.setdefault("learning_rate", initial)
            return ScheduleSpec.from_json(data)
        except ScheduleError as e:
            raise ConfigError(f"--learning-rate-schedule: {e}") from None


@dataclass(frozen=True)
class ClusterSettings:
    """The tasks, how variables are spread over the ps tasks, and how tasks reach each other."""

    num_ps: int = 2
    num_workers: int = 2
    placement: str = "round-robin"       # or "greedy" (by bytes)
    partitions: int = 1                  # of the weight table, over the ps tasks
    transport: str = "grpc"              # grpc | tcp (psflow's lean carrier for the ps data path; no TLS)
    connect_timeout: float = 60.0        # seconds a task waits for the others to come up
    rpc_timeout: float = 60.0            # seconds one call may take
    # Seconds a ps task's shard save or load (SaveShard, LoadShard) may take, and a non-chief waits for the chief's
    # restore or initial checkpoint once the variables exist: as long as the shard is big (ConnectConfig.save_timeout).
    save_timeout: float = 600.0
    # (--ps-replicas) seconds a shard member may answer nothing before a client takes it as gone (promotes a
    # backup over a silent primary): psflow.ps.failover's rule; a refused connection is taken at once.
    ps_failover_timeout: float = 10.0

    def __post_init__(self) -> None:
        _check([
            (self.num_ps >= 1, f"--ps must be >= 1, got {self.num_ps}"),
            (self.save_timeout > 0, f"--save-timeout must be > 0, got {self.save_timeout}"),
            (0 < self.ps_failover_timeout <= 3600,
             f"--ps-failover-timeout must be within (0, 3600] s, got {self.ps_failover_timeout}"),
            (self.num_workers >= 1, f"--workers must be >= 1, got {self.num_workers}"),
            (self.partitions >= 1, f"--partitions must be >= 1, got {self.partitions}"),
            (self.placement in ("round-robin", "greedy"), f"--placement must be round-robin or greedy, got {self.placement!r}"),
            (self.transport in ("grpc", "tcp"), f"--transport must be grpc or tcp, got {self.transport!r}"),
        ])


#: The most steps a worker may keep in flight (3 or more: psflow.train.pipeline; a ps task then holds up to
#: K-2 of each worker's pushes waiting for their turn, a handler thread each).
MAX_STEPS_IN_FLIGHT = 8


@dataclass(frozen=True)
class SyncSettings:
    """How workers' updates are coordinated (async, sync, ssp) and how workers are driven (replication).

    The mode's own rules are checked by :class:`psflow.ps.sync.SyncConfig`, which needs the number of
    workers: :class:`~psflow.train.config.TrainConfig` builds it.
    """

    mode: str = "async"                  # async | sync (SyncReplicas semantics) | ssp (bounded staleness)
    replicas_to_aggregate: int | None = None   # sync: None = every worker
    staleness: int = 2                   # ssp: steps a worker may run ahead of the slowest
    timeout: float = 30.0                # sync/ssp: seconds a step or a slow worker may hold the others
    on_timeout: str = "fail"             # fail (error naming the missing task) | proceed (go on without it)
    averaging: str = "replicas"          # sync: replicas (divide by N) | per_row (TF SparseConditionalAccumulator) | sparse_sum
    replication: str = "between-graph"   # or in-graph (one client drives every worker)
    # In-graph replication: step functions (import paths) a worker's StepService runs besides the built-in ones.
    allowed_steps: tuple[str, ...] = ()
    # Steps a between-graph worker keeps in flight (psflow.train.step): 1, or 2 (the next step computes while this
    # one's push travels; async and ssp), or 3 .. MAX_STEPS_IN_FLIGHT (K-1 pushes in flight, psflow.train.pipeline;
    # async, gRPC). The default stays 1: benchmarks/RESULTS.md (netns_delay_1ms, _5ms, _rtt) measured 2 at
    # 1.17-1.19x at 2 ms round trips and 0.98-1.10x at 10 ms, and 2, 4 and 6 on loopback within the noise of 1 (4
    # and 6 hide 2-10 ms round trips: 0.80-1.03x of the same relay at 0 ms), too little to change what an async
    # step reads by default.
    steps_in_flight: int = 1

    def __post_init__(self) -> None:
        if self.replication not in ("between-graph", "in-graph"):
            raise ConfigError(f"--replication must be between-graph or in-graph, got {self.replication!r}")
        if self.mode == "ssp" and self.replication != "between-graph":  # refused before any task starts
            raise ConfigError("--mode ssp needs between-graph replication")
        k = self.steps_in_flight
        valid = type(k) is int and 1 <= k <= MAX_STEPS_IN_FLIGHT
        r = self.replicas_to_aggregate
        _check([  # by their flags: psflow.ps.sync.SyncConfig checks them again, by its own names
            (r is None or r >= 1, f"--replicas-to-aggregate must be >= 1, got {r}"),
            (self.staleness >= 0, f"--staleness must be >= 0, got {self.staleness}"),
            (self.mode in MODES, f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}"),
            (self.timeout > 0, f"--sync-timeout must be > 0 seconds, got {self.timeout:g}"),
            (self.on_timeout in ("fail", "proceed"), f"--on-timeout must be fail or proceed, got {self.on_timeout!r}"),
            (self.averaging in AVERAGINGS, f"--averaging must be one of {', '.join(AVERAGINGS)}, got {self.averaging!r}"),
            (valid,
             f"--steps-in-flight must be 1 to {MAX_STEPS_IN_FLIGHT}, got {k!r}"),
            (not valid or k == 1 or self.mode != "sync", f"--steps-in-flight {k} needs --mode async or ssp: a sync step "
                                                    "waits for the aggregated update before the next one computes"),
            (not valid or k <= 2 or self.mode == "async", f"--steps-in-flight {k} needs --mode async (ssp: 2 at most)"),
            (not valid or k == 1 or self.replication == "between-graph",
             f"--steps-in-flight {k} is for between-graph workers; in-graph replication drives each step itself"),
        ])

    def reported(self) -> dict[str, Any]:
        """What a run reports of its mode (metrics.json, status.json, the status page), cluster or in-process
        (:func:`psflow.launch.in_process.mode_fields` adds what one worker ran): the mode, an ssp run's staleness."""
        return {"mode": self.mode, **({"staleness": self.staleness} if self.mode == "ssp" else {})}


@dataclass(frozen=True)
class CheckpointSettings:
    """Where and how often the chief saves checkpoints (see psflow.train.session / checkpoint / hooks)."""

    dir: str | None = None               # restore from / save to; None: no checkpoints
    save_secs: float | None = None       # default 600 s when neither secs nor steps is given
    save_steps: int | None = None
    max_to_keep: int = 5                 # complete checkpoints kept
    transport: str = "local"             # local: ps tasks write shards; rpc: streamed to the chief
    max_failed_saves: int = 3            # saves failing in a row that fail the run (0: never; each is logged and counted)
    full_every: int = 10                 # every K-th save full, the others increments (1: all full)

    def __post_init__(self) -> None:
        _check([
            (self.save_secs is None or self.save_secs > 0, f"--save-checkpoints-secs must be > 0, got {self.save_secs}"),
            (self.save_steps is None or self.save_steps >= 1,
             f"--save-checkpoints-steps must be >= 1, got {self.save_steps}"),
            (self.save_secs is None or self.save_steps is None,
             "give --save-checkpoints-secs or --save-checkpoints-steps, not both"),
            (self.max_to_keep >= 1, f"--max-to-keep must be >= 1, got {self.max_to_keep}"),
            (self.max_failed_saves >= 0, f"--max-failed-saves must be >= 0, got {self.max_failed_saves}"),
            (self.full_every >= 1, f"--full-checkpoint-every must be >= 1, got {self.full_every}"),
            (self.transport in ("local", "rpc"), f"--checkpoint-transport must be local or rpc, got {self.transport!r}"),
        ])


@dataclass(frozen=True)
class ReportSettings:
    """What a run tells its user: workers' log lines, the chief's summaries and evaluations."""

    log_every: int = 100                 # a worker logs step=S when S % log_every == 0
    summary_dir: str | None = None       # TensorBoard event files; None: no summaries
    save_summaries_steps: int = 100
    eval_every_steps: int | None = None  # chief evaluates on --eval every N global steps
    eval_at_end: bool = False            # chief evaluates on --eval once training ended (psflow server sets it;
                                         # psflow train's launcher evaluates the ps tasks' model itself)
    eval_moving_averages: bool = False   # evaluations (chief, launcher, evaluator task) read the variables' moving averages

    def __post_init__(self) -> None:
        _check([
            (self.log_every >= 1, f"--log-every must be >= 1, got {self.log_every}"),
            (self.save_summaries_steps >= 1, f"--save-summaries-steps must be >= 1, got {self.save_summaries_steps}"),
            (self.eval_every_steps is None or self.eval_every_steps >= 1,
             f"--eval-every-steps must be >= 1, got {self.eval_every_steps}"),
        ])


@dataclass(frozen=True)
class ChiefSettings:
    """Chief election (psflow.coord): the lease holder does the chief duties and ps restores."""

    coordination: str = "embedded"       # embedded (leases on ps task 0) | zookeeper
    zookeeper: str | None = None         # ZooKeeper connection string h1:2181,h2:2181 (zookeeper only)
    lease_ttl: float = 10.0              # seconds a dead or stopped chief keeps the lease (fail-over bound)

    def __post_init__(self) -> None:
        if self.coordination not in ("embedded", "zookeeper"):
            raise ConfigError(f"--coordination must be embedded or zookeeper, got {self.coordination!r}")
        if self.coordination == "zookeeper" and not self.zookeeper:
            raise ConfigError("--coordination zookeeper needs --zookeeper HOSTS")
        if not 0.5 <= self.lease_ttl <= 600:
            raise ConfigError(f"--lease-ttl must be within [0.5, 600] s, got {self.lease_ttl}")


@dataclass(frozen=True)
class ComputeSettings:
    """Where a worker's model computes (psflow.torch's towers: docs/torch.md)."""

    device: str = "cpu"                  # cpu | cuda | cuda:N (PyTorch models)
    towers: int = 1                      # replicas of the model in each worker, each on `device`, splitting every batch
    devices: tuple[str, ...] = ()        # a tower on each of these (instead of device and towers), e.g. ("cuda:0", "cuda:1")

    def __post_init__(self) -> None:
        if self.towers < 1:
            raise ConfigError(f"--towers must be >= 1, got {self.towers}")
        if self.devices and (self.device != "cpu" or self.towers not in (1, len(self.devices))):
            raise ConfigError(f"--devices {','.join(self.devices)} gives a tower per device: leave out --device and --towers")
        for device in self.devices or (self.device,):
            if not _DEVICE.fullmatch(device):
                flag = "--devices" if self.devices else "--device"
                raise ConfigError(f"{flag}: unknown device {device!r} (want cpu, cuda or cuda:N)")

    def tower_devices(self) -> tuple[str, ...]:
        """Where a worker's model computes, one tower per entry: ``devices``, else ``device`` ``towers`` times."""
        return tuple(self.devices) if self.devices else (self.device,) * self.towers
