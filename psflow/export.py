"""``psflow export`` and ``psflow predict``: the trained model in a portable form.

An exported model is a directory::

    model.safetensors   every variable, whole (partitions joined; no optimizer slots); a dynamic
                        table NAME as its rows sorted by id, NAME [n, dim], and their ids, NAME@ids [n] int64
    model.json          {"format": "psflow-model", "format_version": 2,
                         "model": NAME,                 the registry name or package.module:Class
                         "model_config": {...},         its ModelConfig (features, table sizes, params)
                         "data": {"format", "schema", "num_features"},   how its data is read
                         "variables": {name: {"shape", "dtype"}}, "global_step": S,
                                        (a dynamic table: {"shape": [n, dim], "dtype", "dynamic": true,
                                         "rows": n}; its NAME@ids is not listed)
                         "checkpoint": path, "psflow_version": ...,
                         "moving_averages": {"in_place": bool, "variables": [name, ...],
                                             "file": "moving_averages.safetensors"},   (only with averages)
                         "files": {FILE: {"size": bytes, "sha256": hex}}}   each .safetensors file written
    moving_averages.safetensors   the moving averages of the averaged variables (TensorFlow's
                        ExponentialMovingAverage shadows, psflow.ps.averages), by variable name, when the
                        checkpoint holds them and the export is not --moving-averages

``psflow export --moving-averages`` writes each averaged variable's moving
average in place of the variable in ``model.safetensors`` (the others as they
are; ``"in_place": true``), as TensorFlow restores the shadows into the
variables for evaluation: whoever reads that file gets the averages.
``psflow predict --moving-averages`` scores with the averages of an export
that holds them (either way); without the flag it scores ``model.safetensors``.

Each file is written atomically (temp file, fsync, rename; one put each in an
object store), model.json last. An export into a directory holding an earlier
one first removes its model.json (and its moving_averages.safetensors where
the new export writes none): an export cut short (a full disk, a signal) leaves
a directory that is refused as no export, never the new variables read with the
earlier model.json. model.json's ``files`` ties the other files to it: the size
and sha256 of the bytes written. :func:`load_model` checks the bytes it loads
(one read of each file) and refuses a file that differs, naming it: a reader
during another export into the directory (``psflow predict`` while ``psflow
export`` runs), or two exports at once, get one export whole or a refusal,
never one export's model.json with another's variables or averages; a damaged
file is refused too. An export written by a psflow before the sums (no
``files``) still loads, unchecked. The check is
:func:`psflow.checkpoint.export_files.checked_tensors`, which a warm start
from an export (``--warm-start DIR``) makes too.

The checkpoint, the export's directory and the data scored may be URLs of an
object store (``s3://``, ``gs://``; see :mod:`psflow.storage`): export reads a
checkpoint there and may write its directory there, and predict reads an
export and data from there. The model's
name, config and data settings come from the checkpoint's manifest (the chief
records them with every save). ``psflow predict MODEL DATA`` rebuilds the
model through the registry (a user's ``package.module:Class`` is imported
from the current directory, and only if the user names it too, ``--model``
or ``--trust-model-module``: a model.json is data and may come from anyone,
see :func:`psflow.models.registry.trusted_model`), reads the data as training read it (the
recorded format and schema, unless ``--format`` says otherwise) and scores it
with :func:`psflow.train.evaluation.predict`: the same code and the same float32
values as the cluster's evaluation, so the same outputs.

Ids a model never saw in training are scored as the model scores them: a
hashed feature always lands on a row of its table; an id outside a table's
vocabulary is refused, naming the feature, the table and the id; a dynamic
table (``--embedding-table dynamic``) scores an id it never held with a zero
row (zeros, exactly as the ps tasks read it in the cluster's evaluation), so
e.g. logistic regression gives an example of only such ids ``sigmoid(bias)``.

Checkpoints and exports written before models were recorded (format version 1:
sparse logistic regression only) are still read
(:func:`psflow.models.logistic.legacy_config` recognizes them).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import numpy as np
from safetensors.numpy import save as safetensors_save

from psflow import jsonio, storage
from psflow.checkpoint.export_files import checked_tensors, files_problem
from psflow.checkpoint.manifest import Manifest, read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import DYNAMIC_IDS, averaged_variables, read_variables
from psflow.data import FORMATS, Batch, BatchSpec, DataError, Schema, batch_spec, read_all
from psflow.errors import CheckpointError
from psflow.models.api import Model, ModelConfig, ModelError
from psflow.models.logistic import legacy_config
from psflow.models.registry import create_model, trusted_model
from psflow.train.evaluation import ArrayParameters
from psflow.train.evaluation import predict as predict_outputs

__all__ = ["ExportedModel", "export_model", "load_checkpoint_model", "load_model", "predict_file", "MODEL_FORMAT"]

MODEL_FORMAT = "psflow-model"
FORMAT_VERSION = 2
#: The file of an export holding the moving averages beside the variables.
AVERAGES_FILE = "moving_averages.safetensors"


@dataclass(frozen=True)
class ExportedModel:
    """A loaded exported model: the model, its variables, and how its data is read."""

    model: Model
    values: dict[str, np.ndarray]
    global_step: int
    data: dict[str, Any]

    def outputs(self, batch: Batch) -> dict[str, np.ndarray]:
        """The model's outputs for ``batch`` (``predictions``, and e.g. ``logits``)."""
        return predict_outputs(self.model, ArrayParameters(self.values, what="the exported model"), batch)

    def read(self, path: str | list[str], format: str | None = None) -> Batch:
        """Every example of ``path`` (file(s)), read as the model's training data was (or in ``format``)."""
        fmt = format or self.data.get("format") or "libsvm"
        schema = self.data.get("schema")
        recorded = self.data.get("num_features")
        options: dict[str, Any] = {"num_features": int(recorded if recorded is not None else self.model.config.num_features),
                                   "labels": None}  # predictions do not use labels: an unlabelled file's are not checked
        if fmt == "tfrecord" and schema:
            try:
                options["schema"] = Schema.from_dict(schema)
            except ValueError as e:  # a hand-edited model.json
                raise DataError(f"the model's recorded schema: {e}") from e
        return read_all(path if isinstance(path, list) else [path], fmt, **options)

    def predict(self, path: str | list[str], format: str | None = None) -> np.ndarray:
        """``predictions`` for every example of ``path`` (file(s)), in file order."""
        return self.outputs(self.read(path, format))["predictions"]


