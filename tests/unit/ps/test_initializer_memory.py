"""Random initializers work in chunks: same values as in one piece, a bounded peak of temporaries (issue #13)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import psflow.ps.initializers as initializers
from psflow.ps.initializers import initial_value

RANDOM = [
    {"name": "random_uniform", "minval": -1, "maxval": 2, "seed": 3},
    {"name": "random_normal", "mean": 0.5, "stddev": 2.0, "seed": 11},
    {"name": "truncated_normal", "stddev": 0.35, "seed": 11},
    {"name": "glorot_uniform", "seed": 5},
]


@pytest.mark.parametrize("spec", RANDOM, ids=lambda s: str(s["name"]))
@pytest.mark.parametrize("chunk", [64, 1000, 1 << 15])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_chunked_initializer_values_are_bit_identical_to_one_piece(
    spec: dict[str, object], chunk: int, dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    shape, start, stop = (40_001, 3), 7, 39_998  # neither the partition nor its elements a multiple of a chunk
    monkeypatch.setattr(initializers, "_CHUNK", 1 << 40)
    whole = initial_value(spec, shape, start, stop, dtype)
    monkeypatch.setattr(initializers, "_CHUNK", chunk)
    chunked = initial_value(spec, shape, start, stop, dtype)
    assert chunked.dtype == whole.dtype == np.dtype(dtype) and chunked.shape == whole.shape == (stop - start, 3)
    assert chunked.tobytes() == whole.tobytes()
    assert chunked.flags.c_contiguous and chunked.flags.writeable


@pytest.mark.parametrize("spec", RANDOM, ids=lambda s: str(s["name"]))
def test_initializer_memory_peak_is_the_result_plus_a_few_mib(spec: dict[str, object]) -> None:
    """A [262144, 8] float32 embedding (8 MiB) once needed ~10 float64 temporaries of its size (~160 MiB)."""
    tracemalloc.start()  # numpy reports its data buffers to tracemalloc
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        value = initial_value(spec, (262_144, 8), 0, 262_144)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert value.nbytes == 8 << 20
    assert peak <= value.nbytes + (4 << 20), f"peak {peak:,} bytes for a {value.nbytes:,}-byte variable"
