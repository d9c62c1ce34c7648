"""The count-min sketch behind ``admit_after``: approximate per-id sighting counts in fixed memory."""

from __future__ import annotations

import math

import numpy as np

from psflow.placement.hashing import IdArray, mix64

__all__ = ["CountMinSketch"]


class CountMinSketch:
    """Approximate counts of int64 ids in ``depth`` rows of ``width`` uint32 counters.

    ``estimate(x)`` is never below the number of times ``x`` was added (unless a
    counter passed 2**32 - 1), and exceeds it by at most ``e * total / width``
    with probability ``1 - exp(-depth)``. Memory: ``4 * width * depth`` bytes
    (:attr:`nbytes`). Not thread-safe (the table's lock covers it).
    """

    def __init__(self, width: int, depth: int, *, seed: int = 0) -> None:
        """Raises ValueError unless width is a power of two and depth >= 1."""
        if width < 1 or width & (width - 1) or depth < 1:
            raise ValueError(f"count-min sketch: width must be a power of two and depth >= 1, got {width} x {depth}")
        self.width = width
        self.depth = depth
        self.total = 0
        self._counts = np.zeros(depth * width, dtype=np.uint32)
        self._salts = mix64(np.arange(depth, dtype=np.uint64) + np.uint64((seed * 0x632BE5AB) % (1 << 64)))

    @property
    def nbytes(self) -> int:
        return int(self._counts.nbytes)

    def _cells(self, ids: IdArray) -> IdArray:
        mixed = mix64(ids.view(np.uint64)[None, :] ^ self._salts[:, None]) & np.uint64(self.width - 1)
        out: IdArray = mixed.astype(np.int64) + (np.arange(self.depth, dtype=np.int64) * self.width)[:, None]
        return out

    def add(self, ids: IdArray) -> IdArray:
        """Counts each entry of ``ids`` once (pass distinct ids to count sightings); returns the new estimates."""
        cells = self._cells(ids)
        np.add.at(self._counts, cells.reshape(-1), np.uint32(1))
        self.total += int(ids.size)
        return self._estimate(cells)

    def estimate(self, ids: IdArray) -> IdArray:
        """The estimated count of each id (int64)."""
        return self._estimate(self._cells(ids))

    def _estimate(self, cells: IdArray) -> IdArray:
        out: IdArray = self._counts[cells].min(axis=0).astype(np.int64) if cells.size else np.zeros(0, np.int64)
        return out

    def error_bound(self) -> float:
        """``e * total / width``: the over-count no estimate exceeds with probability ``1 - exp(-depth)``."""
        return math.e * self.total / self.width
