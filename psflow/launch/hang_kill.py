"""What is done about a hung task: its process, the one the health check saw hang, is SIGKILLed; never another.

:func:`kill_hung` takes the health monitor's report (:class:`~psflow.launch.health.TaskHealth`), which names the
process the hang was decided for (:attr:`~psflow.launch.health.TaskHealth.process`: the launcher's
:class:`~psflow.launch.processes.TaskProcess` of that round), and signals that process alone, through its process
descriptor (:meth:`~psflow.launch.processes.TaskProcess.send_signal`), so that neither a process that replaced it
under the task's name (the monitor decides under its lock and reports after releasing it: a restart may come in
between) nor a process given its pid since is touched. It returns the one line that says what the check saw and
what was done:

* ``...; killed pid N (SIGKILL)``: the process ran, and was signalled;
* ``...; pid N (incarnation k) was replaced before the kill: not killed``: it had exited and the task's
  replacement (its incarnation ``k + 1`` or later) runs under the name: the replacement was never judged;
* ``...; pid N had already exited (exit status S): not killed``: it exited (on its own, after the check) and is
  still the task's latest process;
* ``...; the check named no process: not killed``: the report names none (a check by task names only): nothing
  is signalled by name.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable
from typing import Any

from psflow.launch.health import TaskHealth

__all__ = ["kill_hung"]


def kill_hung(health: TaskHealth, current: Iterable[Any]) -> tuple[str, bool]:
    """SIGKILLs the process ``health`` was decided for, where it still runs; any thread may call it.

    Args:
        health: the monitor's report (its ``report`` line and ``process``).
        current: the launcher's task processes now (``LocalCluster.tasks``): tells a process replaced since the
            check from one that exited and is still its task's latest. None of them is signalled but the report's.

    Returns:
        The line saying what was seen and what was done (see the module docstring), and whether it killed.
    """
    task: Any = health.process  # a TaskProcess (exited, send_signal, pid, incarnation)
    if task is None:
        return f"{health.report}; the check named no process: not killed", False
    code, gone = task.exited(), True  # recorded, or exited and not reaped: a signal would reach its zombie only
    if code is None:
        try:
            task.send_signal(signal.SIGKILL)  # through its descriptor: the watch loop may have reaped it since
            gone = False
        except ProcessLookupError:  # reaped since: its status is Popen's record
            code = task.exited()
    if not gone:
        return f"{health.report}; killed pid {task.pid} (SIGKILL)", True
    if not any(t is task for t in current):
        return (f"{health.report}; pid {task.pid} (incarnation {task.incarnation}) was replaced before the kill: "
                "not killed"), False
    status = f" (exit status {code})" if code is not None else ""
    return f"{health.report}; pid {task.pid} had already exited{status}: not killed", False
