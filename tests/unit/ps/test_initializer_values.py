"""Initializer values are a fixed function of (seed, flat index): pinned against the formulas written out plainly.

psflow.ps.initializers computes them in fewer numpy passes (both Box-Muller streams in one), which must not
move a bit: a checkpoint, a lazy row built today and an eager partition built by an older psflow all hold the
same numbers. The reference below is the arithmetic of the module's docstring, one stream at a time.
"""

from __future__ import annotations

import numpy as np
import pytest

from psflow.ps.initializers import initial_rows, initial_value

pytestmark = pytest.mark.timeout(60)


def reference_uniform(seed: int, k: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = k * np.uint64(0x9E3779B97F4A7C15) + np.uint64((seed * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) % (1 << 64))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    out: np.ndarray = (z >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return out


def reference_normal(seed: int, k: np.ndarray) -> np.ndarray:
    u1 = reference_uniform(seed, k)
    u2 = reference_uniform(seed ^ 0x5DEECE66D, k)
    out: np.ndarray = np.sqrt(-2.0 * np.log1p(-u1)) * np.cos(2.0 * np.pi * u2)
    return out


def reference(spec: dict[str, float], full_shape: tuple[int, ...], k: np.ndarray) -> np.ndarray:
    seed = int(spec["seed"])
    if spec["name"] == "random_uniform":
        return spec["minval"] + (spec["maxval"] - spec["minval"]) * reference_uniform(seed, k)
    if spec["name"] == "glorot_uniform":
        limit = float(np.sqrt(6.0 / (full_shape[0] + full_shape[1])))
        return -limit + 2 * limit * reference_uniform(seed, k)
    z = reference_normal(seed, k)
    if spec["name"] == "truncated_normal":
        for redraw in range(1, 9):
            outside = np.flatnonzero(np.abs(z) > 2.0)
            if outside.size == 0:
                break
            z[outside] = reference_normal(seed + redraw * 0x632BE5AB, k[outside])
        z = np.clip(z, -2.0, 2.0)
    return spec["mean"] + spec["stddev"] * z


SPECS = [
    {"name": "truncated_normal", "mean": 0.0, "stddev": 0.35355339059327373, "seed": 7},
    {"name": "truncated_normal", "mean": 0.5, "stddev": 0.05, "seed": -3},
    {"name": "random_normal", "mean": 0.0, "stddev": 0.01, "seed": 1 << 40},
    {"name": "random_uniform", "minval": -0.05, "maxval": 0.05, "seed": 11},
    {"name": "glorot_uniform", "seed": 1001},
]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s['name']}-{s['seed']}")
@pytest.mark.parametrize("rows", [1, 7, 300, 5000])
def test_initial_rows_equal_the_formulas_bit_for_bit(spec: dict[str, float], rows: int) -> None:
    shape = (1 << 20, 8)
    picked = np.random.default_rng(rows).choice(shape[0], rows, replace=False).astype(np.int64)  # any order
    k = (picked.astype(np.uint64)[:, None] * np.uint64(8) + np.arange(8, dtype=np.uint64)).reshape(-1)
    want = reference(spec, shape, k).astype(np.float32).reshape(rows, 8)
    np.testing.assert_array_equal(initial_rows(spec, shape, picked), want)


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s['name']}-{s['seed']}")
def test_initial_value_equals_the_formulas_bit_for_bit(spec: dict[str, float]) -> None:
    shape = (70_001, 3)  # more elements than one chunk of the module's loop
    want = reference(spec, shape, np.arange(100 * 3, 70_001 * 3, dtype=np.uint64)).astype(np.float32).reshape(-1, 3)
    np.testing.assert_array_equal(initial_value(spec, shape, 100, 70_001), want)
