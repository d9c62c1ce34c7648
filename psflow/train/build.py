"""From a run's settings to its model, data schema and placed variables.

Every process of a run (workers, the in-graph client, the launcher, the chief
tools) calls :func:`build_model` with the same :class:`TrainConfig`, so all
compute the same :class:`~psflow.models.ModelConfig`, the same variables and
the same placement (a layout that differs is refused at registration).

The data side: :func:`data_schema` is the TFRecord schema of the run (a file,
``--feature`` flags, or one inferred from the first training file --
:func:`inferred_schema`, :mod:`psflow.data.infer` -- which for sparse-LR
files is the default), :func:`data_options` the reader
settings shared by training, evaluation and prediction (:func:`dataset_config`: a worker's shard of the
training files with them), and the model's
features come from :func:`psflow.data.batch_spec` of the format and schema.
"""

from __future__ import annotations

import contextlib
from typing import Any

from psflow.cluster import ClusterSpec
from psflow.data import DataError, DatasetConfig, Schema, batch_spec
from psflow.data.infer import InferredSchema, infer_first_file
from psflow.models.api import DYNAMIC_TABLE_PARAM, Model, ModelConfig, ModelError
from psflow.models.registry import create_model, model_class
from psflow.placement import (
    DeviceSetter,
    GreedyLoadBalancingStrategy,
    PlacementError,
    RoundRobinStrategy,
    VariableSet,
    byte_size_load_fn,
    replica_device_setter,
)
from psflow.ps.dynamic import DynamicTableError, share_spec
from psflow.train.config import ConfigError, TrainConfig

__all__ = ["data_schema", "inferred_schema", "data_options", "dataset_config", "model_config", "build_model",
           "configure_training", "declare_variables", "model_record"]


def inferred_schema(config: TrainConfig) -> InferredSchema | None:
    """The schema inferred from the run's first training file (else evaluation file) when ``--format
    tfrecord`` has neither ``--schema`` nor ``--feature`` (see :mod:`psflow.data.infer`); None otherwise.

    Cached per file and settings, so every call of a process reads the file once.

    Raises:
        ConfigError: the file cannot be inferred from (names the file and the feature).
    """
    if config.data.format != "tfrecord" or config.data.schema or config.data.features:
        return None
    paths = config.data.train or config.data.eval
    if not paths:
        return None
    try:
        return infer_first_file(paths, num_features=config.data.num_features, label=config.data.label)
    except DataError as e:
        raise ConfigError(f"schema inference (no --schema given): {e}") from e


def data_schema(config: TrainConfig) -> Schema | None:
    """The run's TFRecord schema: ``--schema FILE``, ``--feature`` flags, the schema inferred from the
    first training file, or None (the default schema: the text formats, and sparse-LR files).

    Raises:
        ConfigError: the schema file or flags are malformed, or describe features
            a batch cannot hold (names the file or flag and the feature); or no
            schema is given and none can be inferred.
    """
    if not (config.data.schema or config.data.features):
        inferred = inferred_schema(config)
        if inferred is None or inferred.is_default:
            return None
        return inferred.schema  # fits a batch by construction
    try:
        if config.data.schema:
            schema = Schema.from_file(config.data.schema)
            where = config.data.schema
        else:
            schema = Schema.from_flags(config.data.features, config.data.label)
            where = "--feature"
    except OSError as e:
        raise ConfigError(f"--schema {config.data.schema}: cannot read it: {e.strerror or e}") from e
    except ValueError as e:
        raise ConfigError(f"schema: {e}") from e
    try:
        schema.batch_layout()
    except ValueError as e:
        raise ConfigError(f"schema {where}: {e}") from e
    return schema


def data_options(config: TrainConfig) -> dict[str, Any]:
    """Reader settings shared by training and evaluation (schema, hashing space, bad-record policy, the labels
    the model accepts: :attr:`Model.labels <psflow.models.Model.labels>`, read from its class).

    With dynamic tables (``--embedding-table dynamic``) Criteo's categorical values keep their full 64-bit hashes
    (``num_features`` 0: no folding), the ids the tables are keyed by.

    Raises:
        ModelError: the model's class cannot be found (see :func:`psflow.models.model_class`).
    """
    return {
        "schema": data_schema(config),
        "num_features": _reader_id_space(config),
        "skip_bad_records": config.data.skip_bad_records,
        "max_bad_records": config.data.max_bad_records,
        "labels": model_class(config.model.name, search_path=config.model.path).labels,
    }


