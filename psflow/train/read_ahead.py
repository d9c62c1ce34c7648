"""A worker's reader started before the worker joins the cluster.

A worker learns where its data resumes only once it has joined (the position it
last reported, or the one the restored checkpoint recorded: see
:func:`psflow.train.duties.resume_position`). Its first batches, though, are
almost always those at the start of its shard, and reading them (opening the
first file, parsing its first block, preparing two batches) took place between
the chief's "initialized the variables" and the first step. :class:`ReadAhead`
opens the shard at its start at once, so that this reading overlaps the chief's
initialization, or another worker's wait for it; :meth:`ReadAhead.take` hands
that dataset over only when the worker's data does start there.

Guarantees:

* **Exactly once.** The dataset handed over is the one
  ``open_dataset(config, start=True, prepare=prepare)`` would have returned
  after the join: the same records, in the same order, with the same
  positions. Where the worker resumes elsewhere, :meth:`take` closes the early
  reader and hands nothing over; none of its batches reaches a step, and the
  worker opens its data at the position as before.
* **Bounded.** The early reader runs at most the dataset's prefetch depth
  ahead (plus the block being parsed), as any open dataset does.
* **Closed.** :meth:`close` (or leaving the ``with`` block) closes a dataset
  that was not handed over; one handed over belongs to its taker.

Not thread-safe: one per worker, used from its training thread.
"""

from __future__ import annotations

from types import TracebackType

from psflow.data import Dataset, DatasetConfig, ReaderPosition, open_dataset
from psflow.data.dataset import Prepare

__all__ = ["ReadAhead"]


class ReadAhead:
    """The worker's data opened at the start of its shard, its reader started (see the module docstring).

    Args:
        config: the worker's data (:func:`psflow.train.build.dataset_config`).
        prepare: applied where each batch is made, as :func:`~psflow.data.open_dataset` takes it.

    Raises:
        DataError: as :func:`~psflow.data.open_dataset` (no file matches).
    """

    def __init__(self, config: DatasetConfig, prepare: Prepare | None) -> None:
        self._dataset: Dataset | None = open_dataset(config, start=True, prepare=prepare)

    def take(self, resume: ReaderPosition | None) -> Dataset | None:
        """The early dataset if the worker's data starts at the beginning (``resume`` None), else None (the
        early reader is then closed). Hands it over once: later calls return None. Never blocks for long
        (closing a reader returns promptly)."""
        dataset, self._dataset = self._dataset, None
        if dataset is not None and resume is not None:
            dataset.close()
            return None
        return dataset

    def close(self) -> None:
        """Closes the early dataset unless it was handed over. Idempotent."""
        dataset, self._dataset = self._dataset, None
        if dataset is not None:
            dataset.close()

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
