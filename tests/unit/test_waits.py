"""psflow.waits.wait_woken: a wait that a signal handler on the main thread can still cut."""

from __future__ import annotations

import signal
import sys
import threading

import pytest
from support import wait_until

from psflow.waits import wait_woken

LIMIT = 60.0  # safety net, seconds


class _Cut(Exception):
    pass


def _main_thread_asleep() -> bool:
    """Whether the main thread is asleep in wait_woken (in threading's Condition.wait: on its lock, a C call)."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    if frame is None or frame.f_code.co_name != "wait" or frame.f_code.co_filename != threading.__file__:
        return False
    while frame is not None and frame.f_code.co_name != "wait_woken":
        frame = frame.f_back
    return frame is not None


def test_it_returns_once_the_event_is_set_and_false_past_its_timeout() -> None:
    done = threading.Event()
    threading.Timer(0.05, done.set).start()
    assert wait_woken(done.wait, LIMIT) is True
    assert wait_woken(threading.Event().wait, 0.01) is False


def test_a_handler_raising_for_a_signal_handed_to_another_thread_ends_a_wait_with_no_bound() -> None:
    """The kernel may hand a process's signal to any thread; Python runs the handler on the main thread only when
    it wakes. A plain ``done.wait()`` woke when ``done`` was set: here, after the safety net, and the test fails."""
    def cut(signum: int, frame: object) -> None:
        raise _Cut

    done = threading.Event()

    def other_thread() -> None:
        wait_until(_main_thread_asleep, "the main thread asleep in its wait", limit=LIMIT)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        done.wait(LIMIT)  # the safety net: ends the main thread's wait even if the handler never ran
        done.set()

    previous = signal.signal(signal.SIGUSR1, cut)
    thread = threading.Thread(target=other_thread, name="signalled", daemon=True)
    try:
        with pytest.raises(_Cut):
            thread.start()
            wait_woken(done.wait)
        assert not done.is_set()  # cut by the handler, not ended by the safety net
    finally:
        done.set()
        thread.join(LIMIT)
        signal.signal(signal.SIGUSR1, previous)
