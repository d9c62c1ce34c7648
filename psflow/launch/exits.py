"""Waiting for a task process to exit, woken by the exit itself (a process file descriptor).

The local launcher's watch loop checks its tasks every 0.05 s; between two checks it waits here
(:func:`wait_for_exit`), so a worker's exit ends the wait at once rather than at the next tick (0.025 s later on
average, on every run's end). Linux's ``pidfd_open`` gives a descriptor that turns readable when the process
exits; where there is none (another system, an old kernel), the wait is a plain sleep of ``timeout``.

Only processes this launcher started and has not reaped are waited on: an unreaped child's pid cannot be reused,
so the descriptor always names the task's own process. Nothing is reaped here (``Popen.poll`` does that, on the
watch loop's thread): :func:`exit_status` tells an exit without reaping (the chaos thread asks it), and
:func:`open_pidfd` gives the descriptor a task's signals from other threads go through (so none reaches a pid
after its process was reaped, when it may be another process's), held in a :class:`ProcessDescriptor`: closed once
the process is reaped and its exit recorded, a signal never sent through it after that.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterable

__all__ = ["ProcessDescriptor", "exit_status", "open_pidfd", "wait_for_exit"]


def wait_for_exit(processes: Iterable[subprocess.Popen[bytes]], timeout: float) -> bool:
    """Blocks until one of ``processes`` (children of this process) has exited, or for ``timeout`` s.

    Returns as soon as one has exited (at once if one already had, reaped or not); never reaps. A signal
    handler that raises interrupts the wait (as it does ``time.sleep``).

    Returns:
        True if it was woken by an exit; False after ``timeout`` s (or after a plain sleep, where process
        descriptors are not available).
    """
    fds: list[int] = []
    try:
        for p in processes:
            if p.returncode is not None:
                return True
            try:
                fds.append(os.pidfd_open(p.pid))
            except ProcessLookupError:  # exited and reaped by someone else's wait: it has exited
                return True
            except (AttributeError, OSError):
                time.sleep(timeout)
                return False
        if not fds:
            time.sleep(timeout)
            return False
        poller = select.poll()  # not select.select: a launcher of many tasks has descriptors past FD_SETSIZE (1024)
        for fd in fds:
            poller.register(fd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        for fd in fds:
            os.close(fd)


def exit_status(popen: subprocess.Popen[bytes]) -> int | None:
    """The exit status of ``popen``'s process (as ``Popen.returncode``: -N for signal N), None while it runs; never
    reaps it (``waitid`` with ``WNOWAIT``). Any thread may ask.

    An exit not reaped yet (a zombie) counts, and the zombie stays: its pid is its own until the watch loop reaps it
    (``Popen.poll``), so no pid freed here can be signalled, by pid, as if it were the task's. Where the system has
    no ``waitid``, ``Popen.poll`` (which reaps).
    """
    if popen.returncode is not None:
        return popen.returncode
    if not hasattr(os, "waitid"):
        return popen.poll()
    try:
        info = os.waitid(os.P_PID, popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped meanwhile by Popen on another thread: wait() returns the code it recorded
        return popen.wait()
    if info is None or info.si_pid == 0:
        return None
    return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status


def open_pidfd(pid: int) -> int | None:
    """A process descriptor of ``pid`` (a child not reaped: call it right after starting the process, before any
    thread can reap it), or None where the system has none. A signal through it
    (``signal.pidfd_send_signal``) reaches that process or, once it is reaped, fails with ProcessLookupError:
    never another process given the pid later. The caller closes it (:class:`ProcessDescriptor`)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


class ProcessDescriptor:
    """A process descriptor (:func:`open_pidfd`) that signals go through from any thread and that is closed once
    (by whoever first calls :meth:`close`: the watch loop once it reaped the process and recorded its exit, or the
    owner's collection). Thread-safe: a signal and the closing are serialized, so no signal goes through the number
    after it was closed (when it may name another file, another task's descriptor)."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd
        self._lock = threading.Lock()

    @property
    def fd(self) -> int | None:
        """The descriptor's number while open; None once closed."""
        return self._fd

    def send_signal(self, sig: int) -> bool:
        """Sends ``sig`` to the process; False (nothing sent) once the descriptor is closed.

        Raises:
            ProcessLookupError: the process was reaped (the descriptor not closed yet).
        """
        with self._lock:
            if self._fd is None:
                return False
            signal.pidfd_send_signal(self._fd, sig)
            return True

    def close(self) -> None:
        """Closes the descriptor; idempotent."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
