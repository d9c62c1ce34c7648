"""Who reads what: dividing files (or records) among workers.

With ``F`` files (sorted by path) and ``W`` workers:

* ``F >= W`` -- **file mode**: worker ``i`` reads every record of files
  ``i, i + W, i + 2W, ...``.
* ``F < W`` -- **record mode**: every worker opens every file; worker ``i``
  takes record ``r`` (0-based, counted per file; for text formats a record
  is a line, blank or not) of file ``j`` iff ``(r + j) % W == i``.  The
  ``+ j`` rotates the start so that short files do not all load worker 0.
  Each worker still scans the whole of every file (framing, line breaks) but
  parses only its own records.

Either way every record of every file belongs to exactly one worker, and a
worker's records are read in file order within each file.  Which files a
worker opens, in what order, in each epoch is :func:`epoch_file_order`.

Everything here is pure except :func:`expand_paths`, which lists the file
system (or an object store's bucket, :mod:`psflow.storage`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from psflow import storage
from psflow.data.api import DataError

__all__ = ["WorkerShard", "expand_paths", "shard_plan", "epoch_file_order"]

_FILE_ORDER_TAG = 0x46494C45  # keeps file-order seeds apart from shuffle-buffer seeds


@dataclass(frozen=True)
class WorkerShard:
    """One worker's share.

    Attributes:
        worker_index: the worker.
        num_workers: workers in the plan.
        paths: the files this worker opens, sorted.
        file_numbers: each path's index in the sorted list of all files.
        record_stride: 1 in file mode (every record); ``num_workers`` in record mode.
        first_records: per path, the first record index this worker takes;
            it then takes every ``record_stride``-th record.
    """

    worker_index: int
    num_workers: int
    paths: tuple[str, ...]
    file_numbers: tuple[int, ...]
    record_stride: int
    first_records: tuple[int, ...]

    def owns(self, path_index: int, record_index: int) -> bool:
        """True if record ``record_index`` of ``paths[path_index]`` belongs to this worker."""
        return (record_index - self.first_records[path_index]) % self.record_stride == 0


def expand_paths(patterns: Sequence[str]) -> list[str]:
    """Expands glob patterns; returns the sorted, de-duplicated list of files.

    A pattern without glob characters names a file that must exist. A
    pattern may be a URL of an object store (``s3://bucket/train-*``, see
    :mod:`psflow.storage`): its matches are URLs, sorted with the rest.

    Raises:
        DataError: a pattern matches no file, or names a directory (suggests a glob of its files), or a
            store psflow cannot use (an unknown scheme, a missing client library) or cannot list.
    """
    if isinstance(patterns, str):
        patterns = [patterns]
    found: set[str] = set()
    for pattern in patterns:
        try:
            found.update(_expand(pattern))
        except (storage.StorageError, ImportError, OSError) as e:  # a store psflow cannot use, or cannot list
            raise DataError(f"{pattern}: {e}") from e
    return sorted(found)


def _expand(pattern: str) -> list[str]:
    """The files one pattern names (see :func:`expand_paths`)."""
    if storage.has_magic(pattern):
        matches = storage.glob(pattern)
        if not matches:
            raise DataError(f"no files match {pattern!r}")
        return matches
    if storage.isfile(pattern):
        return [pattern]
    if storage.isdir(pattern):
        raise DataError(f"{pattern}: is a directory, not a file: name its files, e.g. "
                        f"'{os.path.join(pattern, '*')}' (quoted, so that psflow expands the glob)")
    raise DataError(f"{pattern}: no such file")


def shard_plan(paths: Sequence[str], num_workers: int) -> list[WorkerShard]:
    """Returns every worker's share of ``paths`` (sorted and de-duplicated first).

    Pure: looks at the names only.

    Raises:
        ValueError: no paths, or ``num_workers < 1``.
    """
    files = sorted(set(paths))
    if not files:
        raise ValueError("shard_plan needs at least one path")
    if num_workers < 1:
        raise ValueError(f"num_workers ({num_workers}) must be >= 1")
    plan = []
    for worker in range(num_workers):
        if len(files) >= num_workers:
            numbers = tuple(range(worker, len(files), num_workers))
            plan.append(WorkerShard(worker, num_workers, tuple(files[j] for j in numbers), numbers, 1, (0,) * len(numbers)))
        else:
            numbers = tuple(range(len(files)))
            firsts = tuple((worker - j) % num_workers for j in numbers)
            plan.append(WorkerShard(worker, num_workers, tuple(files), numbers, num_workers, firsts))
    return plan


def epoch_file_order(shard: WorkerShard, epoch: int, *, shuffle: bool, seed: int) -> list[int]:
    """Indices into ``shard.paths`` in the order the worker reads them in ``epoch``.

    Sorted order without shuffling; otherwise a permutation drawn from
    ``(seed, worker_index, epoch)``, the same on every run.
    """
    order = list(range(len(shard.paths)))
    if shuffle and len(order) > 1:
        rng = np.random.default_rng([_FILE_ORDER_TAG, seed, shard.worker_index, epoch])
        order = [int(i) for i in rng.permutation(len(order))]
    return order
