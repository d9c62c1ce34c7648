"""Schema: which features of a ``tf.train.Example`` to parse, and how they become a batch.

The three feature kinds mirror ``tf.io.parse_example``:

* :class:`FixedLenFeature` -- exactly ``prod(shape)`` values per example; a
  missing (or empty) feature takes ``default``, or makes the record bad when
  there is no default.  Numeric ones are *dense* batch features (the label is
  a scalar one).  A float32 one may name a ``normalizer``, as TF's
  ``numeric_column(normalizer_fn=...)``, applied to its values (the default
  included) at parse time, in float64 rounded to float32:
  ``log1p`` (``log(1 + v)``, for counts: TF's ``tf.math.log1p``; where TF
  gives -inf or NaN, for a value ``<= -1``, psflow makes the record bad,
  naming the feature, so with ``--skip-bad-records`` it is skipped and
  otherwise the run stops naming file, record and feature; NaN stays NaN),
  ``signed_log1p`` (``sign(v) * log(1 + |v|)``, what ``--format criteo``
  applies to its integer columns, for counts that may be negative) or
  ``none`` (the default).  An unknown name is a schema error naming the
  feature; the label takes no normalizer.
* :class:`VarLenFeature` -- any number of values, kept in stored order:
  ``int64``, an id list (a *sparse* batch feature, values 1.0; with
  ``vocabulary_size`` every id must lie in ``[0, vocabulary_size)``, else the
  record is bad); ``string`` (``bytes``), a categorical feature whose strings
  are hashed into ``[0, hash_buckets)``, each feature into its own id space,
  as TensorFlow's ``categorical_column_with_hash_bucket`` does (a sparse batch
  feature; see :func:`~psflow.data.hashing.hash_strings` -- the ids differ from
  TensorFlow's FarmHash ones); ``float32`` is no batch feature by itself (pair
  the values with their ids in a SparseFeature).
* :class:`SparseFeature` -- two Example keys read together: ``ids_key``
  (int64 list) and ``values_key`` (float list, the ids' weights) of equal
  length per example; ``values_key=None`` means every value is 1.0.  A sparse
  batch feature.

Dtypes are ``"int64"``, ``"float32"`` and ``"bytes"`` (``"string"``,
``"float"`` and ``"int"`` are accepted as spellings of the same).

A batch (:class:`~psflow.data.batch.Batch`) gets the label (``label_key``),
every sparse feature in ``Batch.sparse`` and every dense one in
``Batch.dense``, in schema order (:meth:`Schema.batch_layout`);
:meth:`Schema.batch_spec` gives the id space of each sparse feature
(``vocabulary_size``, ``hash_buckets`` or the run's ``--num-features``) and
the width of each dense one.

A VarLen or Sparse feature that no record of a file's first chunk (its first
``block_size`` bytes of records) has is taken as a schema error, not as data:
reading stops with a :class:`~psflow.data.api.DataError` naming the feature and
the file.  Mark features that may be absent from many records in a row
``optional``.

On disk a schema is JSON or YAML, e.g. Criteo-like data::

    label: label
    features:
      label: {kind: fixed, dtype: float32}                  # a scalar
      I1:    {kind: fixed, dtype: float32, default: 0.0, normalizer: log1p}   # ... I13: dense, [n]
      C1:    {kind: varlen, dtype: int64, vocabulary_size: 1048576}   # ... C26: ids
      site:  {kind: varlen, dtype: string, hash_buckets: 100000, optional: true}
      query: {kind: sparse, ids_key: query_ids, values_key: query_weights, vocabulary_size: 50000}
      emb:   {kind: fixed, shape: [4, 8], dtype: float32, default: 0.0}

or, on the command line (:meth:`Schema.from_flags`)::

    --feature I1:float:log1p --feature C1:int64:1048576 --feature site:string:100000
    --feature query:sparse:query_ids:query_weights:50000 --feature emb:float:4x8

Without either, ``--format tfrecord`` infers the schema from the first
records of the first training file (:mod:`~psflow.data.infer`; rules there):
the label (``--label``, default ``label``), float features with a fixed
value count as dense (counts -- integral, >= 0, some > 1 -- with
``normalizer: log1p``), int64 ones as id lists in ``--num-features`` ids,
strings hashed into ``--num-features`` buckets; files with ``ids`` and
``values`` keys get :func:`default_sparse_schema`.  ``psflow schema infer
FILE > schema.yaml`` writes the inferred schema out for editing.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from psflow.data.batch import DEFAULT_SPARSE_FEATURE, BatchSpec
from psflow.data.criteo import CAT_FEATURES, INT_FEATURES
from psflow.data.features import (
    FeatureSpec,
    FixedLenFeature,
    SparseFeature,
    VarLenFeature,
    canonical_dtype,
    parse_feature_flag,
    spec_from_dict,
    spec_to_dict,
)

# PyYAML ships no type information; it is used for two calls, typed Any here.
yaml: Any = importlib.import_module("yaml")

__all__ = [
    "FixedLenFeature",
    "VarLenFeature",
    "SparseFeature",
    "FeatureSpec",
    "Schema",
    "default_sparse_schema",
    "canonical_dtype",
    "batch_spec",
]


@dataclass(frozen=True)
class Schema:
    """Named feature specs plus which one is the label.

    Attributes:
        features: output name -> spec.  For FixedLen and VarLen features the
            output name is also the Example key; a SparseFeature names its
            two Example keys itself.
        label_key: name of the label feature (a scalar int64/float32
            FixedLenFeature), or ``None`` (batches then get 0.0 labels).
    """

    features: Mapping[str, FeatureSpec] = field(default_factory=dict)
    label_key: str | None = "label"

    def __post_init__(self) -> None:
        object.__setattr__(self, "features", dict(self.features))
        if self.label_key is not None:
            spec = self.features.get(self.label_key)
            if not isinstance(spec, FixedLenFeature) or spec.size != 1 or spec.dtype == "bytes":
                raise ValueError(f"schema label {self.label_key!r} must be a scalar int64 or float32 FixedLenFeature, got {spec!r}")
            if spec.normalizer is not None:
                raise ValueError(f"schema label {self.label_key!r} takes no normalizer, got {spec.normalizer!r}")

    def example_keys(self) -> dict[str, str]:
        """Returns Example key -> wanted dtype for every key the schema reads.

        Raises:
            ValueError: one key is wanted with two different dtypes.
        """
        keys: dict[str, str] = {}

        def want(key: str, dtype: str) -> None:
            if keys.setdefault(key, dtype) != dtype:
                raise ValueError(f"schema reads Example key {key!r} both as {keys[key]} and as {dtype}")

        for name, spec in self.features.items():
            if isinstance(spec, SparseFeature):
                want(spec.ids_key, "int64")
                if spec.values_key is not None:
                    want(spec.values_key, "float32")
            else:
                want(name, spec.dtype)
        return keys

    def batch_layout(self) -> tuple[list[str], list[str]]:
        """Returns (sparse feature names, dense feature names), in schema order, the label excluded.

        Sparse: every SparseFeature, int64 VarLenFeature and hashed string
        VarLenFeature.  Dense: every numeric FixedLenFeature.

        Raises:
            ValueError: naming a feature a :class:`~psflow.data.batch.Batch` has no
                place for (a float32 VarLenFeature, a string one without
                ``hash_buckets``, a bytes FixedLenFeature).
        """
        sparse: list[str] = []
        dense: list[str] = []
        for name, spec in self.features.items():
            if name == self.label_key:
                continue
            if isinstance(spec, SparseFeature):
                sparse.append(name)
            elif isinstance(spec, VarLenFeature):
                if spec.dtype == "float32":
                    raise ValueError(f"feature {name!r}: a float32 VarLenFeature is not a batch feature by itself; "
                                     "pair the values with their ids in a SparseFeature (kind: sparse)")
                if spec.dtype == "bytes" and spec.hash_buckets is None:
                    raise ValueError(f"feature {name!r}: a string VarLenFeature needs hash_buckets to be a batch feature")
                sparse.append(name)
            elif spec.dtype == "bytes":
                raise ValueError(f"feature {name!r}: a bytes FixedLenFeature is not a batch feature (batches hold "
                                 "numbers); read it as a string VarLenFeature with hash_buckets")
            else:
                dense.append(name)
        return sparse, dense

    def batch_spec(self, num_features: int) -> BatchSpec:
        """The batches' features and sizes (see the module docstring).

        Args:
            num_features: id space of sparse features without ``vocabulary_size``.

        Raises:
            ValueError: as :meth:`batch_layout`.
        """
        sparse_names, dense_names = self.batch_layout()
        sparse = {name: _id_space(self.features[name]) or num_features for name in sparse_names}
        dense = {name: _fixed(self.features[name]).size for name in dense_names}
        return BatchSpec(sparse, dense)

    def presence_keys(self) -> dict[str, list[str]]:
        """Non-optional VarLen and Sparse features -> the Example keys a file must show (see the module docstring)."""
        out: dict[str, list[str]] = {}
        for name, spec in self.features.items():
            if isinstance(spec, VarLenFeature) and not spec.optional:
                out[name] = [name]
            elif isinstance(spec, SparseFeature) and not spec.optional:
                out[name] = [spec.ids_key] + ([spec.values_key] if spec.values_key is not None else [])
        return out

    @staticmethod
    def from_flags(specs: Sequence[str], label: str | None = "label") -> Schema:
        """Builds a schema from ``--feature SPEC`` flags, in order, plus the label.

        Each SPEC is one of::

            NAME:int64[:VOCAB]                            ids (VarLen), vocabulary_size VOCAB
            NAME:string:BUCKETS                           strings hashed into BUCKETS ids
            NAME:float[:D1[xD2...]][:NORMALIZER]          dense (FixedLen, required), scalar by default;
                                                          NORMALIZER log1p, signed_log1p or none
            NAME:sparse:IDS_KEY[:VALUES_KEY[:VOCAB]]      SparseFeature (VALUES_KEY empty: all 1.0)

        Args:
            specs: the flags' values.
            label: name of the label, added as a required float32 scalar
                FixedLenFeature unless a SPEC names it; ``None`` for no label.

        Raises:
            ValueError: naming the bad SPEC.
        """
        features: dict[str, FeatureSpec] = {}
        if label is not None:
            features[label] = FixedLenFeature((), "float32")
        named: set[str] = set()
        for spec in specs:
            try:
                name, feature = parse_feature_flag(spec)
            except ValueError as e:
                raise ValueError(f"--feature {spec!r}: {e}") from None
            if name in named:
                raise ValueError(f"--feature {spec!r}: feature {name!r} is named twice")
            named.add(name)
            features[name] = feature
        return Schema(features, label)

    def to_dict(self) -> dict[str, Any]:
        """Returns the JSON/YAML form read by :meth:`from_dict` (options left at their default are left out)."""
        return {"label": self.label_key, "features": {name: spec_to_dict(spec) for name, spec in self.features.items()}}

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Schema:
        """Builds a schema from its dict form (see the module docstring).

        Raises:
            ValueError: naming the offending feature.
        """
        features: dict[str, FeatureSpec] = {}
        raw = data.get("features")
        if not isinstance(raw, Mapping):
            raise ValueError(f"schema needs a 'features' mapping, got {raw!r}")
        for name, entry in raw.items():
            if not isinstance(entry, Mapping):
                raise ValueError(f"schema feature {name!r}: expected a mapping, got {entry!r}")
            try:
                features[str(name)] = spec_from_dict(entry)
            except (TypeError, ValueError) as e:
                raise ValueError(f"schema feature {name!r}: {e}") from e
        return Schema(features, data.get("label", "label"))

    @staticmethod
    def from_file(path: str | Path) -> Schema:
        """Reads a schema from a ``.json`` file, or YAML for any other suffix.

        Raises:
            ValueError: the file does not parse or describes an invalid schema.
            OSError: the file cannot be read.
        """
        text = Path(path).read_text(encoding="utf-8")
        try:
            data = json.loads(text) if str(path).endswith(".json") else yaml.safe_load(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: cannot parse schema: line {e.lineno}, column {e.colno}: {e.msg}") from e
        except yaml.YAMLError as e:
            raise ValueError(f"{path}: cannot parse schema: {_yaml_problem(e)}") from e
        if not isinstance(data, Mapping):
            raise ValueError(f"{path}: schema must be a mapping, got {type(data).__name__}")
        try:
            return Schema.from_dict(data)
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from e


def _yaml_problem(error: yaml.YAMLError) -> str:
    """A YAML error on one line, ``line L, column C: problem (context)`` (PyYAML's own message spans
    several, with a snippet of the text)."""
    problem, context = getattr(error, "problem", None), getattr(error, "context", None)
    if not problem:
        return " ".join(str(error).split())
    mark = getattr(error, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return where + (f"{problem} ({context})" if context else str(problem))


def default_sparse_schema() -> Schema:
    """The sparse-LR schema: ``label`` float scalar; the sparse feature
    :data:`~psflow.data.batch.DEFAULT_SPARSE_FEATURE` read from the Example keys
    ``ids`` (int64) and ``values`` (float32).

    This is what :func:`psflow.data.convert.convert` writes and what TFRecord
    datasets use when the config names no schema.
    """
    return Schema(
        {
            "label": FixedLenFeature((), "float32"),
            DEFAULT_SPARSE_FEATURE: SparseFeature("ids", "values"),
        },
        label_key="label",
    )


def _id_space(spec: FeatureSpec) -> int | None:
    """A sparse feature's own id space (hash buckets or vocabulary), if it declares one."""
    if isinstance(spec, VarLenFeature) and spec.hash_buckets is not None:
        return spec.hash_buckets
    return None if isinstance(spec, FixedLenFeature) else spec.vocabulary_size


