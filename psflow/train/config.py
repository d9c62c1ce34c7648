"""TrainConfig: every setting of a training run, parsed once at the edge.

The CLI (or a user's script) builds one :class:`TrainConfig`; it is written
to JSON and handed to every task process, so all tasks train with the same
settings. Library code reads settings only from here, never from the
environment.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from psflow import jsonio
from psflow.errors import ConfigError
from psflow.optim import OptimizerSpec
from psflow.optim.schedules import ScheduleError, ScheduleSpec, schedule_parameters
from psflow.ps.optimizers import make_optimizer
from psflow.ps.sync import SyncConfig

__all__ = ["TrainConfig", "DEFAULT_LEARNING_RATES", "ConfigError", "MAX_SEED"]

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


#: Intra-op threads of PyTorch in a task process (psflow.torch.THREADS_ENV, named here so that the
#: launcher and the in-process path set it without importing PyTorch).
TORCH_THREADS_ENV = "PSFLOW_TORCH_THREADS"


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one run. Units: counts unless named otherwise."""

    train: tuple[str, ...] = ()
    eval: tuple[str, ...] = ()
    format: str = "libsvm"
    num_features: int = 1 << 20          # rows of a shared hashed table; the id space of each hashed feature
    model: str = "logistic"              # a registered name (psflow.models.registry) or package.module:Class
    model_path: str | None = None        # directory put first on sys.path to import a user's model (the launch dir)
    model_params: dict[str, Any] = field(default_factory=dict)  # model-specific settings (--model-param KEY=VALUE)
    embedding_dim: int = 8               # width of embedding tables
    warm_start: str | None = None        # the chief loads these variable values when it initializes (not on restore)
    optimizer: str = "ftrl"
    optimizer_params: dict[str, Any] = field(default_factory=dict)  # TF hyperparameters (--optimizer NAME:KEY=VALUE,...)
    learning_rate: float | None = None   # None: DEFAULT_LEARNING_RATES[optimizer]
    learning_rate_schedule: dict[str, Any] | None = None  # psflow.optim.schedules JSON (--learning-rate-schedule); None: constant
    moving_average_decay: float | None = None  # moving averages of the trainable variables (psflow.ps.averages); None: none
    l1: float = 0.0                      # FTRL only
    l2: float = 0.0                      # FTRL only
    batch_size: int = 512
    epochs: int | None = 1               # None: until --max-steps
    max_steps: int | None = None         # stop once global_step reaches this
    seed: int = 0
    num_ps: int = 2
    num_workers: int = 2
    placement: str = "round-robin"       # or "greedy" (by bytes)
    partitions: int = 1                  # of the weight table, over the ps tasks
    log_every: int = 100                 # a worker logs step=S when S % log_every == 0
    shuffle_buffer: int = 0
    reader_process: bool = False         # parse input in a forked child process (shared memory); --in-process only, which turns it on
    skip_bad_records: bool = False
    max_bad_records: int = 100           # with skip_bad_records: stop once more are skipped (per epoch)
    schema: str | None = None            # tfrecord schema file (none, no --feature: inferred from the first train file)
    features: tuple[str, ...] = ()       # tfrecord schema from flags: --feature NAME:KIND[:...] (instead of --schema)
    label: str = "label"                 # with --feature, or when the schema is inferred: the label's Example key
    mode: str = "async"                  # async | sync (SyncReplicas semantics) | ssp (bounded staleness)
    replicas_to_aggregate: int | None = None   # sync: None = every worker
    staleness: int = 2                   # ssp: steps a worker may run ahead of the slowest
    sync_timeout: float = 30.0           # sync/ssp: seconds a step or a slow worker may hold the others
    on_timeout: str = "fail"             # fail (error naming the missing task) | proceed (go on without it)
    averaging: str = "replicas"          # sync: replicas (divide by N) | per_row (TF SparseConditionalAccumulator) | sparse_sum
    replication: str = "between-graph"   # or in-graph (one client drives every worker)
    transport: str = "grpc"              # grpc | tcp (psflow's lean carrier for the ps data path; no TLS)
    connect_timeout: float = 60.0        # seconds a task waits for the others to come up
    rpc_timeout: float = 60.0            # seconds one call may take
    # Chief duties (see psflow.train.session / checkpoint / hooks).
    checkpoint_dir: str | None = None    # restore from / save to; None: no checkpoints
    save_checkpoints_secs: float | None = None  # default 600 s when neither secs nor steps is given
    save_checkpoints_steps: int | None = None
    max_to_keep: int = 5                 # complete checkpoints kept
    checkpoint_transport: str = "local"  # local: ps tasks write shards; rpc: streamed to the chief
    summary_dir: str | None = None       # TensorBoard event files; None: no summaries
    save_summaries_steps: int = 100
    eval_every_steps: int | None = None  # chief evaluates on --eval every N global steps
    eval_moving_averages: bool = False   # evaluations (chief, launcher, evaluator task) read the variables' moving averages
    max_failed_saves: int = 3            # checkpoint saves failing in a row that fail the run (0: never; each is logged and counted)
    run_id: str | None = None            # the run (owner of --checkpoint-dir's lock); set by the launcher, else derived from the cluster
    # Chief election (psflow.coord): the lease holder does the chief duties and ps restores.
    coordination: str = "embedded"       # embedded (leases on ps task 0) | zookeeper
    zookeeper: str | None = None         # ZooKeeper connection string h1:2181,h2:2181 (zookeeper only)
    lease_ttl: float = 10.0              # seconds a dead or stopped chief keeps the lease (fail-over bound)
    # Gradients and devices (psflow.train.clipping; psflow.torch's towers: docs/torch.md).
    clip_gradient_norm: float | None = None  # each step's gradients clipped to this global norm before the push; None: the model's
    device: str = "cpu"                  # where a worker's model computes: cpu | cuda | cuda:N (PyTorch models)
    towers: int = 1                      # replicas of the model in each worker, each on `device`, splitting every batch
    devices: tuple[str, ...] = ()        # a tower on each of these (instead of device and towers), e.g. ("cuda:0", "cuda:1")
    # In-graph replication: step functions (import paths) a worker's StepService runs besides the built-in ones.
    allowed_steps: tuple[str, ...] = ()
    # Fault injection (tests, drills) is not a setting: psflow.train.faults.FaultInjection, beside the config.

    def __post_init__(self) -> None:
        checks = [
            (self.num_features >= 1, f"--num-features must be >= 1, got {self.num_features}"),
            (self.batch_size >= 1, f"--batch-size must be >= 1, got {self.batch_size}"),
            (0 <= self.seed <= MAX_SEED, f"--seed must be in [0, 2**63 - 1], got {self.seed}"),
            (self.num_ps >= 1, f"--ps must be >= 1, got {self.num_ps}"),
            (self.num_workers >= 1, f"--workers must be >= 1, got {self.num_workers}"),
            (self.partitions >= 1, f"--partitions must be >= 1, got {self.partitions}"),
            (self.log_every >= 1, f"--log-every must be >= 1, got {self.log_every}"),
            (self.epochs is None or self.epochs >= 1, f"--epochs must be >= 1, got {self.epochs}"),
            (self.max_steps is None or self.max_steps >= 1, f"--max-steps must be >= 1, got {self.max_steps}"),
            (self.epochs is not None or self.max_steps is not None, "unbounded epochs need --max-steps"),
            (self.save_checkpoints_secs is None or self.save_checkpoints_secs > 0,
             f"--save-checkpoints-secs must be > 0, got {self.save_checkpoints_secs}"),
            (self.save_checkpoints_steps is None or self.save_checkpoints_steps >= 1,
             f"--save-checkpoints-steps must be >= 1, got {self.save_checkpoints_steps}"),
            (self.save_checkpoints_secs is None or self.save_checkpoints_steps is None,
             "give --save-checkpoints-secs or --save-checkpoints-steps, not both"),
            (self.max_to_keep >= 1, f"--max-to-keep must be >= 1, got {self.max_to_keep}"),
            (self.max_failed_saves >= 0, f"--max-failed-saves must be >= 0, got {self.max_failed_saves}"),
            (self.checkpoint_transport in ("local", "rpc"),
             f"--checkpoint-transport must be local or rpc, got {self.checkpoint_transport!r}"),
            (self.save_summaries_steps >= 1, f"--save-summaries-steps must be >= 1, got {self.save_summaries_steps}"),
            (self.eval_every_steps is None or self.eval_every_steps >= 1,
             f"--eval-every-steps must be >= 1, got {self.eval_every_steps}"),
            (self.moving_average_decay is None or (isinstance(self.moving_average_decay, (int, float))
                                                   and 0.0 <= self.moving_average_decay <= 1.0),
             f"--moving-average-decay must be in [0, 1] (0: none), got {self.moving_average_decay}"),
            (self.placement in ("round-robin", "greedy"), f"--placement must be round-robin or greedy, got {self.placement!r}"),
            (bool(self.model), "--model must name a model"),
            (self.embedding_dim >= 1, f"--embedding-dim must be >= 1, got {self.embedding_dim}"),
            (not (self.schema and self.features), "give --schema FILE or --feature flags, not both"),
            (self.format == "tfrecord" or not (self.schema or self.features),
             f"--schema and --feature describe TFRecord data; --format is {self.format!r}"),
            (self.partitions <= self.num_features, f"--partitions ({self.partitions}) exceeds --num-features ({self.num_features})"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        if self.transport not in ("grpc", "tcp"):
            raise ConfigError(f"--transport must be grpc or tcp, got {self.transport!r}")
        if self.coordination not in ("embedded", "zookeeper"):
            raise ConfigError(f"--coordination must be embedded or zookeeper, got {self.coordination!r}")
        if self.coordination == "zookeeper" and not self.zookeeper:
            raise ConfigError("--coordination zookeeper needs --zookeeper HOSTS")
        if not 0.5 <= self.lease_ttl <= 600:
            raise ConfigError(f"--lease-ttl must be within [0.5, 600] s, got {self.lease_ttl}")
        if self.replication not in ("between-graph", "in-graph"):
            raise ConfigError(f"--replication must be between-graph or in-graph, got {self.replication!r}")
        self._check_compute()
        self._check_locations()
        self.optimizer_spec()  # validates name and hyperparameters
        try:
            self.sync_config()
        except ValueError as e:
            raise ConfigError(str(e)) from e

    def _check_locations(self) -> None:
        """A URL (``s3://``, ``gs://``) in --checkpoint-dir, --train or --eval must be one psflow can use
        (psflow.storage): an unknown scheme or a missing client library is one line, before anything starts.
        --summary-dir takes no URL (it used to make a local folder ``./s3:/...`` of one)."""
        from psflow import storage
        from psflow.extras import MissingExtraError

        named = [("--checkpoint-dir", self.checkpoint_dir or ""), ("--warm-start", self.warm_start or ""),
                 *(("--train", p) for p in self.train), *(("--eval", p) for p in self.eval)]
        for flag, location in named:
            try:
                storage.check_location(location)
            except storage.StorageError as e:
                raise ConfigError(f"{flag} {e}") from None
            except MissingExtraError as e:
                raise MissingExtraError(f"{flag} {e}", module=e.name or "", extra=e.extra) from None
        try:  # the chief's SummaryWriter writes local files only
            storage.local_only(self.summary_dir or "", "--summary-dir", "TensorBoard summaries")
        except storage.StorageError as e:
            raise ConfigError(str(e)) from None

    def _check_compute(self) -> None:
        clip = self.clip_gradient_norm
        if clip is not None and not (isinstance(clip, (int, float)) and math.isfinite(clip) and clip > 0):
            raise ConfigError(f"--clip-gradient-norm must be a finite number > 0, got {clip}")
        if self.towers < 1:
            raise ConfigError(f"--towers must be >= 1, got {self.towers}")
        if self.devices and (self.device != "cpu" or self.towers not in (1, len(self.devices))):
            raise ConfigError(f"--devices {','.join(self.devices)} gives a tower per device: leave out --device and --towers")
        for device in self.devices or (self.device,):
            if not _DEVICE.fullmatch(device):
                flag = "--devices" if self.devices else "--device"
                raise ConfigError(f"{flag}: unknown device {device!r} (want cpu, cuda or cuda:N)")

    def compute_devices(self) -> tuple[str, ...]:
        """Where a worker's model computes, one tower per entry: ``devices``, else ``device`` ``towers`` times."""
        return tuple(self.devices) if self.devices else (self.device,) * self.towers

    def sync_config(self) -> SyncConfig:
        """How updates are coordinated (see :mod:`psflow.ps.sync`)."""
        return SyncConfig(
            mode=self.mode,
            replicas_to_aggregate=self.replicas_to_aggregate or self.num_workers,
            total_num_replicas=self.num_workers,
            staleness=self.staleness,
            timeout=self.sync_timeout,
            on_timeout=self.on_timeout,
            averaging=self.averaging,
        )

    def optimizer_spec(self) -> OptimizerSpec:
        """The optimizer and its hyperparameters, with defaults filled in.

        Raises:
            OptimizerError: an invalid hyperparameter; ConfigError: the initial
                learning rate given twice, or an invalid schedule (names the flag).
        """
        given = [flag for flag, ok in (("--learning-rate", self.learning_rate is not None),
                                       ("--optimizer ...:learning_rate", "learning_rate" in self.optimizer_params),
                                       ("--learning-rate-schedule ...:learning_rate",
                                        "learning_rate" in (self.learning_rate_schedule or {}))) if ok]
        if len(given) > 1:
            raise ConfigError(f"{' and '.join(given)} both set the initial learning rate; give one")
        lr = self.learning_rate if self.learning_rate is not None else DEFAULT_LEARNING_RATES.get(self.optimizer, 0.1)
        hp: dict[str, Any] = {"learning_rate": lr}
        if self.optimizer == "ftrl":
            hp.update(learning_rate_power=-0.5, initial_accumulator_value=0.1,
                      l1_regularization_strength=self.l1, l2_regularization_strength=self.l2)
        elif self.optimizer == "adagrad":
            hp.update(initial_accumulator_value=0.1)
        elif self.optimizer == "momentum":
            hp.update(momentum=0.9)
        hp.update(self.optimizer_params)
        if self.learning_rate_schedule is not None:
            hp["learning_rate"] = self._schedule(hp["learning_rate"])
        spec = OptimizerSpec(self.optimizer, hp)
        make_optimizer(spec)  # raises OptimizerError with the valid names
        return spec

    def _schedule(self, initial: float) -> ScheduleSpec:
        """``--learning-rate-schedule``, its learning_rate (where it takes one) the optimizer's unless given."""
        data = dict(self.learning_rate_schedule or {})
        try:
            if "learning_rate" in schedule_parameters(data.get("schedule")):
                data.setdefault("learning_rate", initial)
            return ScheduleSpec.from_json(data)
        except ScheduleError as e:
            raise ConfigError(f"--learning-rate-schedule: {e}") from None

    def to_json(self) -> str:
        """The config as JSON (config.json).

        Raises:
            ConfigError: a float setting is NaN or infinite (names it): JSON cannot hold it.
        """
        try:
            return jsonio.dumps(dataclasses.asdict(self), nonfinite="error", what="the training config", indent=1)
        except ValueError as e:
            raise ConfigError(str(e)) from e

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        data = json.loads(text)
        for key in ("train", "eval", "features", "devices", "allowed_steps"):
            data[key] = tuple(data.get(key, ()))
        return cls(**data)
