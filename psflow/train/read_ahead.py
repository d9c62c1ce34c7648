"""A worker's reader started before the worker joins the cluster.

A worker learns where its data resumes only once it has joined (the position it
last reported, or the one the restored checkpoint recorded: see
:func:`psflow.train.duties.resume_position`). Its first batches, though, are
almost always those at the start of its shard, and reading them (opening the
first file, parsing its first block, preparing two batches) took place between
the chief's "initialized the variables" and the first step. :class:`ReadAhead`
opens the shard at its start at once, so that this reading overlaps the chief's
initialization, or another worker's wait for it; :meth:`ReadAhead.open` hands
that dataset over only when the worker's data does start there, and otherwise
opens the data at its position.

Guarantees:

* **Exactly once.** :meth:`ReadAhead.open` returns what
  ``open_dataset(config, start=True, resume_from=resume, prepare=prepare)``
  would have: the same records, in the same order, with the same positions.
  Where the worker resumes elsewhere, or opens its data again (after a
  restore), the early reader is closed first and none of its batches reaches
  a step.
* **Bounded.** The early reader runs at most the dataset's prefetch depth
  ahead (plus the block being parsed), as any open dataset does.
* **Closed.** :meth:`close` (or leaving the ``with`` block) closes a dataset
  that was not handed over; one :meth:`open` returned belongs to its caller.

Not thread-safe: one per worker, used from its training thread.
"""

from __future__ import annotations

from types import TracebackType

from psflow.data import Dataset, DatasetConfig, ReaderPosition, open_dataset
from psflow.data.dataset import Prepare

__all__ = ["ReadAhead"]


class ReadAhead:
    """The worker's data, opened at the start of its shard at once (see the module docstring).

    Args:
        config: the worker's data (:func:`psflow.train.build.dataset_config`).
        prepare: applied where each batch is made, as :func:`~psflow.data.open_dataset` takes it.
        start: open the data and start its reader now; False (a reader process: the in-process path):
            :meth:`open` opens it as ``open_dataset`` does.

    Raises:
        DataError: as :func:`~psflow.data.open_dataset` (no file matches).
    """

    def __init__(self, config: DatasetConfig, prepare: Prepare | None, *, start: bool) -> None:
        self._config, self._prepare = config, prepare
        self._dataset: Dataset | None = open_dataset(config, start=True, prepare=prepare) if start else None

    def open(self, resume: ReaderPosition | None) -> Dataset:
        """The worker's data from ``resume`` (None: from the beginning): the early dataset if this is the first
        call and ``resume`` is None, else ``open_dataset(config, start=True, resume_from=resume, prepare=prepare)``,
        the early reader closed first (closing a reader returns promptly).

        Raises:
            DataError: as :func:`~psflow.data.open_dataset`.
        """
        dataset, self._dataset = self._dataset, None
        if dataset is not None and resume is None:
            return dataset
        if dataset is not None:
            dataset.close()
        return open_dataset(self._config, start=True, resume_from=resume, prepare=self._prepare)

    def close(self) -> None:
        """Closes the early dataset unless :meth:`open` handed it over. Idempotent."""
        dataset, self._dataset = self._dataset, None
        if dataset is not None:
            dataset.close()

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
