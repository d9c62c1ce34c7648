"""Work that waits for a replicated call's entry to be acknowledged: what a primary does once the run is over.

A primary serves a state call (``Done``) as unreplicated, then records its entry and replies once every backup
of the view acknowledged it (:mod:`~psflow.ps.replication.member`). The ``Done`` that completes the run's ledger
(:mod:`psflow.ps.run_end`) calls its ``on_over`` inside the handler, before the entry is recorded: a server
that stopped its backups then (``Shutdown``) could stop one before it held that ``Done``, which failed the
call and printed a false warning at the end of a run that succeeded. :class:`AfterAcked` holds such work until
the call's wait is over.

Guarantees: work handed to :meth:`AfterAcked.run` while a wrapped call is served in the same thread runs once,
in order, after that call's entry was acknowledged by every backup, or its wait failed (the call raised);
outside such a call it runs at once. Thread-safe (each serving thread keeps its own).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from psflow.rpc.api import Handler, Reply
from psflow.rpc.framing import Frame

__all__ = ["AfterAcked"]


class AfterAcked:
    """See the module docstring."""

    def __init__(self) -> None:
        self._local = threading.local()  # .work: the work left for the end of the call served in this thread

    def wrap(self, replicated: Handler) -> Handler:
        """``replicated`` (a handler that returns once its entry was acknowledged), running the work handed to
        :meth:`run` during it once it returned or raised."""
        def call(frame: Frame) -> Reply:
            work: list[Callable[[], None]] = []
            self._local.work = work
            try:
                return replicated(frame)
            finally:
                self._local.work = None
                for fn in work:
                    fn()
        return call

    def run(self, fn: Callable[[], None]) -> None:
        """Runs ``fn`` at the end of the wrapped call served in this thread; at once outside one."""
        work: list[Callable[[], None]] | None = getattr(self._local, "work", None)
        if work is None:
            fn()
        else:
            work.append(fn)
