"""The feature kinds of a schema, as in ``tf.io.parse_example``, and their text forms.

:class:`FixedLenFeature`, :class:`VarLenFeature` and :class:`SparseFeature`
(what each means in a batch: :mod:`~psflow.data.schema`); :data:`NORMALIZERS`
-- the transforms a dense feature may apply at parse time;
:func:`spec_from_dict` / :func:`spec_to_dict` -- one feature's YAML/JSON
entry; :func:`parse_feature_flag` -- one ``--feature NAME:KIND[:...]`` flag.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "FixedLenFeature",
    "VarLenFeature",
    "SparseFeature",
    "FeatureSpec",
    "NORMALIZERS",
    "canonical_dtype",
    "canonical_normalizer",
    "signed_log1p",
    "spec_from_dict",
    "spec_to_dict",
    "parse_feature_flag",
]

_DTYPES = {
    "int64": "int64",
    "int": "int64",
    "float32": "float32",
    "float": "float32",
    "bytes": "bytes",
    "string": "bytes",
}


#: Normalizers of a float32 FixedLenFeature (``normalizer:`` in a schema), as TF's
#: ``numeric_column(normalizer_fn=...)``, applied to the parsed values (defaults included), each
#: computed in float64 and rounded to float32:
#:
#: * ``log1p`` -- ``log(1 + v)`` (``tf.math.log1p``), for counts.  A value ``<= -1`` (where log1p
#:   is -inf or NaN) makes the record bad, naming the feature; NaN stays NaN.
#: * ``signed_log1p`` -- ``sign(v) * log(1 + |v|)``, what ``--format criteo`` applies to its
#:   integer columns; defined for every value (counts that may be negative).
#:
#: ``none`` (or no ``normalizer``) keeps the values as they are.
NORMALIZERS = ("log1p", "signed_log1p")


def signed_log1p(values: npt.ArrayLike) -> npt.NDArray[np.float32]:
    """``float32(sign(v) * log1p(|v|))``, computed in float64: the ``signed_log1p`` normalizer, and what
    ``--format criteo`` makes of its integer columns (one function, so the two agree bit for bit)."""
    wide = np.asarray(values).astype(np.float64)
    out: npt.NDArray[np.float32] = (np.sign(wide) * np.log1p(np.abs(wide))).astype(np.float32)
    return out


def canonical_normalizer(name: Any) -> str | None:
    """Returns a normalizer of :data:`NORMALIZERS`, or None for ``None``/``"none"``.

    Raises:
        ValueError: an unknown name.
    """
    if name is None or name == "none":
        return None
    if name not in NORMALIZERS:
        raise ValueError(f"unknown normalizer {name!r}; use {', '.join(NORMALIZERS)} or none")
    return str(name)


def canonical_dtype(dtype: str) -> str:
    """Returns ``"int64"``, ``"float32"`` or ``"bytes"`` for an accepted spelling.

    Raises:
        ValueError: unknown dtype.
    """
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unknown feature dtype {dtype!r}; use one of int64, float32, bytes") from None


@dataclass(frozen=True)
class FixedLenFeature:
    """Exactly ``prod(shape)`` values per example.

    Attributes:
        shape: shape of one example's value; ``()`` for a scalar.
        dtype: ``"int64"``, ``"float32"`` or ``"bytes"``.
        default: used when the feature is missing or has no values: a scalar
            (broadcast to ``shape``) or a flat sequence of ``prod(shape)``
            values.  ``None`` makes the feature required.
        normalizer: float32 only: one of :data:`NORMALIZERS`, applied to the
            values (the default included) as they are parsed; ``None`` (or
            ``"none"``): the values as stored.
    """

    shape: tuple[int, ...] = ()
    dtype: str = "float32"
    default: Any = None
    normalizer: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        object.__setattr__(self, "normalizer", canonical_normalizer(self.normalizer))
        if any(d < 0 for d in self.shape):
            raise ValueError(f"FixedLenFeature shape must be non-negative, got {self.shape}")
        if self.normalizer is not None and self.dtype != "float32":
            raise ValueError(f"normalizer {self.normalizer} applies to float32 features, this one is {self.dtype}")

    @property
    def size(self) -> int:
        """Number of values per example."""
        return math.prod(self.shape)


def _check_size(what: str, value: int | None) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} must be an integer >= 1, got {value!r}")
    return value


@dataclass(frozen=True)
class VarLenFeature:
    """Any number of values per example, in stored order.

    Attributes:
        dtype: ``"int64"`` (ids), ``"bytes"`` (strings; spelled ``"string"`` too)
            or ``"float32"``.
        vocabulary_size: int64 only: ids must lie in ``[0, vocabulary_size)``
            (else the record is bad); the feature's id space.  ``None``: any id,
            the id space is the run's ``--num-features``.
        hash_buckets: bytes only, required to make it a batch feature: each
            string becomes ``hash_strings(s, name_salt(name)) % hash_buckets``
            (:mod:`~psflow.data.hashing`).  Without it the strings are decoded
            as bytes (:func:`~psflow.data.example.parse_examples` only).
        optional: the feature may be absent from every record of a file's first
            chunk (otherwise that is taken as a schema error).
    """

    dtype: str = "int64"
    vocabulary_size: int | None = field(default=None, kw_only=True)
    hash_buckets: int | None = field(default=None, kw_only=True)
    optional: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", canonical_dtype(self.dtype))
        _check_size("vocabulary_size", self.vocabulary_size)
        _check_size("hash_buckets", self.hash_buckets)
        if self.vocabulary_size is not None and self.dtype != "int64":
            raise ValueError(f"vocabulary_size applies to int64 features, this one is {self.dtype}")
        if self.hash_buckets is not None and self.dtype != "bytes":
            raise ValueError(f"hash_buckets applies to string features, this one is {self.dtype}")


@dataclass(frozen=True)
class SparseFeature:
    """An id list and a value list of equal length, read as one sparse feature.

    Attributes:
        ids_key: Example key of an int64 list.
        values_key: Example key of a float list (the ids' weights), or ``None``
            for all-1.0 values.
        vocabulary_size: ids must lie in ``[0, vocabulary_size)`` (else the record
            is bad); ``None``: any id, the id space is the run's ``--num-features``.
        optional: the feature may be absent from every record of a file's first chunk.
    """

    ids_key: str = "ids"
    values_key: str | None = "values"
    vocabulary_size: int | None = field(default=None, kw_only=True)
    optional: bool = field(default=False, kw_only=True)

    def __post_init__(self) -> None:
        _check_size("vocabulary_size", self.vocabulary_size)


FeatureSpec = FixedLenFeature | VarLenFeature | SparseFeature


_KEYS = {
    "fixed": {"kind", "shape", "dtype", "default", "normalizer"},
    "varlen": {"kind", "dtype", "vocabulary_size", "hash_buckets", "optional"},
    "sparse": {"kind", "ids_key", "values_key", "vocabulary_size", "optional"},
}


def spec_from_dict(entry: Mapping[str, Any]) -> FeatureSpec:
    """A feature spec from its YAML/JSON entry (see :mod:`~psflow.data.schema`).

    Raises:
        ValueError: an unknown kind or option, or an invalid value.
    """
    kind = entry.get("kind")
    if kind not in _KEYS:
        raise ValueError(f"kind must be fixed, varlen or sparse, got {kind!r}")
    unknown = sorted(set(entry) - _KEYS[kind])
    if unknown:
        raise ValueError(f"unknown option(s) {unknown} for kind {kind} (known: {sorted(_KEYS[kind] - {'kind'})})")
    if kind == "fixed":
        return FixedLenFeature(tuple(entry.get("shape", ())), entry.get("dtype", "float32"), entry.get("default"),
                               normalizer=entry.get("normalizer"))
    optional = entry.get("optional", False)
    if not isinstance(optional, bool):
        raise ValueError(f"optional must be true or false, got {optional!r}")
    if kind == "varlen":
        return VarLenFeature(entry.get("dtype", "int64"), vocabulary_size=entry.get("vocabulary_size"),
                             hash_buckets=entry.get("hash_buckets"), optional=optional)
    return SparseFeature(entry.get("ids_key", "ids"), entry.get("values_key", "values"),
                         vocabulary_size=entry.get("vocabulary_size"), optional=optional)


def spec_to_dict(spec: FeatureSpec) -> dict[str, Any]:
    """The YAML/JSON entry of a feature spec (options left at their default are left out)."""
    entry: dict[str, Any]
    if isinstance(spec, FixedLenFeature):
        entry = {"kind": "fixed", "shape": list(spec.shape), "dtype": spec.dtype}
        if spec.default is not None:
            entry["default"] = spec.default
        if spec.normalizer is not None:
            entry["normalizer"] = spec.normalizer
        return entry
    if isinstance(spec, VarLenFeature):
        entry = {"kind": "varlen", "dtype": spec.dtype}
        if spec.hash_buckets is not None:
            entry["hash_buckets"] = spec.hash_buckets
    else:
        entry = {"kind": "sparse", "ids_key": spec.ids_key, "values_key": spec.values_key}
    if spec.vocabulary_size is not None:
        entry["vocabulary_size"] = spec.vocabulary_size
    if spec.optional:
        entry["optional"] = True
    return entry


def _int(text: str, what: str) -> int:
    if not text.isdigit():
        raise ValueError(f"{what} must be a positive integer, got {text!r}")
    return int(text)


def parse_feature_flag(spec: str) -> tuple[str, FeatureSpec]:
    """One ``--feature`` value -> (name, spec) (see :meth:`~psflow.data.schema.Schema.from_flags`).

    Raises:
        ValueError: the reason, without the flag (the caller names it).
    """
    parts = spec.split(":")
    if len(parts) < 2 or not parts[0]:
        raise ValueError("want NAME:KIND[:...] with KIND int64, string, float or sparse")
    name, kind, args = parts[0], parts[1], parts[2:]
    limits = {"int64": 1, "int": 1, "string": 1, "bytes": 1, "float": 2, "float32": 2, "sparse": 3}
    if kind not in limits:
        raise ValueError(f"unknown kind {kind!r} (want int64, string, float or sparse)")
    if len(args) > limits[kind]:
        raise ValueError(f"too many fields for kind {kind}")
    if kind in ("int64", "int"):
        return name, VarLenFeature("int64", vocabulary_size=_int(args[0], "VOCAB") if args else None)
    if kind in ("string", "bytes"):
        if not args:
            raise ValueError("a string feature needs its hash bucket count: NAME:string:BUCKETS")
        return name, VarLenFeature("bytes", hash_buckets=_int(args[0], "BUCKETS"))
    if kind in ("float", "float32"):
        if len(args) == 1 and args[0][:1].isalpha():
            args = ["", args[0]]  # NAME:float:NORMALIZER
        shape = tuple(_int(d, "a dimension") for d in args[0].split("x")) if args and args[0] else ()
        return name, FixedLenFeature(shape, "float32", normalizer=args[1] if len(args) > 1 and args[1] else None)
    if not args or not args[0]:
        raise ValueError("a sparse feature needs its ids key: NAME:sparse:IDS_KEY[:VALUES_KEY[:VOCAB]]")
    values_key = args[1] if len(args) > 1 and args[1] else None
    vocab = _int(args[2], "VOCAB") if len(args) > 2 else None
    return name, SparseFeature(args[0], values_key, vocabulary_size=vocab)
