"""TrainConfig: every setting of a training run, parsed once at the edge, in groups by concern.

The CLI (or a user's script) builds one :class:`TrainConfig`; it is written to JSON (nested: one object per
group) and handed to every task process, so all tasks train with the same settings. Library code reads
settings only from here, never from the environment. Each group (:mod:`psflow.train.config.groups`) checks
its own fields; :class:`TrainConfig` checks the rules that span groups (partitions against features, the
sync mode against the number of workers, the locations psflow must be able to use).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

from psflow import jsonio
from psflow.errors import ConfigError
from psflow.optim import OptimizerSpec
from psflow.ps.sync import SyncConfig
from psflow.train.config.groups import (
    CheckpointSettings,
    ChiefSettings,
    ClusterSettings,
    ComputeSettings,
    DataSettings,
    ModelSettings,
    OptimizerSettings,
    ReportSettings,
    SyncSettings,
)

__all__ = ["TrainConfig", "FLAT_FIELDS", "MODE_FLAGS", "in_graph_timeout_refusal", "other_mode_refusal"]

_GROUPS: dict[str, type[Any]] = {
    "data": DataSettings, "model": ModelSettings, "optimizer": OptimizerSettings, "cluster": ClusterSettings,
    "sync": SyncSettings, "checkpoint": CheckpointSettings, "report": ReportSettings, "chief": ChiefSettings,
    "compute": ComputeSettings,
}

#: The settings' flat names (the flags' names, as :meth:`TrainConfig.flat` takes them), each with its group
#: and its field there.
FLAT_FIELDS: dict[str, tuple[str, str]] = {
    **{f.name: ("data", f.name) for f in dataclasses.fields(DataSettings)},
    "model": ("model", "name"), "model_path": ("model", "path"), "model_params": ("model", "params"),
    "embedding_dim": ("model", "embedding_dim"), "warm_start": ("model", "warm_start"),
    "optimizer": ("optimizer", "name"), "optimizer_params": ("optimizer", "params"),
    "learning_rate_schedule": ("optimizer", "schedule"),
    **{name: ("optimizer", name) for name in ("learning_rate", "moving_average_decay", "l1", "l2", "clip_gradient_norm")},
    **{f.name: ("cluster", f.name) for f in dataclasses.fields(ClusterSettings)},
    **{f.name: ("sync", f.name) for f in dataclasses.fields(SyncSettings) if f.name != "timeout"},
    "sync_timeout": ("sync", "timeout"),
    "checkpoint_dir": ("checkpoint", "dir"), "save_checkpoints_secs": ("checkpoint", "save_secs"),
    "save_checkpoints_steps": ("checkpoint", "save_steps"), "checkpoint_transport": ("checkpoint", "transport"),
    "max_to_keep": ("checkpoint", "max_to_keep"), "max_failed_saves": ("checkpoint", "max_failed_saves"),
    "full_checkpoint_every": ("checkpoint", "full_every"),
    **{f.name: ("report", f.name) for f in dataclasses.fields(ReportSettings)},
    **{f.name: ("chief", f.name) for f in dataclasses.fields(ChiefSettings)},
    **{f.name: ("compute", f.name) for f in dataclasses.fields(ComputeSettings)},
}


def in_graph_timeout_refusal(flag: str, value: float | str) -> str:
    """The one line refusing ``--sync-timeout`` or ``--on-timeout`` (``flag``, given as ``value``) in-graph."""
    shown = f"{value:g}" if isinstance(value, float) else value
    return (f"{flag} {shown} is for between-graph replication: an in-graph step waits for a failed worker up to "
            "--connect-timeout and runs its slice again, never without it")


#: The sync group's flags that only some --mode reads (psflow.ps.sync, psflow.ps.staleness), each with those modes
#: and its field: ssp applies each push on arrival as async does (no aggregation), but holds a worker that runs
#: --staleness steps ahead, up to --sync-timeout.
MODE_FLAGS: dict[str, tuple[tuple[str, ...], str]] = {
    "--replicas-to-aggregate": (("sync",), "replicas_to_aggregate"), "--averaging": (("sync",), "averaging"),
    "--sync-timeout": (("sync", "ssp"), "timeout"), "--on-timeout": (("sync", "ssp"), "on_timeout"),
    "--staleness": (("ssp",), "staleness"),
}
_MODE_DOES = {"async": "applies each push on arrival and waits for no worker",
              "ssp": "applies each push on arrival, alone", "sync": "steps every worker together"}


def other_mode_refusal(flag: str, value: object, mode: str) -> str | None:
    """The one line refusing ``flag`` (a key of :data:`MODE_FLAGS`, given as ``value``) in a run of ``mode``
    that does not read it, or None where ``mode`` reads it: accepted, it would change nothing, silently."""
    modes = MODE_FLAGS[flag][0]
    if mode in modes:
        return None
    shown = f"{value:g}" if isinstance(value, float) else value
    return f"{flag} {shown} is for --mode {' or '.join(modes)} (this run: --mode {mode}, which {_MODE_DOES[mode]})"


#: Group fields JSON holds as lists and the config as tuples.
_TUPLES = {"data": ("train", "eval", "features"), "sync": ("allowed_steps",), "compute": ("devices",)}


@dataclass(frozen=True)
class TrainConfig:
    """Settings of one run, one group per concern. Units: counts unless named otherwise.

    psflow builds the groups; tests, benchmarks and examples may use :meth:`flat` and :meth:`with_`, which
    take the settings by their flat names (:data:`FLAT_FIELDS`).
    """

    data: DataSettings = field(default_factory=DataSettings)
    model: ModelSettings = field(default_factory=ModelSettings)
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    sync: SyncSettings = field(default_factory=SyncSettings)
    checkpoint: CheckpointSettings = field(default_factory=CheckpointSettings)
    report: ReportSettings = field(default_factory=ReportSettings)
    chief: ChiefSettings = field(default_factory=ChiefSettings)
    compute: ComputeSettings = field(default_factory=ComputeSettings)
    run_id: str | None = None            # the run (owner of --checkpoint-dir's lock); set by the launcher, else derived from the cluster

    def __post_init__(self) -> None:
        if self.cluster.partitions > self.data.num_features:
            raise ConfigError(f"--partitions ({self.cluster.partitions}) exceeds --num-features ({self.data.num_features})")
        self._check_locations()
        k = self.sync.steps_in_flight
        if k > 2 and self.cluster.transport != "grpc":
            raise ConfigError(f"--steps-in-flight {k} needs --transport grpc: K-1 pushes travel at once on a "
                              f"connection, and the {self.cluster.transport} carrier serves one call at a time")
        self._check_in_graph_sync()
        self._check_in_graph_timeouts()
        self._check_mode_settings()
        try:
            self.sync_config()
        except ValueError as e:
            raise ConfigError(str(e)) from e

    def _check_mode_settings(self) -> None:
        """A sync setting --mode does not read (:data:`MODE_FLAGS`) is refused, not ignored, where it is not its
        default; then --replicas-to-aggregate against --workers, by the flags' names."""
        sync, default = self.sync, SyncSettings()
        for flag, (_, name) in MODE_FLAGS.items():
            value = getattr(sync, name)
            refusal = other_mode_refusal(flag, value, sync.mode) if value != getattr(default, name) else None
            if refusal:
                raise ConfigError(refusal)
        workers = self.cluster.num_workers
        if sync.replicas_to_aggregate is not None and sync.replicas_to_aggregate > workers:
            raise ConfigError(f"--replicas-to-aggregate {sync.replicas_to_aggregate} exceeds --workers ({workers}): "
                              "a sync step aggregates at most one gradient per worker")

    def _check_in_graph_sync(self) -> None:
        """In-graph sync pushes the mean of every worker's slice (psflow.train.in_graph): backups or another
        averaging, which it would not do, are refused rather than ignored."""
        sync, workers = self.sync, self.cluster.num_workers
        if sync.replication != "in-graph" or sync.mode != "sync":
            return
        if sync.replicas_to_aggregate is not None and sync.replicas_to_aggregate < workers:
            raise ConfigError(f"--replicas-to-aggregate {sync.replicas_to_aggregate} (backup workers) needs "
                              f"between-graph replication: in-graph sync averages all {workers} workers' slices "
                              "every step")
        if sync.averaging != "replicas":
            raise ConfigError(f"--averaging {sync.averaging} needs between-graph replication: in-graph sync weights "
                              "each worker's slice by its examples (replicas)")

    def _check_in_graph_timeouts(self) -> None:
        """An in-graph step waits for a failed worker and runs its slice again (psflow.train.in_graph_client):
        --sync-timeout and --on-timeout, which it would not honour, are refused rather than ignored (any mode)."""
        sync, default = self.sync, SyncSettings()
        if sync.replication != "in-graph":
            return
        for flag, value, unset in (("--sync-timeout", sync.timeout, sync.timeout == default.timeout),
                                   ("--on-timeout", sync.on_timeout, sync.on_timeout == default.on_timeout)):
            if not unset:
                raise ConfigError(in_graph_timeout_refusal(flag, value))

    @classmethod
    def flat(cls, **settings: Any) -> TrainConfig:
        """A config from settings by their flat names (``TrainConfig.flat(train=..., epochs=2, num_ps=1)``),
        the rest at their defaults.

        Raises:
            TypeError: an unknown name (names it); ConfigError: as the groups and the config check.
        """
        return cls().with_(**settings)

    def with_(self, **settings: Any) -> TrainConfig:
        """This config with the settings given by their flat names changed (``config.with_(epochs=3)``).

        Raises:
            TypeError: an unknown name (names it); ConfigError: as the groups and the config check.
        """
        changes: dict[str, dict[str, Any]] = {}
        top: dict[str, Any] = {}
        for name, value in settings.items():
            if name == "run_id":
                top[name] = value
            elif name in FLAT_FIELDS:
                group, key = FLAT_FIELDS[name]
                changes.setdefault(group, {})[key] = value
            else:
                raise TypeError(f"TrainConfig has no setting {name!r}")
        groups = {group: dataclasses.replace(getattr(self, group), **given) for group, given in changes.items()}
        return dataclasses.replace(self, **groups, **top)

    def _check_locations(self) -> None:
        """A URL (``s3://``, ``gs://``) in --checkpoint-dir, --train or --eval must be one psflow can use
        (psflow.storage): an unknown scheme or a missing client library is one line, before anything starts.
        --summary-dir takes no URL (it used to make a local folder ``./s3:/...`` of one)."""
        from psflow import storage
        from psflow.extras import MissingExtraError

        named = [("--checkpoint-dir", self.checkpoint.dir or ""), ("--warm-start", self.model.warm_start or ""),
                 *(("--train", p) for p in self.data.train), *(("--eval", p) for p in self.data.eval)]
        for flag, location in named:
            try:
                storage.check_location(location)
            except storage.StorageError as e:
                raise ConfigError(f"{flag} {e}") from None
            except MissingExtraError as e:
                raise MissingExtraError(f"{flag} {e}", module=e.name or "", extra=e.extra) from None
        try:  # the chief's SummaryWriter writes local files only
            storage.local_only(self.report.summary_dir or "", "--summary-dir", "TensorBoard summaries")
        except storage.StorageError as e:
            raise ConfigError(str(e)) from None

    def compute_devices(self) -> tuple[str, ...]:
        """Where a worker's model computes, one tower per entry (:meth:`ComputeSettings.tower_devices`)."""
        return self.compute.tower_devices()

    def sync_config(self) -> SyncConfig:
        """How updates are coordinated (see :mod:`psflow.ps.sync`)."""
        sync, workers = self.sync, self.cluster.num_workers
        return SyncConfig(
            mode=sync.mode,
            replicas_to_aggregate=sync.replicas_to_aggregate or workers,
            total_num_replicas=workers,
            staleness=sync.staleness,
            timeout=sync.timeout,
            on_timeout=sync.on_timeout,
            averaging=sync.averaging,
        )

    def optimizer_spec(self) -> OptimizerSpec:
        """The optimizer and its hyperparameters, with defaults filled in (:meth:`OptimizerSettings.spec`)."""
        return self.optimizer.spec()

    def to_json(self) -> str:
        """The config as JSON (config.json): one object per group, ``run_id`` beside them.

        Raises:
            ConfigError: a float setting is NaN or infinite (names it): JSON cannot hold it.
        """
        try:
            return jsonio.dumps(dataclasses.asdict(self), nonfinite="error", what="the training config", indent=1)
        except ValueError as e:
            raise ConfigError(str(e)) from e

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        """Reads :meth:`to_json`'s form (the same run's config file: no other version is read).

        Raises:
            ConfigError: a setting is invalid (names its flag).
        """
        data = json.loads(text)
        groups: dict[str, Any] = {}
        for name, group in _GROUPS.items():
            given = dict(data.pop(name, None) or {})
            for key in _TUPLES.get(name, ()):
                given[key] = tuple(given.get(key, ()))
            groups[name] = group(**given)
        return cls(**groups, **data)