def dataset_config(config: TrainConfig, task_index: int, num_workers: int) -> DatasetConfig:
    """The data settings of worker ``task_index`` of ``num_workers``: its shard of the training files."""
    return DatasetConfig(
        paths=tuple(config.data.train),
        format=config.data.format,
        batch_size=config.data.batch_size,
        num_epochs=config.data.epochs,
        shuffle_buffer=config.data.shuffle_buffer,
        reader_process=config.data.reader_process,
        seed=config.data.seed,
        worker_index=task_index,
        num_workers=num_workers,
        **data_options(config),
    )


def _reader_id_space(config: TrainConfig) -> int:
    """The ``num_features`` the readers hash into: 0 (raw 64-bit ids) for Criteo with dynamic tables."""
    return 0 if DYNAMIC_TABLE_PARAM in config.model.params and config.data.format == "criteo" else config.data.num_features


def model_config(config: TrainConfig, schema: Schema | None = None) -> ModelConfig:
    """The model's config: the data's features (from the format and ``schema``, default
    :func:`data_schema`) and the run's model settings."""
    features = batch_spec(config.data.format, schema if schema is not None else data_schema(config), config.data.num_features)
    return ModelConfig(features=features, num_features=config.data.num_features, partitions=config.cluster.partitions,
                       embedding_dim=config.model.embedding_dim, params=dict(config.model.params), seed=config.data.seed)


def declare_variables(model: Model, setter: DeviceSetter, *, moving_average_decay: float | None = None) -> VariableSet:
    """The model's variables, declared in its order and placed by ``setter``; ``moving_average_decay``: the
    run's (``--moving-average-decay``), for the variables that do not declare their own
    (:meth:`~psflow.models.api.VariableSpec.average_decay`).

    Raises:
        ModelError: a variable the placement refuses (names the model and the variable).
    """
    variables = VariableSet(setter)
    for spec in model.variables():
        try:
            optimizer = spec.optimizer.to_json() if spec.optimizer is not None else None
            with variables.device(spec.device) if spec.device is not None else contextlib.nullcontext():
                placement = variables.get_variable(
                    spec.name, spec.shape, dtype=spec.dtype, initializer=dict(spec.initializer), partitioner=spec.partitioner,
                    optimizer=optimizer, trainable=spec.trainable,
                    dynamic=dict(spec.dynamic) if spec.dynamic is not None else None,
                    moving_average_decay=spec.average_decay(moving_average_decay))
            if spec.dynamic is not None:  # refused here, naming the table, before any ps task sees it
                share_spec(spec.name, spec.shape[1], spec.dynamic, optimizer=spec.optimizer, initializer=spec.initializer,
                           num_shares=len(placement.partitions))
        except (PlacementError, DynamicTableError) as e:
            raise ModelError(f"model {model.name!r}: {e}") from e
    return variables


def build_model(config: TrainConfig, cluster: ClusterSpec) -> tuple[Model, VariableSet]:
    """The run's model and its placed variables, as every process computes them.

    Raises:
        ModelError: unknown model, or one its config or the placement refuses.
        ConfigError: a malformed schema.
    """
    num_ps = cluster.num_tasks("ps")
    strategy = (
        GreedyLoadBalancingStrategy(num_ps, byte_size_load_fn)
        if config.cluster.placement == "greedy"
        else RoundRobinStrategy(num_ps)
    )
    model = create_model(config.model.name, model_config(config), search_path=config.model.path)
    configure_training(model, config)
    return model, declare_variables(model, replica_device_setter(cluster=cluster, ps_strategy=strategy),
                                    moving_average_decay=config.optimizer.moving_average_decay)


def configure_training(model: Model, config: TrainConfig) -> None:
    """Gives ``model`` the run's settings of its training steps: ``--clip-gradient-norm`` (replacing the clip
    norm the model declares, if given) and the devices of its towers (:meth:`Model.place`; cheap: a model
    builds its towers when it first computes).

    Raises:
        ModelError: the model cannot use those devices (a numpy model given a GPU or towers).
    """
    if config.optimizer.clip_gradient_norm is not None:
        model.clip_gradient_norm = config.optimizer.clip_gradient_norm
    model.place(config.compute_devices())


def model_record(config: TrainConfig) -> dict[str, Any]:
    """What checkpoints and exported models record of the model, so ``psflow predict`` can rebuild it.

    ``{"name", "config": ModelConfig dict, "data": {"format", "schema", "num_features"}}``.
    """
    schema = data_schema(config)
    return {
        "name": config.model.name,
        "config": model_config(config, schema).to_dict(),
        "data": {"format": config.data.format, "schema": schema.to_dict() if schema is not None else None,
                 "num_features": _reader_id_space(config)},
    }
