"""Schema inference: a TFRecord schema guessed from a file's first records.

``--format tfrecord`` without ``--schema`` or ``--feature`` reads the first
:data:`SAMPLE_RECORDS` records of the first training file (sorted, after glob
expansion) and builds the schema from what they hold, key by key:

* the label key (``--label``, default ``label``): a float or int64 list with
  one value in every record that has it -> a scalar FixedLenFeature;
* a float list with the same number ``k >= 1`` of values in every record that
  has it -> a dense FixedLenFeature (``shape ()`` for ``k = 1``, else
  ``[k]``), float32, ``default 0.0``.  When every sampled value is integral
  and ``>= 0`` and some value is ``> 1`` the feature is taken as a count and
  gets ``normalizer: log1p`` (the transform ``--format criteo`` applies to
  its count columns); any other float feature gets no normalizer.  A float
  list whose length varies is left out (named in the notes; describe it in
  a schema, e.g. as the values of a ``kind: sparse`` feature);
* an int64 list -> an id list (VarLenFeature int64) in the run's id space
  ``[0, --num-features)``; a sampled id outside it is an error that says so
  (raise ``--num-features``, or write a schema with ``vocabulary_size``);
* a bytes list -> strings hashed into ``--num-features`` buckets
  (VarLenFeature string with ``hash_buckets``);
* a VarLen feature missing from some sampled record is marked ``optional``.

Files holding ``ids`` (int64) and ``values`` (float) keys are the sparse-LR
layout: they get :func:`~psflow.data.schema.default_sparse_schema` (with the
label key asked for), as before inference existed, whatever else they hold.

The features come label first, then the dense ones, then the sparse ones,
each in natural name order (``I2`` before ``I10``), so ``I1..I13`` /
``C1..C26`` give the batch layout of ``--format criteo``.  Bad input is an error naming the file (and the feature): no
records, no label key, a key that is a float list in some records and an
int64 list in others, a label with several values.

``psflow schema infer FILE [--num-features N] [--label KEY] > schema.yaml``
writes the inferred schema for editing; pass it back with ``--schema``.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import logging
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from psflow import jsonio, storage
from psflow.data.api import BadRecordError, DataError
from psflow.data.batch import DEFAULT_SPARSE_FEATURE
from psflow.data.example_pb import example_class
from psflow.data.features import FeatureSpec, FixedLenFeature, SparseFeature, VarLenFeature
from psflow.data.schema import Schema, default_sparse_schema, yaml
from psflow.data.sharding import expand_paths
from psflow.data.tfrecord import read_records

__all__ = ["SAMPLE_RECORDS", "InferredSchema", "infer_schema", "infer_first_file", "schema_yaml",
           "add_schema_arguments", "run_schema"]

log = logging.getLogger(__name__)

#: Records read from the start of the file to infer its schema.
SAMPLE_RECORDS = 1000

_KINDS = {"float_list": "float", "int64_list": "int64", "bytes_list": "bytes"}


@dataclass(frozen=True)
class InferredSchema:
    """A schema inferred from a file, and how.

    Attributes:
        schema: the schema.
        path: the file read.
        records: records sampled (at most the ``sample`` asked for).
        num_features: the id space / hash buckets the sparse features got.
        sparse_lr: the file has the sparse-LR layout (``ids`` and ``values``
            keys): ``schema`` is :func:`~psflow.data.schema.default_sparse_schema`
            with the label found.
        notes: keys left out, and why.
    """

    schema: Schema
    path: str
    records: int
    num_features: int
    sparse_lr: bool = False
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def is_default(self) -> bool:
        """The schema is exactly :func:`~psflow.data.schema.default_sparse_schema` (what a reader
        uses when it is given no schema)."""
        return self.schema == default_sparse_schema()

    def describe(self) -> str:
        """A readable block: the file, then one line per kind of feature."""
        lines = [f"inferred TFRecord schema from {self.path} (first {self.records} records):"]
        label = self.schema.label_key
        if label is not None:
            spec = self.schema.features[label]
            lines.append(f"  label: {label} ({spec.dtype if isinstance(spec, FixedLenFeature) else spec})")
        if self.sparse_lr:
            lines.append("  sparse-LR layout (ids/values keys): the default schema, sparse feature "
                         f"{DEFAULT_SPARSE_FEATURE!r} from ids + values")
        groups: dict[str, list[str]] = {}
        for name, spec in self.schema.features.items():
            if name == label or isinstance(spec, SparseFeature):
                continue
            if isinstance(spec, FixedLenFeature):
                shape = "" if spec.shape == () else f"[{'x'.join(map(str, spec.shape))}]"
                group = f"dense float32, normalizer {spec.normalizer or 'none'}"
                groups.setdefault(group, []).append(name + shape)
            elif spec.dtype == "int64":
                groups.setdefault(f"ids int64, id space {self.num_features}", []).append(name + ("?" if spec.optional else ""))
            else:
                groups.setdefault(f"strings hashed into {spec.hash_buckets} buckets", []).append(
                    name + ("?" if spec.optional else ""))
        for group, names in groups.items():
            lines.append(f"  {group} ({len(names)}): {' '.join(names)}")
        if any(name.endswith("?") for names in groups.values() for name in names):
            lines.append("  (? : optional, absent from some sampled records)")
        lines.extend(f"  left out: {note}" for note in self.notes)
        return "\n".join(lines)


@dataclass
class _KeyStats:
    """What the sampled records hold under one key."""

    kinds: dict[str, int] = field(default_factory=dict)  # kind -> first record index with it
    present: int = 0
    counts: set[int] = field(default_factory=set)  # distinct value counts
    integral: bool = True  # float: every value finite, integral and >= 0
    max_value: float = -math.inf
    min_id: int | None = None
    max_id: int | None = None

    def add(self, row: int, kind: str, values: Sequence[Any]) -> None:
        self.kinds.setdefault(kind, row)
        self.present += 1
        self.counts.add(len(values))
        if not len(values) or kind == "bytes":
            return
        if kind == "float":
            v = np.asarray(values, dtype=np.float64)
            if self.integral and not bool(np.all(np.isfinite(v) & (v >= 0) & (v == np.floor(v)))):
                self.integral = False
            self.max_value = max(self.max_value, float(np.nanmax(v)) if not np.all(np.isnan(v)) else -math.inf)
        else:
            lo, hi = min(values), max(values)
            self.min_id = lo if self.min_id is None else min(self.min_id, lo)
            self.max_id = hi if self.max_id is None else max(self.max_id, hi)


def _counts(got: _KeyStats) -> str:
    shown = sorted(got.counts)
    return ", ".join(map(str, shown[:6])) + (", ..." if len(shown) > 6 else "")


def _natural(name: str) -> list[Any]:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name) if part]


def _sample(path: str, sample: int) -> tuple[int, dict[str, _KeyStats]]:
    if sample < 1:
        raise ValueError(f"sample must be >= 1, got {sample}")
    example = example_class(check_utf8=False)
    stats: dict[str, _KeyStats] = {}
    records = 0
    try:
        for row, data in enumerate(itertools.islice(read_records(path), sample)):
            records += 1
            _add_record(path, row, example, data, stats)
    except BadRecordError as e:
        if records == 0:
            raise DataError(f"{e} (is it a TFRecord file?); cannot infer a schema") from e
        raise
    return records, stats


def _add_record(path: str, row: int, example: Any, data: bytes, stats: dict[str, _KeyStats]) -> None:
    try:
        features = example.FromString(data).features.feature
    except Exception as e:  # protobuf's DecodeError
        raise DataError(f"{path}: record {row}: not a tf.train.Example ({e}); cannot infer a schema") from None
    for key, feature in features.items():
        kind = feature.WhichOneof("kind")
        if kind is not None:
            stats.setdefault(str(key), _KeyStats()).add(row, _KINDS[kind], getattr(feature, kind).value)


def _label_spec(path: str, label: str, stats: dict[str, _KeyStats], records: int) -> FixedLenFeature:
    got = stats.get(label)
    if got is None:
        keys = ", ".join(sorted(stats, key=_natural)[:20]) or "none"
        raise DataError(f"{path}: no label key {label!r} in the first {records} records (keys: {keys}); "
                        "name the label with --label KEY, or write a schema (--schema)")
    kind = next(iter(got.kinds))
    if kind == "bytes" or got.counts != {1}:
        raise DataError(f"{path}: label {label!r} must be one float or int64 per record, the first {records} records "
                        f"hold {kind} lists of {_counts(got)} values")
    return FixedLenFeature((), "float32" if kind == "float" else "int64")


def _feature_spec(path: str, name: str, got: _KeyStats, records: int, num_features: int) -> FeatureSpec | str:
    """The spec of one key, or why it is left out."""
    kind = next(iter(got.kinds))
    optional = got.present < records
    if kind == "float":
        counts = got.counts - {0}  # an empty list takes the default, as a missing one
        if len(counts) != 1:
            return (f"{name!r}: float lists of {_counts(got)} values, not a fixed count; describe it in a schema "
                    "(e.g. as the values_key of a kind: sparse feature)")
        width = counts.pop()
        counts_like = got.integral and got.max_value > 1
        return FixedLenFeature(() if width == 1 else (width,), "float32", 0.0, normalizer="log1p" if counts_like else None)
    if kind == "int64":
        if got.min_id is not None and got.max_id is not None and (got.min_id < 0 or got.max_id >= num_features):
            bad = got.min_id if got.min_id < 0 else got.max_id
            need = f"raise --num-features to at least {got.max_id + 1}, or " if got.min_id >= 0 else ""
            raise DataError(f"{path}: feature {name!r}: id {bad} in the first {records} records is outside the id space "
                            f"[0, {num_features}) (--num-features) of inferred id features; {need}write a schema "
                            "(--schema) that reads the feature as you want")
        return VarLenFeature("int64", optional=optional)
    return VarLenFeature("bytes", hash_buckets=num_features, optional=optional)


def infer_schema(path: str, *, num_features: int = 1 << 20, label: str = "label", sample: int = SAMPLE_RECORDS) -> InferredSchema:
    """Infers the schema of a TFRecord file from its first ``sample`` records (rules: the module docstring).

    Raises:
        DataError: the file cannot be read, has no records, lacks the label,
            holds a key of two kinds, an id outside ``[0, num_features)``...
            (names the file and the feature).
    """
    records, stats = _sample(path, sample)
    if not records:
        raise DataError(f"{path}: the file has no records; cannot infer a schema")
    for name, got in stats.items():
        if len(got.kinds) > 1:
            (a, ra), (b, rb) = sorted(got.kinds.items(), key=lambda kv: kv[1])[:2]
            raise DataError(f"{path}: feature {name!r} is a {a} list in record {ra} and a {b} list in record {rb}; "
                            "mixed types cannot be inferred: write a schema (--schema) that says which to read")
    label_spec = _label_spec(path, label, stats, records)
    ids, values = stats.get("ids"), stats.get("values")
    if ids is not None and values is not None and set(ids.kinds) == {"int64"} and set(values.kinds) == {"float"}:
        default = default_sparse_schema()
        schema = Schema({label: label_spec, DEFAULT_SPARSE_FEATURE: default.features[DEFAULT_SPARSE_FEATURE]}, label)
        return InferredSchema(schema, path, records, num_features, sparse_lr=True)
    dense: dict[str, FeatureSpec] = {}
    sparse: dict[str, FeatureSpec] = {}
    notes: list[str] = []
    for name in sorted(stats, key=_natural):
        if name == label:
            continue
        spec = _feature_spec(path, name, stats[name], records, num_features)
        if isinstance(spec, str):
            notes.append(spec)
        else:
            (dense if isinstance(spec, FixedLenFeature) else sparse)[name] = spec
    schema = Schema({label: label_spec, **dense, **sparse}, label)
    return InferredSchema(schema, path, records, num_features, notes=tuple(notes))


@functools.lru_cache(maxsize=16)
def _cached(path: str, stamp: tuple[Any, ...], num_features: int, label: str, sample: int) -> InferredSchema:
    inferred = infer_schema(path, num_features=num_features, label=label, sample=sample)
    log.info("%s", inferred.describe())
    for note in inferred.notes:
        log.warning("schema inference left a key out: %s", note)
    return inferred


def infer_first_file(patterns: Sequence[str], *, num_features: int = 1 << 20, label: str = "label",
                     sample: int = SAMPLE_RECORDS) -> InferredSchema:
    """:func:`infer_schema` of the first file the patterns match (sorted); cached per file version,
    and logged (INFO) the first time.

    Raises:
        DataError: as :func:`infer_schema`, or no file matches.
    """
    path = expand_paths(list(patterns))[0]
    try:
        stamp = storage.version(path)
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e.strerror or e}") from e
    return _cached(path, stamp, num_features, label, sample)


def schema_yaml(inferred: InferredSchema, *, header: bool = True) -> str:
    """The inferred schema as YAML that :meth:`Schema.from_file` reads, one feature a line, with comments."""
    data = inferred.schema.to_dict()
    out: list[str] = []
    if header:
        out.append(f"# Inferred by psflow from the first {inferred.records} records of {inferred.path}.")
        out.append("# Check it: normalizer: log1p marks counts; optional: true, features absent from some records.")
        out.append(f"# int64 features: ids in [0, {inferred.num_features}); string features: hashed into that many buckets "
                   "(--num-features).")
        out.append("# Edit it, and pass it to psflow train with --schema FILE.")
        out.extend(f"# Left out: {note}" for note in inferred.notes)
    out.append(yaml.safe_dump({"label": data["label"]}).rstrip("\n"))
    out.append("features:")
    for name, entry in data["features"].items():
        out.append("  " + yaml.safe_dump({name: entry}, sort_keys=False, default_flow_style=True, width=1 << 16)[1:-2])
    return "\n".join(out) + "\n"


def add_schema_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds ``psflow schema``'s subcommands (``infer``) to ``parser``."""
    sub = parser.add_subparsers(dest="schema_command", required=True)
    infer = sub.add_parser("infer", help="print the schema inferred from a TFRecord file, as YAML for --schema")
    infer.add_argument("file", help="a TFRecord file (or a glob: its first file, sorted)")
    infer.add_argument("--num-features", type=int, default=1 << 20,
                       help="id space of int64 features and hash buckets of string features (2^20), as psflow train's")
    infer.add_argument("--label", default="label", help="the label's Example key (label)")
    infer.add_argument("--sample", type=int, default=SAMPLE_RECORDS,
                       help=f"records read from the start of the file ({SAMPLE_RECORDS})")
    infer.add_argument("--json", action="store_true", help="print JSON instead of YAML")


def run_schema(args: argparse.Namespace) -> int:
    """Runs ``psflow schema infer``: the schema on stdout, the summary on stderr; returns the exit status."""
    if args.num_features < 1 or args.sample < 1:
        print("psflow schema infer: error: --num-features and --sample must be >= 1", file=sys.stderr)
        return 1
    try:
        inferred = infer_first_file([args.file], num_features=args.num_features, label=args.label, sample=args.sample)
    except DataError as e:
        print(f"psflow schema infer: error: {e}", file=sys.stderr)
        return 1
    print(inferred.describe(), file=sys.stderr)
    if args.json:
        print(jsonio.dumps(inferred.schema.to_dict(), nonfinite="error", what="the schema", indent=1))
    else:
        sys.stdout.write(schema_yaml(inferred))
    return 0