def _fixed(spec: FeatureSpec) -> FixedLenFeature:
    if not isinstance(spec, FixedLenFeature):
        raise TypeError(f"not a FixedLenFeature: {spec!r}")
    return spec


def batch_spec(format: str, schema: Schema | None, num_features: int) -> BatchSpec:
    """The features and sizes of a dataset's batches, without reading it.

    Args:
        format: ``"libsvm"`` (one sparse feature :data:`~psflow.data.batch.DEFAULT_SPARSE_FEATURE`),
            ``"criteo"`` (dense ``I1``..``I13`` of width 1, sparse ``C1``..``C26``)
            or ``"tfrecord"`` (``schema``, default :func:`default_sparse_schema`).
        schema: the TFRecord schema (ignored for the text formats).
        num_features: id space of sparse features without their own size.

    Raises:
        ValueError: unknown format, or a schema that does not fit a batch.
    """
    if format == "libsvm":
        return BatchSpec({DEFAULT_SPARSE_FEATURE: num_features}, {})
    if format == "criteo":
        return BatchSpec(dict.fromkeys(CAT_FEATURES, num_features), dict.fromkeys(INT_FEATURES, 1))
    if format == "tfrecord":
        return (schema or default_sparse_schema()).batch_spec(num_features)
    raise ValueError(f"unknown format {format!r}; use libsvm, tfrecord or criteo")
