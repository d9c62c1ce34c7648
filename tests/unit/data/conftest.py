"""Fixtures for psflow.data tests: bundled and shared data paths, small synthetic files."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from psflow.data import Batch, TFRecordWriter, native
from psflow.data import example_wire as wire_module
from psflow.data import tfrecord as tfrecord_module
from psflow.data.example_encode import encode_sparse_examples
from psflow.native.loader import ENV

REPO = Path(__file__).resolve().parents[3]
FIXTURES = REPO / "tests" / "data" / "tfrecord_fixtures"
A9A = REPO / "data" / "a9a" / "a9a"
A9A_T = REPO / "data" / "a9a" / "a9a.t"
CRITEO_SAMPLE = REPO.parent / "shared" / "data" / "criteo" / "criteo_1tb_day0_10k.txt"
#: The bundled SYNTHETIC Criteo-format data (data/criteo_synthetic/README.md): in every clone.
CRITEO_SYNTHETIC = REPO / "data" / "criteo_synthetic" / "train.txt"


def require_native() -> None:
    """Skips the test when the C extension was not built, or fails it under ``PSFLOW_REQUIRE_NATIVE=1``."""
    if native.NATIVE is None:
        if os.environ.get("PSFLOW_REQUIRE_NATIVE") == "1":
            pytest.fail("PSFLOW_REQUIRE_NATIVE=1 but psflow.data._native is not importable (not built?)")
        pytest.skip(f"psflow.data._native not built or disabled by {ENV}=0")


@pytest.fixture(scope="module", params=["c", "numpy"])
def implementation(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a module's tests once with the C loops and once with the numpy loops (see psflow.data.native)."""
    if request.param == "c":
        require_native()
    with pytest.MonkeyPatch.context() as patch:
        loops = native.NATIVE if request.param == "c" else None
        patch.setattr(tfrecord_module, "NATIVE", loops)
        patch.setattr(wire_module, "NATIVE", loops)
        yield str(request.param)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def a9a_paths() -> tuple[Path, Path]:
    return A9A, A9A_T


@pytest.fixture(scope="session")
def fixtures_json() -> dict[str, Any]:
    with open(FIXTURES / "fixtures.json", encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


@pytest.fixture
def criteo_sample() -> Path:
    """The real Criteo sample (shared data, not bundled: its terms); for what real data must show (AUC)."""
    if not CRITEO_SAMPLE.is_file():
        pytest.skip(f"Criteo sample not present at {CRITEO_SAMPLE} (it may not be bundled)")
    return CRITEO_SAMPLE


@pytest.fixture(params=["synthetic", "shared"])
def criteo_file(request: pytest.FixtureRequest) -> Path:
    """A Criteo-format file, for tests that need only the format: the bundled synthetic data (always), and the
    real sample where it is present."""
    if request.param == "synthetic":
        return CRITEO_SYNTHETIC
    if not CRITEO_SAMPLE.is_file():
        pytest.skip(f"Criteo sample not present at {CRITEO_SAMPLE} (shared data, not bundled; the synthetic data ran)")
    return CRITEO_SAMPLE


def same_batch(a: Batch, b: Batch) -> bool:
    """True when two batches hold the same features with bit-identical arrays (extras ignored)."""
    if list(a.sparse) != list(b.sparse) or list(a.dense) != list(b.dense) or a.labels.tobytes() != b.labels.tobytes():
        return False
    for name, column in a.sparse.items():
        other = b.sparse[name]
        if any(getattr(column, f).tobytes() != getattr(other, f).tobytes() for f in ("indptr", "ids", "values")):
            return False
    return all(v.dtype == b.dense[k].dtype and v.shape == b.dense[k].shape and v.tobytes() == b.dense[k].tobytes()
               for k, v in a.dense.items())


def same_batches(a: list[Batch], b: list[Batch]) -> bool:
    return len(a) == len(b) and all(same_batch(x, y) for x, y in zip(a, b, strict=True))


def numbered_batch(start: int, count: int, width: int = 3) -> Batch:
    """Examples whose ids identify them: example k has ids [k*10, k*10+1, ...] (k from ``start``)."""
    k = np.arange(start, start + count, dtype=np.int64)
    lengths = (k % width) + 1
    indptr = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    ids = np.concatenate([np.zeros(0, dtype=np.int64)] + [np.arange(n) + 10 * i for i, n in zip(k, lengths, strict=True)])
    return Batch.from_csr((k % 2).astype(np.float32), indptr, ids, np.full(ids.size, 1.0, dtype=np.float32))


def _example_keys(batch: Batch) -> list[int]:
    column = batch.column()
    return [int(column.ids[column.indptr[i]]) // 10 for i in range(batch.num_examples)]


@pytest.fixture(scope="session")
def example_keys() -> Callable[[Batch], list[int]]:
    """Recovers the number ``k`` of each row of a batch read from ``numbered_files``."""
    return _example_keys


def write_numbered(path: Path, fmt: str, start: int, count: int, *, blank_every: int = 0) -> None:
    """Writes examples ``start .. start+count-1`` of :func:`numbered_batch` as libsvm or tfrecord."""
    batch = numbered_batch(start, count)
    column = batch.column()
    if fmt == "tfrecord":
        with TFRecordWriter(str(path)) as writer:
            for record in encode_sparse_examples(batch.labels, column.indptr, column.ids, column.values):
                writer.write(record)
        return
    lines = []
    for i in range(count):
        a, b = column.indptr[i], column.indptr[i + 1]
        tokens = " ".join(f"{j}:1" for j in column.ids[a:b])
        lines.append(f"{int(batch.labels[i])} {tokens}")
        if blank_every and i % blank_every == 0:
            lines.append("")
    path.write_text("\n".join(lines) + "\n")


@pytest.fixture
def numbered_files(tmp_path: Path) -> Callable[..., list[str]]:
    """Makes ``num_files`` files holding ``sizes[i]`` numbered examples each; returns their paths."""

    def make(fmt: str, sizes: list[int], *, blank_every: int = 0) -> list[str]:
        paths = []
        start = 0
        suffix = ".tfrecord" if fmt == "tfrecord" else ".txt"
        for i, size in enumerate(sizes):
            path = tmp_path / f"part-{i:03d}{suffix}"
            write_numbered(path, fmt, start, size, blank_every=blank_every)
            paths.append(str(path))
            start += size
        return paths

    return make
