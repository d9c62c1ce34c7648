"""Checks of a run's input files made before any task starts.

An empty training input would train nothing and exit 0 with 0 examples; an
empty eval set would evaluate to NaN after the whole run; a malformed record
would end a worker minutes in. :func:`check_inputs`, which the local launcher
(:func:`psflow.launch.local.run_local`), the in-process path and ``psflow
server`` (for a task that reads the data) call before starting anything,
refuses all three, naming the flag, the file and the record: it reads the
first records of every file with the run's format and schema
(:func:`psflow.data.check_records`). Malformed records further on are found
by the readers, which report them with their file and line, under the run's
bad-record policy.
"""

from __future__ import annotations

from psflow.data import check_records
from psflow.train.build import data_options
from psflow.train.config import TrainConfig

__all__ = ["check_inputs"]


def check_inputs(config: TrainConfig) -> int | None:
    """Refuses a run whose ``--train`` files, or ``--eval`` files (when given), hold no record, cannot be
    read, or have a malformed record among the first records of a file.

    Reads the first :data:`~psflow.data.checks.HEAD_RECORDS` records of each file (a small training input
    to its end, to count it); blocking, no side effects.

    Returns:
        The training input's record count (good records, one epoch) when it was cheap to read it all
        (a few MiB; see :func:`psflow.data.check_records`), else None.

    Raises:
        DataError: an input is empty (names the flag and the files), matches no file, cannot be read, or
            (without ``--skip-bad-records``) has a malformed record (names the flag, the file and the record).
    """
    options = data_options(config)
    records = check_records(config.data.train, config.data.format, what="--train", **options)
    if config.data.eval:
        check_records(config.data.eval, config.data.format, what="--eval", count_bytes=0, **options)
    return records
