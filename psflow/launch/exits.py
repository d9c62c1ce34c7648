"""Waiting for a task process to exit, woken by the exit itself (a process file descriptor).

The local launcher's watch loop checks its tasks every 0.05 s; between two checks it waits here
(:func:`wait_for_exit`), so a worker's exit ends the wait at once rather than at the next tick (0.025 s later on
average, on every run's end). Linux's ``pidfd_open`` gives a descriptor that turns readable when the process
exits; where there is none (another system, an old kernel), the wait is a plain sleep of ``timeout``.

Only processes this launcher started and has not reaped are waited on: an unreaped child's pid cannot be reused,
so the descriptor always names the task's own process. Nothing is reaped here (``Popen.poll`` does that, on the
watch loop's thread): :func:`exit_status` tells an exit and :func:`stopped` a stop without reaping (the chaos
thread asks them), each through the task's :class:`ProcessDescriptor` (opened as the process started: a pidfd,
closed once the process is reaped and its exit recorded), through which that thread's and the health thread's
signals go too. So nothing from those threads is asked of, or sent to, a pid after its process was reaped, when
it may be another process's; only where the system has no process descriptors is a task asked by pid (its own
while it is not reaped).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Iterable

__all__ = ["ProcessDescriptor", "exit_status", "stopped", "wait_for_exit"]


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


def exit_status(popen: subprocess.Popen[bytes], descriptor: ProcessDescriptor | None = None) -> int | None:
    """The exit status of ``popen``'s process (as ``Popen.returncode``: -N for signal N), None while it runs; never
    reaps it (``waitid`` with ``WNOWAIT``). Any thread may ask.

    Asked through ``descriptor`` (the process's own, :meth:`ProcessDescriptor.open`) where there is one, so the
    answer is that process's whatever its number names by then; by pid where there is none (or the kernel has
    ``pidfd_open`` but not ``waitid(P_PIDFD)``: Linux 5.3), where it is the process's only until it is reaped. An
    exit not reaped yet (a zombie) counts, and the zombie stays: its pid is its own until the watch loop reaps it
    (``Popen.poll``). Once reaped (the descriptor closed, or the process no longer its child): the status ``Popen``
    recorded as it reaped it (``Popen.wait``, which then asks nothing of the number: only ``Popen`` reaps a task,
    and it records the status before it lets go of its lock). Where the system has no ``waitid``, ``Popen.poll``
    (which reaps).
    """
    if popen.returncode is not None:
        return popen.returncode
    if descriptor is None and not hasattr(os, "waitid"):
        return popen.poll()
    try:
        info = _ask(popen, descriptor, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # reaped meanwhile by Popen on another thread: wait() returns the code it recorded
        return popen.wait()
    if info is None or info.si_pid == 0:
        return None
    return -info.si_status if info.si_code in (os.CLD_KILLED, os.CLD_DUMPED) else info.si_status


def stopped(popen: subprocess.Popen[bytes], descriptor: ProcessDescriptor | None = None) -> bool:
    """Whether ``popen``'s process no longer runs: stopped (every thread of it: a SIGSTOP took effect), exited, or
    reaped. Never reaps, and consumes no stop report (``waitid`` with ``WSTOPPED | WEXITED | WNOWAIT``); any thread
    may ask.

    Asked as :func:`exit_status` asks: through ``descriptor`` where there is one, so a number another process
    took since is never read; by pid where there is none, the process's own while it is not reaped. True where
    the system cannot tell (no ``waitid``): not waited for. A stop whose report another waiter consumed
    (``waitpid`` with ``WUNTRACED``; nothing in psflow does) reads as running until its next stop.
    """
    if popen.returncode is not None or (descriptor is None and not hasattr(os, "waitid")):
        return True
    try:
        info = _ask(popen, descriptor, os.WEXITED | os.WSTOPPED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None and info.si_pid != 0


def _ask(popen: subprocess.Popen[bytes], descriptor: ProcessDescriptor | None, options: int) -> os.waitid_result | None:
    """``waitid`` of ``popen``'s process with ``options``: through ``descriptor`` where there is one, else by pid
    (the system has ``waitid``: the caller checked).

    Raises:
        ChildProcessError: the process was reaped (or its descriptor closed: reaped and recorded).
    """
    if descriptor is not None:
        return descriptor.waitid(options)
    return os.waitid(os.P_PID, popen.pid, options)


class ProcessDescriptor:
    """A process descriptor (a pidfd) of one child process, that signals and exit checks go through from any thread
    and that is closed once (by whoever first calls :meth:`close`: the watch loop once it reaped the process and
    recorded its exit, or the owner's collection). It names that process alone: a signal or a ``waitid`` through it
    reaches that process or, once it is reaped, fails; never another process given the pid later. Thread-safe: a
    use and the closing are serialized, so nothing goes through the number after it was closed (when it may name
    another file, another task's descriptor)."""

    def __init__(self, fd: int, pid: int) -> None:
        self._fd: int | None = fd
        self._pid = pid
        self._by_pid = not hasattr(os, "P_PIDFD")  # waitid by pid: no P_PIDFD here (Python, or Linux 5.3)
        self._lock = threading.Lock()

    @classmethod
    def open(cls, pid: int) -> ProcessDescriptor | None:
        """The descriptor of ``pid``, a child not reaped (open it right after starting the process, before any
        thread can reap it), or None where the system has none (``pidfd_open``: Linux 5.3+)."""
        try:
            return cls(os.pidfd_open(pid), pid)
        except (AttributeError, OSError):
            return None

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

    def waitid(self, options: int) -> os.waitid_result | None:
        """``os.waitid`` of the process with ``options`` (include ``WNOWAIT`` to reap nothing: the watch loop's
        ``Popen`` reaps), through the descriptor (``P_PIDFD``, Linux 5.4+), so the answer is this process's even
        where its pid was freed and taken by another. Where the kernel has no ``P_PIDFD`` (5.3), by pid: the
        process's own only while it is not reaped.

        Raises:
            ChildProcessError: the process was reaped (or the descriptor closed: reaped and recorded).
        """
        with self._lock:
            if self._fd is None:
                raise ChildProcessError(f"pid {self._pid} was reaped (its process descriptor is closed)")
            if not self._by_pid:
                try:
                    return os.waitid(os.P_PIDFD, self._fd, options)
                except OSError as e:
                    if e.errno != errno.EINVAL:
                        raise
                    self._by_pid = True  # a kernel with pidfd_open but no waitid(P_PIDFD)
            return os.waitid(os.P_PID, self._pid, options)

    def close(self) -> None:
        """Closes the descriptor; idempotent."""
        with self._lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
