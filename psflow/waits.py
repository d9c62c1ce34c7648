"""Waits on the main thread that a signal's Python handler can still cut (:func:`wait_woken`).

A signal sent to a process goes to whichever of its threads the kernel picks: Linux passes the main thread over
when it has a signal pending already (a second signal sent right after the first, on a busy machine), and a
signal sent to one thread (``pthread_kill``) goes to that thread. CPython's C handler runs in that thread and only
marks the signal; the Python handler runs on the main thread, when it next runs Python code. A main thread asleep
in one long call (``Event.wait(t)``, ``Thread.join()``, ``Future.result(t)``, a pipe's ``recv()``) runs none until the call returns, so
a handler that raises (:class:`~psflow.launch.lifeline.LauncherSignals`: the launcher's stop) took effect only
when the wait ended. :func:`wait_woken` wakes every :data:`WAKE_EVERY` s, which lets such a handler run (and its
exception end the wait) within that time.

Where the handler only needs to be told, not to raise, a wakeup fd is the better tool (``signal.set_wakeup_fd``:
the C handler writes to it from any thread; :class:`~psflow.launch.lifeline.StopRequest`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["WAKE_EVERY", "wait_woken"]

#: Seconds the main thread sleeps at most at once in :func:`wait_woken` (so its signal handlers run).
WAKE_EVERY = 0.2


def wait_woken(wait: Callable[[float], bool], timeout: float | None = None) -> bool:
    """``wait(timeout)`` (None: no bound) made of calls ``wait(t)`` of :data:`WAKE_EVERY` s at most; a signal
    handler that raises ends it with its exception. ``wait``: a bounded wait that returns whether what it waits
    for has come (``Event.wait``, ``Connection.poll``). Returns the last call's answer."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = WAKE_EVERY if deadline is None else min(WAKE_EVERY, deadline - time.monotonic())
        if wait(max(0.0, left)):
            return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