def _resolve_checkpoint(path: str) -> str:
    storage.check_location(path)  # an unknown scheme or a missing client: one line naming the path given
    if storage.exists(os.path.join(path, "manifest.json")):
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise CheckpointError(f"{path}: no complete checkpoint (neither a checkpoint nor a directory holding one)")
    return latest


def _model_record(path: str, manifest: Manifest, variables: dict[str, np.ndarray]) -> dict[str, Any]:
    """The checkpoint's model record; for a checkpoint written before models were recorded, logistic regression."""
    if manifest.model is not None:
        return manifest.model
    config = legacy_config({name: tuple(v.shape) for name, v in variables.items()})
    if config is None:
        raise CheckpointError(f"checkpoint {path} does not say which model wrote it (variables: {', '.join(variables)})")
    return {"name": "logistic", "config": config.to_dict(),
            "data": {"format": None, "schema": None, "num_features": config.num_features}}


def _variables_record(variables: Mapping[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    """model.json's ``variables``: name -> shape and dtype; a dynamic table (``name`` beside ``name@ids``) also
    says ``"dynamic": true`` and its ``"rows"``, and its ids are not listed as a variable."""
    out: dict[str, dict[str, Any]] = {}
    for name, value in variables.items():
        if name.endswith(DYNAMIC_IDS) and name.removesuffix(DYNAMIC_IDS) in variables:
            continue
        entry: dict[str, Any] = {"shape": list(value.shape), "dtype": str(value.dtype)}
        if f"{name}{DYNAMIC_IDS}" in variables:
            entry.update(dynamic=True, rows=int(value.shape[0]))
        out[name] = entry
    return out


def _no_averages(where: str) -> CheckpointError:
    return CheckpointError(f"{where} holds no moving averages: train with --moving-average-decay D (or a model "
                           "whose variables declare moving_average_decay)")


def export_model(checkpoint: str, out_dir: str, *, moving_averages: bool = False) -> str:
    """Writes the model of ``checkpoint`` (a checkpoint, or a checkpoint directory: its newest) to ``out_dir``.

    ``moving_averages``: the averaged variables' moving averages in place of the variables (see the module
    docstring); without it, the averages a checkpoint holds go to ``moving_averages.safetensors`` beside.

    Returns:
        The checkpoint exported.

    Raises:
        CheckpointError: no complete checkpoint, one that does not say which model wrote it, one whose
            model record holds a NaN or infinite setting (JSON cannot hold it), or (``moving_averages``)
            one without moving averages: each before ``out_dir`` is touched.
        OSError: ``out_dir`` cannot be written (an earlier export there is no longer one: see the module docstring).
    """
    path = _resolve_checkpoint(checkpoint)
    manifest = read_manifest(path)
    averaged = averaged_variables(manifest)
    if moving_averages and not averaged:
        raise _no_averages(f"checkpoint {path}")
    variables = read_variables(path, moving_averages=moving_averages)
    record = _model_record(path, manifest, variables)
    beside = averaged and not moving_averages  # the averages go to their own file
    files = {"model.safetensors": safetensors_save(variables)}
    if beside:
        shadows = read_variables(path, moving_averages=True)
        files[AVERAGES_FILE] = safetensors_save({n: shadows[n] for n in averaged})
    meta = {
        "format": MODEL_FORMAT,
        "format_version": FORMAT_VERSION,
        "model": record["name"],
        "model_config": record["config"],
        "data": record.get("data") or {},
        "variables": _variables_record(variables),
        "global_step": manifest.global_step,
        "checkpoint": storage.absolute(path),
        "psflow_version": manifest.psflow_version,
    }
    if averaged:
        meta["moving_averages"] = {"in_place": moving_averages, "variables": averaged,
                                   **({"file": AVERAGES_FILE} if beside else {})}
    meta["files"] = {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
    meta_path = os.path.join(out_dir, "model.json")
    try:
        text = jsonio.dumps(meta, nonfinite="error", what=meta_path, indent=1)
    except ValueError as e:  # a NaN or infinite setting in the checkpoint's model record
        raise CheckpointError(f"checkpoint {path}: {e}") from e
    storage.makedirs(out_dir)  # all read and checked: from here on, the directory is written
    _remove_earlier(meta_path, *(() if beside else (os.path.join(out_dir, AVERAGES_FILE),)))
    for name, data in files.items():  # model.safetensors, then the averages
        storage.write_atomically(os.path.join(out_dir, name), data)
    storage.write_atomically(meta_path, text.encode())
    return path


def _remove_earlier(*paths: str) -> None:
    """Removes an earlier export's files ``paths`` where present (model.json first): an export cut short after
    this leaves no model.json, so the directory is refused as no export, never loaded as a mix of two."""
    for path in paths:
        if storage.exists(path):
            storage.remove(path)


def load_model(model_dir: str, *, search_path: str | None = None, moving_averages: bool = False,
               model: str | None = None, trust_model_module: bool = False) -> ExportedModel:
    """Loads an exported model and rebuilds it through the registry.

    A user's ``package.module:Class`` that model.json names is imported only if ``model`` names it too or
    ``trust_model_module`` (see :func:`psflow.models.registry.trusted_model`); the check imports nothing.

    Args:
        model_dir: a directory written by :func:`export_model`.
        search_path: where a user's ``package.module:Class`` is imported from
            (default: the current directory).
        moving_averages: the averaged variables' moving averages in place of
            the variables (an export holding them, either way).
        model: the model the user named (``psflow predict --model``).
        trust_model_module: import whatever module model.json names.

    An export records each file's size and sha256 in model.json; a file read that differs (another export into
    ``model_dir`` meanwhile, or damage) is refused. An export written before the sums loads unchecked.

    Raises:
        CheckpointError: missing files or not a psflow model (names the file), a file that is not the one
            model.json names (names the directory and the file: export again), or (``moving_averages``)
            an export without moving averages.
        ModelError: the model cannot be rebuilt (unknown name, module not found, a
            module the user did not name), or its variables differ from the exported ones.
    """
    meta_path = os.path.join(model_dir, "model.json")
    try:
        meta = json.loads(storage.read_bytes(meta_path))
        raw = storage.read_bytes(os.path.join(model_dir, "model.safetensors"))  # its only read: checked, then loaded
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{model_dir}: not an exported psflow model: {e}") from e
    if not isinstance(meta, dict) or meta.get("format") != MODEL_FORMAT:
        raise CheckpointError(f"{meta_path}: format {meta.get('format') if isinstance(meta, dict) else meta!r}; "
                              f"expected {MODEL_FORMAT!r}")
    problem = _meta_problem(meta)
    if problem is not None:
        raise CheckpointError(f"{meta_path}: {problem}")
    tensors = checked_tensors(model_dir, meta, "model.safetensors", raw)
    del raw  # the tensors are copies: not held while the averages are read
    if "model_config" in meta:
        data = dict(meta.get("data") or {})
        config = _in_data_order(ModelConfig.from_dict(meta["model_config"]), data)
    else:  # format version 1: logistic regression only
        legacy = legacy_config({name: tuple(t.shape) for name, t in tensors.items()})
        if legacy is None:
            raise CheckpointError(f"{meta_path}: a version 1 export of something other than logistic regression")
        config, data = legacy, {"num_features": legacy.num_features}
    name = trusted_model(str(meta.get("model")), meta_path, named=model, trust_module=trust_model_module)
    if moving_averages:
        tensors = _with_averages(model_dir, meta, dict(tensors))
    built = _rebuild(name, config, tensors, model_dir, search_path)
    return ExportedModel(built, dict(tensors), int(meta["global_step"]), data)


def _meta_problem(meta: Mapping[str, Any]) -> str | None:
    """What is wrong with the shape of model.json's fields (a hand-edited or foreign file), or None."""
    kinds: dict[str, type | tuple[type, ...]] = {"model": str, "model_config": dict, "data": (dict, type(None)),
                                                 "moving_averages": (dict, type(None)), "files": dict}
    for key, kind in kinds.items():
        if key in meta and not isinstance(meta[key], kind):
            return f"field {key!r} is {type(meta[key]).__name__} {meta[key]!r:.60}; not a model.json psflow export wrote"
    step = meta.get("global_step")
    if type(step) is not int or step < 0:
        return f"field 'global_step' is {step!r:.40}, not a step; not a model.json psflow export wrote"
    averaged = (meta.get("moving_averages") or {}).get("variables", [])
    if not (isinstance(averaged, list) and all(isinstance(name, str) for name in averaged)):
        return f"field 'moving_averages' names variables {averaged!r:.60}; not a model.json psflow export wrote"
    files = files_problem(meta)
    if files is not None:
        return files
    data = meta.get("data") or {}
    if data.get("format") not in (None, *FORMATS) or not isinstance(data.get("schema"), (dict, type(None))) \
            or not isinstance(data.get("num_features"), (int, type(None))):
        return f"field 'data' is {data!r:.200}: not how psflow reads data; not a model.json psflow export wrote"
    return None



def _with_averages(model_dir: str, meta: Mapping[str, Any], tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An export's variables with the moving averages in place of the averaged ones (see :func:`load_model`)."""
    averages = meta.get("moving_averages")
    if not isinstance(averages, dict) or not averages.get("variables"):
        raise _no_averages(f"exported model {model_dir}")
    if averages.get("in_place") is True:
        return tensors
    file_name = str(averages.get("file") or AVERAGES_FILE)
    path = os.path.join(model_dir, file_name)
    try:
        data = storage.read_bytes(path)  # its only read: checked, then loaded
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read the export's moving averages: {e}") from e
    shadows = checked_tensors(model_dir, meta, file_name, data)
    for name in averages["variables"]:
        shadow, value = shadows.get(name), tensors.get(name)
        if shadow is None or value is None or shadow.shape != value.shape or shadow.dtype != value.dtype:
            raise CheckpointError(f"{path}: no moving average of variable {name!r} of shape "
                                  f"{None if value is None else tuple(value.shape)}")
        tensors[name] = shadow
    return tensors


def _in_data_order(config: ModelConfig, data: Mapping[str, Any]) -> ModelConfig:
    """``config`` with Criteo's features in the data's order (I1..I13, C1..C26).

    Checkpoints written before this was fixed kept their manifest's keys sorted, which put the recorded features in
    name order (C1, C10, C11, ...): a model rebuilt from them would read the dense columns in another order than
    it was trained with. Criteo's order is fixed, so it is put back; other formats keep the recorded order.
    """
    if data.get("format") != "criteo":
        return config
    canonical = batch_spec("criteo", None, 1)
    features = config.features
    if set(features.sparse) != set(canonical.sparse) or set(features.dense) != set(canonical.dense):
        return config
    ordered = BatchSpec({n: features.sparse[n] for n in canonical.sparse}, {n: features.dense[n] for n in canonical.dense})
    return dataclasses.replace(config, features=ordered)


def _rebuild(name: str, config: ModelConfig, values: Mapping[str, np.ndarray], where: str,
             search_path: str | None) -> Model:
    """The model ``name`` built from ``config``, checked against ``values`` (the exported or checkpointed variables).

    A static variable must hold exactly its spec's shape. A dynamic table (spec shape ``(0, dim)``, ``dynamic``
    set) must hold ``name`` ``[n, dim]`` float32 with ``name@ids`` ``[n]`` int64 beside it, any ``n``.

    Raises:
        ModelError: the model cannot be built, or ``values`` lack one of its variables, hold one it does not
            declare, or hold one of another shape or kind (names each).
    """
    model = create_model(name, config, search_path=search_path or os.getcwd())
    specs = {spec.name: spec for spec in model.variables()}
    problems: list[str] = []
    expected: set[str] = set()
    for spec in specs.values():
        value = values.get(spec.name)
        ids_name = f"{spec.name}{DYNAMIC_IDS}"
        if spec.dynamic is not None:
            expected.update((spec.name, ids_name))
            dim = tuple(spec.shape[1:])
            ids = values.get(ids_name)
            if value is None or ids is None:
                missing = " and ".join(repr(n) for n, v in ((spec.name, value), (ids_name, ids)) if v is None)
                problems.append(f"dynamic table {spec.name!r} (rows of shape {dim}): {missing} missing")
            elif value.ndim != 2 or tuple(value.shape[1:]) != dim or ids.ndim != 1 or ids.shape[0] != value.shape[0]:
                problems.append(f"dynamic table {spec.name!r} has rows of shape {dim}; it holds rows "
                                f"{tuple(value.shape)} and ids {tuple(ids.shape)}")
            elif ids.dtype != np.int64:
                problems.append(f"dynamic table {spec.name!r}: its ids {ids_name!r} are {ids.dtype}, not int64")
            continue
        expected.add(spec.name)
        if value is None:
            problems.append(f"{spec.name!r} of shape {tuple(spec.shape)} missing")
        elif ids_name in values:
            problems.append(f"{spec.name!r} is a static variable of shape {tuple(spec.shape)}; it holds a dynamic "
                            f"table of {tuple(value.shape)} rows")
        elif tuple(value.shape) != tuple(spec.shape):
            problems.append(f"{spec.name!r} has shape {tuple(spec.shape)}; it holds {tuple(value.shape)}")
    extra = sorted(set(values) - expected)
    if extra:
        problems.append(f"variables it does not declare: {', '.join(repr(n) for n in extra)}")
    if problems:
        want = {n: ("dynamic", *s.shape[1:]) if s.dynamic is not None else tuple(s.shape) for n, s in specs.items()}
        raise ModelError(f"{where}: model {model.name!r} has variables {want}; it holds "
                         f"{ {n: tuple(t.shape) for n, t in values.items()} }: " + "; ".join(problems))
    return model


def load_checkpoint_model(checkpoint: str, *, search_path: str | None = None, moving_averages: bool = False,
                          model: str | None = None, trust_model_module: bool = False) -> ExportedModel:
    """The model of a checkpoint (or of a checkpoint directory: its newest), as :func:`load_model` loads an
    export: rebuilt through the registry from the manifest's model record, with the checkpoint's variables
    (partitions joined; no optimizer slots; ``moving_averages``: the moving averages in place of the averaged
    variables). Reads files only: no ps task is involved. A user's module the manifest names is imported only
    if ``model`` (the run's ``--model``) names it too, or ``trust_model_module``.

    Raises:
        CheckpointError: no complete checkpoint, one that does not say which model wrote it, or
            (``moving_averages``) one without moving averages.
        ModelError: the model cannot be rebuilt (a module the user did not name, too), or its variables
            differ from the checkpoint's.
    """
    path = _resolve_checkpoint(checkpoint)
    manifest = read_manifest(path)
    if moving_averages and not averaged_variables(manifest):
        raise _no_averages(f"checkpoint {path}")
    variables = read_variables(path, moving_averages=moving_averages)
    record = _model_record(path, manifest, variables)
    name = trusted_model(str(record["name"]), os.path.join(path, "manifest.json"), named=model,
                         trust_module=trust_model_module)
    data = dict(record.get("data") or {})
    built = _rebuild(name, _in_data_order(ModelConfig.from_dict(record["config"]), data), variables, path, search_path)
    return ExportedModel(built, variables, manifest.global_step, dict(record.get("data") or {}))


def predict_file(model_dir: str, data: list[str], *, format: str | None = None, out: TextIO | None = None,
                 moving_averages: bool = False, model: str | None = None,
                 trust_model_module: bool = False) -> np.ndarray:
    """Scores ``data`` with the exported model (``moving_averages``: with its moving averages; ``model``,
    ``trust_model_module``: see :func:`load_model`); writes one line of predictions per example to ``out``
    (default stdout): nothing for data without records."""
    probs = load_model(model_dir, moving_averages=moving_averages, model=model,
                       trust_model_module=trust_model_module).predict(data, format)
    stream = out if out is not None else sys.stdout
    rows = probs.reshape(probs.shape[0], int(np.prod(probs.shape[1:])))  # no records: no lines (-1 cannot size 0 rows)
    stream.write("".join(" ".join(f"{p:.17g}" for p in row) + "\n" for row in rows.tolist()))
    stream.flush()
    return probs
