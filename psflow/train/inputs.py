"""Checks of a run's input files made before any task starts.

An empty training input would train nothing and exit 0 with 0 examples; an
empty eval set would evaluate to NaN after the whole run. Both are refused up
front, naming the files, by :func:`check_inputs`, which the local launcher
(:func:`psflow.launch.local.run_local`), the in-process path and ``psflow
server`` (for a task that reads the data) call before starting anything.
Malformed records are not looked for here: the readers report them with
their file and line, under the run's bad-record policy.
"""

from __future__ import annotations

from psflow.data import require_records
from psflow.train.build import data_options
from psflow.train.config import TrainConfig

__all__ = ["check_inputs"]


def check_inputs(config: TrainConfig) -> None:
    """Refuses a run whose ``--train`` files, or ``--eval`` files (when given), hold no record at all.

    Reads each input up to its first record (about one block); blocking, no side effects.

    Raises:
        DataError: an input is empty (names the flag and the files), matches no file, or cannot be read.
    """
    options = data_options(config)
    require_records(config.train, config.format, what="--train", **options)
    if config.eval:
        require_records(config.eval, config.format, what="--eval", **options)
