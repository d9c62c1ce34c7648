"""Variable initializers that do not depend on how a variable is partitioned.

An initializer is a small JSON-able dict, e.g. ``{"name": "zeros"}`` or
``{"name": "random_normal", "stddev": 0.01, "seed": 7}``; it travels to the ps
tasks, which create their partitions from it.

Guarantee: element ``k`` (flat index in the *whole* variable) gets the same
value whichever partition holds it and whichever ps task creates it, because
random values come from a counter-based hash of ``(seed, k)`` rather than from
a stream. So 1, 2 or 4 partitions of a variable hold the same numbers, and
every ps task computes its part without talking to the others.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from psflow.errors import PsError

__all__ = ["CONSTANT_INITIALIZERS", "InitializerError", "INITIALIZER_NAMES", "initial_rows", "initial_rows_many",
           "initial_value", "validate_initializer"]

INITIALIZER_NAMES = ("zeros", "ones", "constant", "random_uniform", "random_normal", "truncated_normal", "glorot_uniform")
#: The initializers that give every element the same value (the others compute each from its flat index).
CONSTANT_INITIALIZERS = frozenset({"zeros", "ones", "constant"})
_PARAMS: dict[str, dict[str, float]] = {
    "zeros": {},
    "ones": {},
    "constant": {"value": 0.0},
    "random_uniform": {"minval": -0.05, "maxval": 0.05, "seed": 0},
    "random_normal": {"mean": 0.0, "stddev": 0.05, "seed": 0},
    "truncated_normal": {"mean": 0.0, "stddev": 0.05, "seed": 0},
    "glorot_uniform": {"seed": 0},
}


class InitializerError(PsError, ValueError):
    """An initializer spec is unknown or has bad parameters."""


def validate_initializer(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Returns ``spec`` with defaults filled in.

    Raises:
        InitializerError: unknown name or parameter, or a non-numeric value.
    """
    name = spec.get("name")
    if name not in _PARAMS:
        raise InitializerError(f"unknown initializer {name!r} (known: {', '.join(INITIALIZER_NAMES)})")
    params = dict(_PARAMS[name])
    for key, value in spec.items():
        if key == "name":
            continue
        if key not in params:
            raise InitializerError(f"initializer {name!r}: unknown parameter {key!r} (accepted: {', '.join(params) or 'none'})")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise InitializerError(f"initializer {name!r}: parameter {key!r} must be a number, got {value!r}")
        params[key] = value
    return {"name": name, **params}


def _uniform_at(seed: int, k: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) doubles for the flat indices ``k`` (uint64)."""
    out: np.ndarray = _uniform_streams((seed,), k)[0]
    return out


def _uniform_streams(seeds: tuple[int, ...], k: np.ndarray) -> np.ndarray:
    """``[len(seeds), k.size]``: row ``i`` holds :func:`_uniform_at` ``(seeds[i], k)``, the streams mixed in one
    pass (a lazy row's build is a few hundred elements, where each numpy call's overhead is the cost). Integer
    arithmetic, wrapping, then one exact conversion: the same bits as one stream at a time."""
    offsets = np.array([(seed * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) % (1 << 64) for seed in seeds], dtype=np.uint64)
    return _mixed(k, offsets[:, None])


def _stream_offsets(seeds: np.ndarray) -> np.ndarray:
    """The offset each seed (uint64: the seed modulo 2**64) adds to a stream, as :func:`_uniform_streams` computes
    it from a Python int (wrapping arithmetic is arithmetic modulo 2**64: the same bits)."""
    with np.errstate(over="ignore"):
        out: np.ndarray = seeds * np.uint64(0xBF58476D1CE4E5B9) + np.uint64(0x94D049BB133111EB)
    return out


def _mixed(k: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Uniform [0, 1) doubles of the flat indices ``k`` (uint64) in the streams of ``offsets`` (uint64, ``[s, 1]``:
    one offset per stream, or ``[s, k.size]``: one per element)."""
    with np.errstate(over="ignore"):
        z = (k * np.uint64(0x9E3779B97F4A7C15))[None, :] + offsets
        z ^= z >> np.uint64(30)
        z *= np.uint64(0xBF58476D1CE4E5B9)
        z ^= z >> np.uint64(27)
        z *= np.uint64(0x94D049BB133111EB)
        z ^= z >> np.uint64(31)
    z >>= np.uint64(11)
    out: np.ndarray = z.astype(np.float64)
    out *= 1.0 / (1 << 53)
    return out


