"""Work a handler leaves for after its reply is sent, where the carrier serving the call allows it.

A handler that may acknowledge before it has finished (a ps backup acknowledges the entries it received and
writes them right after: :mod:`psflow.ps.replication.applier`) asks :func:`deferrable` whether the carrier
runs such work, and hands it over with :func:`defer`. psflow's TCP carrier does (:mod:`psflow.rpc.tcp_server`:
it serves one connection's calls in order, in one thread): the work runs in that thread right after the
reply's bytes were sent (or sending failed), before the connection's next request is read. gRPC and the
in-process carrier do not: there :func:`deferrable` is False and the handler does the work before replying.

Guarantees: work handed to :func:`defer` runs exactly once, in the thread that served the call, in the order
it was deferred, after the reply was sent; what it raises is logged (naming the task and the method), never
sent to the caller and never stops the carrier. A call's work never runs before that call's reply, nor after
the same connection's next call started. The work can ask whether that next call's request has arrived
already (:func:`request_waiting`), to put off what can wait (a backup's write of entries it holds).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

__all__ = ["collecting", "deferrable", "defer", "request_waiting", "run"]

log = logging.getLogger(__name__)

_local = threading.local()

#: What a call's handler deferred, in order.
Work = list[Callable[[], None]]


@contextlib.contextmanager
def collecting(waiting: Callable[[], bool] | None = None) -> Iterator[Work]:
    """(A carrier, around one call's dispatch or a thread's whole series of them.) The work the handlers
    defer is collected into the list yielded; the carrier runs it with :func:`run` once each reply is sent.
    ``waiting``: whether the connection's next request has arrived (:func:`request_waiting`), if it can tell."""
    previous: tuple[Work | None, Callable[[], bool] | None] = (getattr(_local, "work", None),
                                                                getattr(_local, "waiting", None))
    work: Work = []
    _local.work, _local.waiting = work, waiting
    try:
        yield work
    finally:
        _local.work, _local.waiting = previous


def request_waiting() -> bool:
    """(Work run after a reply.) Whether the next request on the connection this thread serves has arrived
    (its first bytes wait unread): the work holds that call up. False where the carrier cannot tell, and
    outside a carrier's call. Non-blocking (over TCP, one ``recv`` with ``MSG_PEEK``)."""
    waiting: Callable[[], bool] | None = getattr(_local, "waiting", None)
    return waiting is not None and waiting()


def deferrable() -> bool:
    """Whether the carrier serving the call in this thread runs deferred work after the reply."""
    return getattr(_local, "work", None) is not None


def defer(fn: Callable[[], None]) -> bool:
    """Runs ``fn`` after this call's reply is sent, if the carrier allows it (True); else does nothing (False:
    the caller runs it itself, before replying)."""
    work: Work | None = getattr(_local, "work", None)
    if work is None:
        return False
    work.append(fn)
    return True


def run(work: Work, task: str, method: str) -> None:
    """(A carrier, after sending the reply.) Runs ``work`` in order; an error is logged, naming ``task`` and
    ``method``. (A carrier that collects a thread's calls into one list empties it after.)"""
    for fn in work:
        try:
            fn()
        except Exception:  # noqa: BLE001 - the reply is gone: log it, keep serving
            log.exception("%s: %s: the work left for after the reply failed", task, method)
