"""Who holds a lock, and whether it is alive: the identity a lock file records and how it is judged.

A lock file (:mod:`psflow.checkpoint.lock`'s ``checkpoint.lock``, ``run.lock``, and an object store's
``directory.mutex``) names the process that vouches for its run: ``host``, ``pid``, ``pid_start`` (its start
time, in clock ticks since boot), ``boot_id`` and ``pid_ns`` (its pid namespace). :func:`holder_alive`
judges a pid only on its own host, boot and pid namespace; a lock of another host or of another pid
namespace on this one (another container sharing the kernel and, with host networking, the host name) is
unknown (None), never judged by a pid here. A lock without ``pid_ns`` (an older psflow's) is judged by host
and boot. Another user's process that /proc hides (mounted ``hidepid``) is alive: it exists (``kill`` says so),
and its missing /proc entry says nothing. :func:`is_this_process` says whether a lock names this very process (one
function for the lock's own release and ``psflow train``'s stop-at-once line). :func:`describe_holder` names the
holder in messages.

Used by :mod:`psflow.checkpoint.lock` (what a lock records, whether it is stale) and the evaluator
(:mod:`psflow.launch.evaluator`: whether the run it waits on is still alive).
"""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["holder_alive", "describe_holder", "is_this_process", "boot_id", "pid_namespace", "pid_start"]


def boot_id() -> str | None:
    """This machine's boot id (changes at every boot), or None without /proc."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def pid_namespace() -> str | None:
    """This process's pid namespace (``pid:[inode]``), or None without /proc."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks since boot) of ``pid`` from /proc, or None without /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except FileNotFoundError:
        return ("X", -1)
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    try:
        return fields[0], int(fields[19])
    except (IndexError, ValueError):
        return None


def pid_start(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return stat[1] if stat is not None and stat[1] >= 0 else None


def holder_alive(holder: dict[str, Any]) -> bool | None:
    """Whether the process a lock names is alive: True, False, or None (another host, or another pid namespace
    on this one, e.g. another container: unknown; its pid means nothing here)."""
    if holder.get("host") != socket.gethostname():
        return None
    boot, here = holder.get("boot_id"), boot_id()
    if boot is not None and here is not None and boot != here:
        return False  # written before this machine rebooted
    namespace = holder.get("pid_ns")
    if namespace is not None and namespace != pid_namespace():
        return None  # numbered in another pid namespace (a container beside this one, sharing its host name)
    pid = holder.get("pid")
    if type(pid) is not int or pid <= 0:
        return False
    hidden = False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        hidden = True  # another user's process: it exists (/proc may hide it: hidepid)
    stat = _proc_stat(pid)
    if stat is None or (hidden and stat == ("X", -1)):
        return True
    state, start = stat
    if state in ("Z", "X"):
        return False  # exited, not yet reaped
    recorded = holder.get("pid_start")
    return not (type(recorded) is int and start != recorded)  # else the pid was reused


def is_this_process(holder: dict[str, Any], run_id: str) -> bool:
    """Whether the lock content ``holder`` names this process, for run ``run_id``: its run id, pid and host, and
    its pid namespace, boot and the pid's start time where recorded (a lock without them, an older psflow's, is
    judged without). An earlier process of the run under this pid (after a reboot: the host's pid namespace is the
    same at every boot; or a pid reused) is another process, not this one. Reads /proc only (no store)."""
    pid = os.getpid()
    return (holder.get("run_id") == run_id and holder.get("pid") == pid
            and holder.get("host") == socket.gethostname() and holder.get("pid_ns") in (None, pid_namespace())
            and holder.get("boot_id") in (None, boot_id()) and holder.get("pid_start") in (None, pid_start(pid)))


def describe_holder(holder: dict[str, Any]) -> str:
    """``run R (pid N on HOST, since T, run directory D)``."""
    run_dir = holder.get("run_dir")
    return (f"run {holder.get('run_id')} (pid {holder.get('pid')} on {holder.get('host')}, since "
            f"{holder.get('since_text') or holder.get('since')}{f', run directory {run_dir}' if run_dir else ''})")
