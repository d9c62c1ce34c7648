"""The run's eval set, read by the local launcher while the tasks train, not after them.

The launcher evaluates the model once every worker has exited; reading and parsing the eval files
(50,000 sparse-LR examples: ~0.03-0.08 CPU-s, 0.05-0.2 s of wall time on 2 busy cores) used to come then,
between the last step and the end of the command. :class:`EvalSet` reads them on a thread of their own
from the start, at the lowest CPU priority where the OS lets a thread have one (Linux), so that the
read takes cores the training leaves idle rather than the training's (side by side with a reader at the
launcher's own priority, 6 alternated pairs of a sparse-LR epoch at load ~6: the same CPU, the command's
wall time 2.73 s against 2.91 s, medians; within the noise). The price, on a machine the tasks saturate:
while the reader holds the GIL and waits for a core, the launcher's watch loop (exits, restarts, progress)
waits behind it, for as long as the read lasts at most; the tasks themselves are not slowed.

The launcher waits for the read with :func:`psflow.waits.wait_woken`: a stop signal the kernel handed to the
reading thread ran the launcher's handler only once the main thread woke, and a join of the thread woke when
the read ended (a read from a store that stopped answering: never).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

from psflow.data import Batch, DataError
from psflow.train.config import TrainConfig
from psflow.train.worker import load_eval
from psflow.waits import wait_woken

__all__ = ["EvalSet", "after_training"]

log = logging.getLogger("psflow.launch")

#: The reading thread's nice value: it yields to the task processes' threads (niceness 0) on a busy machine.
READER_NICENESS = 19


class EvalSet:
    """``load_eval(config)`` on a daemon thread, started at once; :meth:`result` waits for it.

    The batch and the errors are exactly ``load_eval``'s: an error of the read (a malformed eval record)
    is raised by :meth:`result`, where the launcher evaluates, as if it had read the files there.
    """

    def __init__(self, config: TrainConfig) -> None:
        self._batch: Batch | None = None
        self._error: BaseException | None = None
        self._read_done = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(config,), name="psflow-eval-set", daemon=True)
        self._thread.start()

    def _read(self, config: TrainConfig) -> None:
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), READER_NICENESS)  # this thread only (Linux)
        except (AttributeError, OSError) as e:  # pragma: no cover - not Linux, or refused: read at the usual priority
            log.debug("eval set reader keeps its priority: %s", e)
        try:
            self._batch = load_eval(config)
        except BaseException as e:  # handed to result(), on the launcher's thread
            self._error = e
        finally:
            self._read_done.set()

    def result(self) -> Batch | None:
        """The eval set as one batch (None without ``--eval``). Blocks until it is read (woken for the
        launcher's signal handlers: module docstring).

        Raises:
            Whatever ``load_eval`` raised (DataError for a malformed record, naming the file and record).
        """
        wait_woken(self._read_done.wait)
        if self._error is not None:
            raise self._error
        return self._batch


def after_training(read: Callable[[], Batch | None]) -> Batch | None:
    """``read()``, the eval set of a run whose every worker finished (its final checkpoint written); blocks as
    ``read`` does.

    Raises:
        DataError: the eval files hold a record the launcher's first look did not reach and that cannot be read:
            the reader's message behind ``--eval:``, and that the training finished (only its evaluation failed),
            so that it does not read as a training failure.
    """
    try:
        return read()
    except DataError as e:
        raise DataError(f"--eval: {e}: the training finished (every worker's data ended; with --checkpoint-dir its "
                        "final checkpoint is written): only the final evaluation failed, and it is not in "
                        "metrics.json") from e