def initial_value(
    spec: Mapping[str, Any], full_shape: tuple[int, ...], row_start: int, row_stop: int, dtype: str = "float32"
) -> np.ndarray:
    """Values of rows ``row_start:row_stop`` of a variable of ``full_shape``.

    Args:
        spec: initializer spec (validated here).
        full_shape: shape of the whole (unpartitioned) variable.
        row_start: first row of the partition.
        row_stop: one past its last row.
        dtype: numpy dtype name.

    Returns:
        A new writable array of shape ``(row_stop - row_start, *full_shape[1:])``.
    """
    p = validate_initializer(spec)
    shape = (row_stop - row_start, *full_shape[1:])
    row_size = int(np.prod(full_shape[1:], dtype=np.int64)) if len(full_shape) > 1 else 1
    count = int(np.prod(shape, dtype=np.int64))
    start = row_start * row_size
    name = p["name"]
    if name == "zeros":
        return np.zeros(shape, dtype=dtype)
    if name == "ones":
        return np.ones(shape, dtype=dtype)
    if name == "constant":
        return np.full(shape, p["value"], dtype=dtype)
    # Random values are computed _CHUNK elements at a time into the result: the float64 and uint64
    # temporaries (about ten live at once) then take a few MiB instead of ~10x the variable's float32
    # bytes, which a ps task's heap kept after initialization. Every element is a function of (seed, k)
    # alone, so the values do not depend on the chunking (tests/unit/ps/test_initializer_memory.py).
    out = np.empty(count, dtype=dtype)
    for lo in range(0, count, _CHUNK):
        n = min(_CHUNK, count - lo)
        out[lo:lo + n] = _random_values(p, full_shape, np.arange(start + lo, start + lo + n, dtype=np.uint64)).astype(dtype)
    return out.reshape(shape)


def initial_rows(spec: Mapping[str, Any], full_shape: tuple[int, ...], rows: np.ndarray, dtype: str = "float32") -> np.ndarray:
    """Values of the rows ``rows`` (int64 row indices in the *whole* variable, any order) of a variable of
    ``full_shape``: row ``i`` of the result is bit-equal to row ``rows[i]`` of :func:`initial_value` (every
    element is a function of the seed and its flat index alone). What a lazily created partition
    (:mod:`psflow.ps.lazy_rows`) builds a row from on its first touch.

    Returns:
        A new array of shape ``(rows.size, *full_shape[1:])``.
    """
    p = validate_initializer(spec)
    shape = (int(rows.size), *full_shape[1:])
    name = p["name"]
    if name in CONSTANT_INITIALIZERS:
        return np.full(shape, {"zeros": 0.0, "ones": 1.0}.get(name, p.get("value", 0.0)), dtype=dtype)
    row_size = int(np.prod(full_shape[1:], dtype=np.int64)) if len(full_shape) > 1 else 1
    k = (rows.astype(np.uint64)[:, None] * np.uint64(row_size) + np.arange(row_size, dtype=np.uint64)).reshape(-1)
    out = np.empty(k.size, dtype=dtype)
    for lo in range(0, k.size, _CHUNK):
        out[lo:lo + _CHUNK] = _random_values(p, full_shape, k[lo:lo + _CHUNK]).astype(dtype)
    return out.reshape(shape)


