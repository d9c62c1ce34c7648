"""psflow's log lines: LineFormatter writes what logging.Formatter(LOG_FORMAT) writes; lean_records keeps the line."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

from psflow.launch.log_format import LOG_FORMAT, LineFormatter, lean_records

pytestmark = pytest.mark.timeout(60)


def _record(created: float, msg: str = "worker %d: step=%d loss=%.4f", args: tuple[object, ...] = (1, 7, 0.5)) -> logging.LogRecord:
    record = logging.LogRecord("psflow.worker", logging.INFO, __file__, 1, msg, args, None)
    record.created = created  # as LogRecord computes it from the clock
    record.msecs = int((created - int(created)) * 1000) + 0.0
    return record


def test_same_text_as_the_standard_formatter_across_seconds() -> None:
    now = time.time()
    base = float(int(now))
    # within one second, across boundaries, a record from an earlier second formatted after a later one
    # (another thread's), the last millisecond of a second, far from now
    times = [base + 0.001, base + 0.5, base + 0.999, base + 1.0, base + 1.25, base + 0.75, base + 61.0,
             base - 3600.5, base + 86400 * 180 + 0.123, base + 2.0009]
    ours, theirs = LineFormatter(), logging.Formatter(LOG_FORMAT)
    for t in times:
        assert ours.format(_record(t)) == theirs.format(_record(t)), t
    # the kept second is used again, and is right when it is
    assert ours.format(_record(base + 2.5)) == theirs.format(_record(base + 2.5))


def test_a_date_format_given_is_the_standard_one() -> None:
    record = _record(time.time())
    assert LineFormatter().formatTime(record, "%H:%M") == logging.Formatter(LOG_FORMAT).formatTime(record, "%H:%M")


@pytest.fixture
def restored_logging_flags() -> Iterator[None]:
    saved = (logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing)
    try:
        yield
    finally:
        logging._srcfile, logging.logThreads, logging.logProcesses, logging.logMultiprocessing = saved


def test_lean_records_keep_the_line_and_drop_what_it_never_shows(restored_logging_flags: None) -> None:
    created = time.time()
    before = logging.LogRecord("psflow.worker", logging.INFO, __file__, 1, "step=%d", (3,), None)
    lean_records()
    logger = logging.getLogger("psflow.test_log_format")
    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    handler = Keep()
    logger.addHandler(handler)
    logger.propagate, logger.level = False, logging.INFO
    try:
        logger.info("step=%d", 3)
    finally:
        logger.removeHandler(handler)
    after = seen[0]
    assert after.funcName == "(unknown function)" and after.lineno == 0  # no walk up the stack
    assert after.thread is None and after.threadName is None and after.process is None and after.processName is None
    before.created, before.msecs, after.created, after.msecs = created, 5.0, created, 5.0
    before.name = after.name = "psflow.worker"
    assert LineFormatter().format(after) == logging.Formatter(LOG_FORMAT).format(before)
