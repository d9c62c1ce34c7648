"""Tasks never outlive their launcher; signals stop a task or a launcher without taking a lock.

The pieces, one per side of a local cluster:

:class:`Lifeline` (launcher side)
    One pipe per launcher. The launcher alone holds its write end (the fd is
    not inheritable, and tasks are started with ``close_fds``); every task
    gets the read end (``--lifeline FD``). When the launcher dies, however it
    dies (SIGKILL included), the kernel closes the write end, and every task
    reads EOF. Each task also runs in a process group of its own, so the
    launcher ends a task together with anything that task started
    (``os.killpg``), and a terminal's Ctrl-C reaches the launcher only, which
    then stops the tasks in order.

:class:`StopRequest` (task side)
    Installs handlers for SIGTERM, SIGHUP and SIGINT (each one not ignored
    already: see *Ignored signals* below) that only record the
    signal and write one byte to a self-pipe: no lock is taken and nothing is
    raised into the code the signal interrupted (a handler that raised while
    a push held the TCP channel's lock deadlocked the ``finally`` that closed
    the channel). The self-pipe is also the process's wakeup fd
    (``signal.set_wakeup_fd``): CPython's C handler writes the signal's number
    there at once, from whichever thread the kernel handed the signal to,
    while the Python handler runs only when the main thread next runs Python
    code; a ps task's main thread sleeps in ``Server.join()`` until the stop,
    so a signal handed to another of its threads did nothing before. A daemon
    thread (``psflow-stop``) watches the self-pipe and the lifeline; on a
    signal or on the lifeline's EOF it, in order:

        1. marks the request (:meth:`StopRequest.requested` turns non-None);
           the worker loop checks it before every step and unwinds cleanly;
        2. runs the ``on_stop`` callbacks at once (a ps task: stop serving,
           which ends its ``join``);
        3. after ``drain`` seconds, if the task still runs, the ``on_interrupt``
           callbacks (a worker: close its channels, which fails a call blocked
           in a sync barrier);
        4. after ``grace`` seconds, if the process is still alive,
           ``os._exit(exit_code)``: a task asked to stop always exits, within
           ``grace`` seconds, with the same status as a clean stop.

    Callbacks run on threads of their own, so one that blocks never delays
    the next step or the deadline. Exit status: ``128 + signal number`` (143
    for SIGTERM, 129 for SIGHUP, 130 for SIGINT); a task whose launcher died
    exits as on SIGHUP (129), the signal a process gets when what controls it
    goes away.

    :meth:`StopRequest.close` (or leaving it as a context manager) puts the
    previous handlers and wakeup fd back and ends the watcher, for a program
    that runs a task and goes on (``run_task(stop=None)`` closes the one it
    makes). A stop already requested still ends the process by its deadline.

:func:`set_parent_death_signal` (task side)
    Linux ``prctl(PR_SET_PDEATHSIG)``: the kernel sends the task a signal when
    the *thread* that started it exits. The launcher asks for it
    (``--exit-with-parent``) only for tasks it starts from its main thread,
    which lives as long as the launcher; the pipe is the part that holds
    everywhere (other systems, tasks restarted from another thread, a parent
    that died before the task called prctl).

:class:`LauncherSignals` (launcher side), :class:`LaunchInterrupted`
    SIGTERM, SIGHUP and SIGINT to the launcher: :mod:`psflow.launch.launcher_signals`
    (re-exported here).

Ignored signals (both sides)
    A stop signal ignored when the handlers are installed (``nohup``'s SIGHUP)
    stays ignored, for the launcher and for its tasks, which inherit the ignore
    through ``exec``: :mod:`psflow.launch.stop_signals` (:data:`STOP_SIGNALS`,
    :func:`signal_name`, re-exported here) says why. The launcher's death still
    stops its tasks (the lifeline pipe; the parent-death signal is SIGHUP,
    ignored then).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import select
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from psflow.launch.launcher_signals import LauncherSignals, LaunchInterrupted
from psflow.launch.stop_signals import STOP_SIGNALS, ignored_stop_signals, signal_name, stop_signals_notice

__all__ = [
    "STOP_SIGNALS", "Lifeline", "StopRequest", "LaunchInterrupted", "LauncherSignals", "set_parent_death_signal",
    "signal_name", "ignored_stop_signals", "stop_signals_notice",
]

log = logging.getLogger("psflow.launch")

#: PR_SET_PDEATHSIG from <linux/prctl.h>.
_PR_SET_PDEATHSIG = 1

#: Seconds :meth:`StopRequest.close` waits for its watcher thread to see the close (it wakes at once).
_CLOSE_JOIN = 10.0


def set_parent_death_signal(signum: int) -> bool:
    """Asks the kernel to send ``signum`` to this process when the thread that started it exits.

    Linux only (``prctl(PR_SET_PDEATHSIG)`` through ctypes); elsewhere, or if
    the call fails, returns False and changes nothing. Idempotent.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return bool(libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


class Lifeline:
    """The launcher's end of the tasks' lifeline (see the module docstring); not thread-safe.

    The pipe is created at construction. :attr:`task_fd` is what a task is
    given (``pass_fds``); the write end stays in this process only, until
    :meth:`close` (or the process's death) closes it and every task reads EOF.
    """

    def __init__(self) -> None:
        self.task_fd, self._write_fd = os.pipe()  # both not inheritable (PEP 446): passed on purpose only
        self.closed = False

    def close(self) -> None:
        """Closes both ends; every task still watching reads EOF and stops. Idempotent."""
        if not self.closed:
            self.closed = True
            os.close(self._write_fd)
            os.close(self.task_fd)


class StopRequest:
    """A task's stop: by a signal or by its launcher's death; see the module docstring.

    Thread-safety: :meth:`requested` may be read from any thread, and from
    a signal handler; callbacks may be added from any thread. A context
    manager: leaving it calls :meth:`close`.
    """

    def __init__(self, name: str, *, grace: float = 2.0, drain: float = 0.5) -> None:
        """Creates the request; installs nothing and starts no thread (see :meth:`start`).

        Args:
            name: the task's name, for logs (``/job:worker/task:1``).
            grace: seconds from the request to the forced exit. Shorter than
                the launcher's stop grace (3 s), so a task it stops exits
                with its own status rather than by SIGKILL.
            drain: seconds the task may take to stop on its own before the
                ``on_interrupt`` callbacks run (a step in flight finishes).
        """
        if not 0 <= drain <= grace:
            raise ValueError(f"stop timings must satisfy 0 <= drain ({drain}) <= grace ({grace})")
        self.name, self.grace, self.drain = name, grace, drain
        self.signum: int | None = None        # the first signal: by the handler, or the watcher (wakeup fd)
        self.launcher_gone = False            # written by the watcher thread only
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._lock = threading.Lock()        # guards the callback lists; never taken in a signal handler
        self._stopping = False
        self._on_stop: list[Callable[[], object]] = []
        self._on_interrupt: list[Callable[[], object]] = []
        self._thread: threading.Thread | None = None
        self.ignored: tuple[int, ...] = ()   # the stop signals left ignored by install_handlers
        self._previous: dict[int, Any] = {}  # signal -> the handler install_handlers replaced
        self._previous_wakeup: int | None = None  # the wakeup fd it replaced (-1: none)
        self._closed = threading.Event()

    # ---- state -------------------------------------------------------------
    def requested(self) -> str | None:
        """Why the task is to stop (``SIGTERM``, ``the launcher is gone``), or None. Never blocks."""
        if self.signum is not None:
            return signal_name(self.signum)
        if self.launcher_gone:
            return "the launcher is gone"
        return None

    @property
    def exit_code(self) -> int:
        """``128 + n`` for signal n; 129 (as SIGHUP) when the launcher died first."""
        return 128 + (self.signum if self.signum is not None else int(signal.SIGHUP))

    # ---- set-up ------------------------------------------------------------
    def install_handlers(self) -> bool:
        """Handles :data:`STOP_SIGNALS` from now on, the self-pipe being the process's wakeup fd (module
        docstring); False (nothing installed) off the main thread, if installed already, or once closed.

        A stop signal ignored now (inherited ``SIG_IGN``: ``nohup``) stays ignored, listed in :attr:`ignored`
        and logged once (module docstring, *Ignored signals*). :meth:`close` puts back what this replaced.
        """
        installed = self._previous_wakeup is not None or self._closed.is_set()
        if installed or threading.current_thread() is not threading.main_thread():
            return False
        self.ignored = ignored_stop_signals()
        for sig in STOP_SIGNALS:
            if sig not in self.ignored:
                self._previous[sig] = signal.signal(sig, self._handle)
        self._previous_wakeup = signal.set_wakeup_fd(self._wake_write, warn_on_full_buffer=False)
        notice = stop_signals_notice(self.ignored)
        if notice is not None:
            log.info("%s: %s", self.name, notice)
        return True

    def start(self, lifeline_fd: int | None = None) -> None:
        """Starts the watcher thread (daemon); idempotent; nothing once closed.

        Args:
            lifeline_fd: the read end of the launcher's :class:`Lifeline`
                (None: a task started by hand; only signals stop it).
        """
        if self._thread is None and not self._closed.is_set():
            self._thread = threading.Thread(target=self._watch, args=(lifeline_fd,), name="psflow-stop",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Puts back the handlers and the wakeup fd :meth:`install_handlers` replaced, ends the watcher
        thread and closes the self-pipe; idempotent. Call it on the main thread (where the handlers were
        installed). A stop requested before (by a signal, or the launcher's death) goes on: its callbacks
        run, and the process still exits by the deadline (``grace``), as it was asked to. The previous wakeup
        fd gets Python's default ``warn_on_full_buffer`` (True): what it was set with cannot be read back.

        Raises:
            RuntimeError: handlers to put back, off the main thread (Python sets handlers there only).
        """
        if self._previous_wakeup is not None:
            if threading.current_thread() is not threading.main_thread():
                raise RuntimeError(f"{self.name}: StopRequest.close() must run on the main thread, where its "
                                   "signal handlers were installed")
            for sig, previous in self._previous.items():
                # None: a handler not set from Python; the default is the closest Python can put back.
                signal.signal(sig, signal.SIG_DFL if previous is None else previous)
            self._previous.clear()
            current = signal.set_wakeup_fd(self._previous_wakeup)
            if current != self._wake_write:  # replaced after ours by someone else: theirs stays
                signal.set_wakeup_fd(current)
            self._previous_wakeup = None
        if self._closed.is_set():
            return
        self._closed.set()
        thread = self._thread
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"\0")  # wakes the watcher, which sees the close
        if thread is not None and self.requested() is None:
            thread.join(_CLOSE_JOIN)
        if thread is None or not thread.is_alive() or self._stopping:  # no poll on the pipe any more
            os.close(self._wake_read)
            os.close(self._wake_write)

    def __enter__(self) -> StopRequest:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def on_stop(self, callback: Callable[[], object]) -> None:
        """Runs ``callback`` (on a thread of its own) when the stop is requested, or now if it was."""
        self._add(self._on_stop, callback, 0.0)

    def on_interrupt(self, callback: Callable[[], object]) -> None:
        """Runs ``callback`` ``drain`` seconds after the request (or then, if the request is older)."""
        self._add(self._on_interrupt, callback, self.drain)

    def _add(self, callbacks: list[Callable[[], object]], callback: Callable[[], object], delay: float) -> None:
        with self._lock:
            if not self._stopping:
                callbacks.append(callback)
                return
        timer = threading.Timer(delay, callback)  # the request is already under way
        timer.daemon = True
        timer.start()

    # ---- the two halves ----------------------------------------------------
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Async-signal context in Python terms: it may run between any two bytecodes of the main
        # thread, which may hold any lock. So: no lock, no logging, no raise; one write() wakes the watcher.
        if self.signum is None:
            self.signum = signum
        try:
            os.write(self._wake_write, b"\0")
        except OSError:  # the pipe is full: the watcher has bytes to read, it is awake anyway
            pass

    def _watch(self, lifeline_fd: int | None) -> None:
        poller = select.poll()
        poller.register(self._wake_read, select.POLLIN)
        if lifeline_fd is not None:
            poller.register(lifeline_fd, select.POLLIN | select.POLLHUP)
        parent = os.getppid()
        while self.requested() is None:
            if self._closed.is_set():
                return  # closed: the task ended, nothing to stop
            for fd, events in poller.poll():
                if fd == self._wake_read:  # signal numbers (the wakeup fd's) and the handler's zero bytes
                    for signum in os.read(self._wake_read, 64):
                        if signum in STOP_SIGNALS and self.signum is None:
                            self.signum = signum
                    continue
                try:
                    if events & select.POLLNVAL:
                        raise OSError("not an open file descriptor")
                    data = os.read(fd, 64)
                except OSError as e:
                    log.warning("%s: lifeline fd %d: %s; only signals stop this task", self.name, fd, e)
                    poller.unregister(fd)
                    continue
                if not data:  # EOF: the launcher is gone (nobody ever writes to the pipe)
                    self.launcher_gone = True
        reason = self.requested()
        if self.signum is not None and lifeline_fd is not None and os.getppid() != parent:
            # (started by a launcher: a task started by hand, whose shell ended, had no launcher to name)
            reason = f"{reason}; the launcher (pid {parent}) is gone"
        log.warning("%s: stopping (%s); exiting with status %d within %.1f s", self.name, reason, self.exit_code,
                    self.grace)
        self._run_down()

    def _run_down(self) -> None:
        with self._lock:
            self._stopping = True
            on_stop, on_interrupt = list(self._on_stop), list(self._on_interrupt)
        for callback in on_stop:
            threading.Thread(target=callback, name="psflow-stop-callback", daemon=True).start()
        stopped = threading.Event()  # never set: a plain timed wait that no signal shortens
        stopped.wait(self.drain)
        for callback in on_interrupt:
            threading.Thread(target=callback, name="psflow-stop-interrupt", daemon=True).start()
        stopped.wait(self.grace - self.drain)
        # Still alive: the main thread is stuck (a wait no callback could end) or the interpreter's
        # shutdown waits on a thread. The status is the one a clean stop would have given.
        log.error("%s: still running %.1f s after the stop request; exiting now with status %d", self.name,
                  self.grace, self.exit_code)
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(self.exit_code)