def initial_rows_many(requests: Sequence[tuple[Mapping[str, Any], tuple[int, ...], np.ndarray]],
                      dtype: str = "float32") -> list[np.ndarray]:
    """:func:`initial_rows` of each ``(spec, full_shape, rows)`` of ``requests``, bit for bit, computed together.

    The random initializers of one kind (uniform: random_uniform and glorot_uniform; random_normal;
    truncated_normal) go through one pass of numpy calls for all their requests, each element's seed,
    scale and shift taken from its request: the rows a lazy partition builds on first touch are a few
    dozen a table in a step, so per-call overhead, not arithmetic, is what 26 separate calls cost (W&D's
    deep tables). The arithmetic is the same per element (wrapping integer hashes, then the same float64
    operations in the same order), so each result is bit-equal to its own :func:`initial_rows` call.

    Returns:
        One new array per request, in order, of shape ``(rows.size, *full_shape[1:])``.

    Raises:
        InitializerError: a spec is unknown or has bad parameters (nothing is computed then).
    """
    checked = [validate_initializer(spec) for spec, _, _ in requests]
    out: list[np.ndarray | None] = [None] * len(requests)
    kinds: dict[str, list[int]] = {}
    for i, p in enumerate(checked):
        kind = _KINDS.get(p["name"])
        if kind is None or requests[i][2].size == 0:
            out[i] = initial_rows(p, requests[i][1], requests[i][2], dtype)
        else:
            kinds.setdefault(kind, []).append(i)
    for kind, members in kinds.items():
        flat = _kind_values(kind, [(checked[i], requests[i][1], requests[i][2]) for i in members], dtype)
        for i, piece in zip(members, flat, strict=True):
            out[i] = piece
    return [o for o in out if o is not None]


#: The random initializers computed together by :func:`initial_rows_many`, by the draw they transform.
_KINDS = {"random_uniform": "uniform", "glorot_uniform": "uniform", "random_normal": "normal",
          "truncated_normal": "truncated"}


def _affine(p: Mapping[str, Any], full_shape: tuple[int, ...]) -> tuple[float, float]:
    """``(a, b)``: the validated random ``p``'s values are ``a + b * draw`` (a uniform or normal draw), in
    :func:`_random_values` and :func:`_kind_values` alike."""
    name = p["name"]
    if name == "random_uniform":
        lo, hi = float(p["minval"]), float(p["maxval"])
        return lo, hi - lo
    if name == "glorot_uniform":
        fan_in = full_shape[0]
        fan_out = full_shape[1] if len(full_shape) > 1 else full_shape[0]
        limit = float(np.sqrt(6.0 / max(1, fan_in + fan_out)))
        return -limit, 2 * limit
    return float(p["mean"]), float(p["stddev"])


def _kind_values(kind: str, requests: list[tuple[Mapping[str, Any], tuple[int, ...], np.ndarray]],
                 dtype: str) -> list[np.ndarray]:
    """:func:`initial_rows_many` of requests of one kind (none of them empty), the elements of all of them in one
    stream of numpy calls, :data:`_CHUNK` at a time."""
    row_sizes = [math.prod(shape[1:]) for _, shape, _ in requests]  # (np.prod: ~5 us a call)
    counts = np.array([rows.size * size for (_, _, rows), size in zip(requests, row_sizes, strict=True)], dtype=np.int64)
    all_rows = np.concatenate([rows for _, _, rows in requests]).astype(np.uint64)
    k: np.ndarray
    if min(row_sizes) == max(row_sizes):
        size = np.uint64(row_sizes[0])
        k = (all_rows[:, None] * size + np.arange(row_sizes[0], dtype=np.uint64)).reshape(-1)
    else:  # each row's flat indices: its first element's, then +1 up to its row size
        per_row = np.repeat(np.array(row_sizes, dtype=np.int64), [rows.size for _, _, rows in requests])
        firsts = (np.cumsum(per_row) - per_row).astype(np.uint64)
        k = np.repeat(all_rows * per_row.astype(np.uint64), per_row) + (
            np.arange(int(counts.sum()), dtype=np.uint64) - np.repeat(firsts, per_row))
    which = np.repeat(np.arange(len(requests)), counts)  # each element's request
    affine = np.array([_affine(p, shape) for p, shape, _ in requests], dtype=np.float64)
    seeds = np.array([int(p["seed"]) % (1 << 64) for p, _, _ in requests], dtype=np.uint64)
    values = np.empty(k.size, dtype=dtype)
    for lo in range(0, k.size, _CHUNK):
        part_k, part_of = k[lo:lo + _CHUNK], which[lo:lo + _CHUNK]
        if kind == "uniform":
            draw = _mixed(part_k, _stream_offsets(seeds)[part_of][None, :])[0]
        else:
            draw = _normal_of(part_k, seeds, part_of)
            if kind == "truncated":
                draw = _truncated(draw, part_k, seeds, part_of)
        a, b = affine[part_of, 0], affine[part_of, 1]
        values[lo:lo + part_k.size] = (a + b * draw).astype(dtype)
    pieces = np.split(values, np.cumsum(counts)[:-1])
    return [piece.reshape(rows.size, *shape[1:]) for piece, (_, shape, rows) in zip(pieces, requests, strict=True)]


