"""psflow's log lines: their format, and a formatter and record settings that make one cheap to write.

Every psflow log line reads ``2026-11-27 11:52:40,539 INFO psflow.worker: worker 1: step=100 ...``
(:data:`LOG_FORMAT`: local time to the millisecond, level, logger, message). A worker run with
``--log-every 1`` writes two such lines a step (its ``step=`` line and the step-rate line), so what a line
costs beside its message counts: with the standard library's defaults, each record walks up the stack to
find its caller's file and line and looks up its thread's and process's names, none of which the format
shows, and each line formats its date anew.

- :class:`LineFormatter` formats :data:`LOG_FORMAT` exactly as ``logging.Formatter(LOG_FORMAT)`` does, the
  date's text made once per second instead of once per line.
- :func:`lean_records` turns off, for the whole process, the record fields the format never shows (the
  logging HOWTO's "Optimization" settings). Only for processes psflow owns (its task processes and
  ``psflow`` commands), where no other handler could want them.
"""

from __future__ import annotations

import logging
import time

__all__ = ["LOG_FORMAT", "LineFormatter", "lean_records"]

#: The format of every psflow log line (task logs, ``--in-process`` logs, the console with ``--verbose``).
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class LineFormatter(logging.Formatter):
    """``logging.Formatter(LOG_FORMAT)``, the same text, with the date's text made once per second.

    The date of a record is ``time.strftime`` of its ``created`` second in local time plus its milliseconds
    (``logging.Formatter``'s default ``formatTime``); the text of the second is kept and reused while records
    fall in it. Thread-safe: the kept (second, text) pair is replaced as one object, so a formatter shared by
    handlers in several threads never pairs a second with another second's text.
    """

    def __init__(self) -> None:
        super().__init__(LOG_FORMAT)
        self._second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        if datefmt:
            return super().formatTime(record, datefmt)
        second = int(record.created)
        kept = self._second
        if kept[0] != second:
            kept = (second, time.strftime(self.default_time_format, self.converter(record.created)))
            self._second = kept
        return self.default_msec_format % (kept[1], record.msecs) if self.default_msec_format else kept[1]


def lean_records() -> None:
    """Leaves out of every log record of this process what :data:`LOG_FORMAT` never shows.

    The caller's file, line and function (found by walking up the stack for every record), and the thread's
    and process's ids and names. A handler that shows them (``%(lineno)d``, ``%(threadName)s``...) would then
    show ``(unknown file)``, 0 or None: call this only in a process psflow owns. Idempotent.
    """
    logging._srcfile = None  # the documented switch: no caller lookup
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