def _normal_of(k: np.ndarray, seeds: np.ndarray, which: np.ndarray) -> np.ndarray:
    """:func:`_standard_normal` of each element ``k[i]`` with the seed ``seeds[which[i]]`` (uint64 seeds)."""
    offsets = np.stack((_stream_offsets(seeds)[which], _stream_offsets(seeds ^ np.uint64(0x5DEECE66D))[which]))
    u1, u2 = _mixed(k, offsets)
    z: np.ndarray = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
    return z


def _truncated(z: np.ndarray, k: np.ndarray, seeds: np.ndarray, which: np.ndarray) -> np.ndarray:
    """``z`` redrawn as :func:`_random_values` redraws a truncated normal's, each element in its own seed's streams."""
    for redraw in range(1, 9):
        outside = np.flatnonzero(np.abs(z) > 2.0)
        if outside.size == 0:
            break
        with np.errstate(over="ignore"):
            shifted = seeds + np.uint64(redraw * 0x632BE5AB)
        z[outside] = _normal_of(k[outside], shifted, which[outside])
    out: np.ndarray = np.minimum(np.maximum(z, -2.0, out=z), 2.0, out=z)  # np.clip's values, without its wrapper
    return out


#: Elements of a random initializer computed at a time: its temporaries are 256 KiB arrays (a
#: multiple of every SIMD width, so vector loops split a partition's elements as without chunks).
_CHUNK = 1 << 15


def _random_values(p: Mapping[str, Any], full_shape: tuple[int, ...], k: np.ndarray) -> np.ndarray:
    """float64 values of a validated random initializer ``p`` at the flat indices ``k`` (uint64)."""
    seed = int(p["seed"])
    a, b = _affine(p, full_shape)
    if _KINDS[p["name"]] == "uniform":
        out: np.ndarray = a + b * _uniform_at(seed, k)
        return out
    z = _standard_normal(seed, k)
    if p["name"] == "truncated_normal":
        # TF's truncated_normal: a draw more than 2 stddev from the mean is drawn again. Here the
        # redraws are further counter-based streams (seed + r), so every element stays a function of
        # (seed, k) alone; after 8 redraws (probability 0.0455**9, about 1e-12) the draw is clipped.
        for redraw in range(1, 9):
            outside = np.flatnonzero(np.abs(z) > 2.0)
            if outside.size == 0:
                break
            z[outside] = _standard_normal(seed + redraw * 0x632BE5AB, k[outside])
        z = np.clip(z, -2.0, 2.0)
    out = a + b * z
    return out


def _standard_normal(seed: int, k: np.ndarray) -> np.ndarray:
    """Standard normal doubles for the flat indices ``k`` (uint64): Box-Muller on two independent uniform streams."""
    u1, u2 = _uniform_streams((seed, seed ^ 0x5DEECE66D), k)
    z: np.ndarray = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
    return z
