"""The local launcher's answer to a port taken between its choice and a task's bind.

The launcher picks its tasks' ports (:func:`psflow.launch.ports.free_ports`),
writes them to ``cluster.json`` and starts the tasks, which bind them; another
process can bind one in between. The task then fails with a
:class:`~psflow.rpc.api.ListenError` whose ``port_taken`` its error file
records (``error-<job>-<index>.json``, :func:`psflow.launch.task.expected_failure`).

If that happens before training started, :func:`run_local
<psflow.launch.local.run_local>` stops every task it started, picks new ports
for all of them, rewrites ``cluster.json`` and starts them again, at most
:data:`PORT_ATTEMPTS` times in all, with one console line per new start.
"Training started" means a global_step value was handed out: ps task 0's step
journal (``state/<job>-<index>/global_step.json`` under the run directory)
was written after the attempt's tasks were started (:class:`StartupWatch`).
Before that no push has been applied, so no training state is lost by starting
again (a checkpoint the chief may have saved holds only the initial values,
and the new chief restores it as any resumed run does). After it, a taken port
is a task failure like any other (the restart policy, or the run fails).

Every start of a run uses the run's one :class:`~psflow.launch.launcher_signals.LauncherSignals`
(:func:`start_until_bound`): between two starts its handlers stay in place, and a SIGTERM, SIGHUP or SIGINT there
ends the run as one anywhere else does (the next start raises it where its end reports it: metrics.json
``interrupted``, exit status ``128 + n``, the run's locks released).
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable
from typing import TextIO, TypeVar

from psflow.launch.launcher_signals import LauncherSignals
from psflow.launch.processes import LaunchError, TaskProcess
from psflow.server import STEP_JOURNAL_FILE

__all__ = ["PORT_ATTEMPTS", "PortTaken", "StartupWatch", "start_until_bound", "taken_port"]

T = TypeVar("T")

#: Starts of the cluster in all (the first one included) when its ports keep being taken.
PORT_ATTEMPTS = 3


class PortTaken(LaunchError):
    """A task could not bind the port the launcher picked for it: another process held it.

    Raised before training started (see the module docstring); ``run_local`` starts the cluster
    again on new ports, or, after the last attempt, reports it as the run's failure.
    """

    starts_again = True  # not the run's failure: LocalCluster.__exit__ lets a signal during its stop end the launch

    def __init__(self, message: str, *, task: str, port: int) -> None:
        super().__init__(message)
        self.task = task
        self.port = port

    def retry_line(self) -> str:
        """The console line for starting again."""
        return (f"port {self.port} of {self.task} was taken by another process; "
                "starting the cluster again on new ports")


def taken_port(task: TaskProcess) -> int | None:
    """The port ``task`` could not bind because another process held it, from its error file; None when
    the task did not fail that way (or is still running, or wrote no readable error file)."""
    if task.exit_code in (None, 0):
        return None
    port = (task.error_record() or {}).get("port_taken")
    return port if isinstance(port, int) and not isinstance(port, bool) else None


class StartupWatch:
    """Whether training started since this was made: a global_step journal under ``output_dir/state``
    is new or changed (an earlier run's journals in a reused run directory are not training of this one).
    Reads a few small directories' entries; never raises for a missing one."""

    def __init__(self, output_dir: str) -> None:
        self._pattern = os.path.join(output_dir, "state", "*", STEP_JOURNAL_FILE)
        self._before = self._journals()

    def _journals(self) -> dict[str, tuple[int, int]]:
        seen: dict[str, tuple[int, int]] = {}
        for path in glob.glob(self._pattern):
            try:
                st = os.stat(path)
            except OSError:
                continue
            seen[path] = (st.st_mtime_ns, st.st_ino)
        return seen

    def training_started(self) -> bool:
        return self._journals() != self._before


def start_until_bound(start: Callable[[bool], T], signals: LauncherSignals, out: TextIO) -> T:
    """``start(retry_ports)`` (one start of the run's cluster, with ``signals``), again after each
    :class:`PortTaken` (its line on ``out``), at most :data:`PORT_ATTEMPTS` starts, the last with ``retry_ports``
    False (a taken port then fails the run as any failure does); returns what the start that held returned.

    Between two starts ``signals``' handlers stay in place (the cluster left parks them:
    :meth:`~psflow.launch.launcher_signals.LauncherSignals.park`): a signal there is raised by the next start, whose
    end reports it. They are put back once the starts are over, however they end (a finished run's: the end's
    handlers, :func:`~psflow.launch.launcher_signals.hold_to_exit`)."""
    try:
        for _ in range(PORT_ATTEMPTS - 1):
            try:
                return start(True)
            except PortTaken as e:  # before training started; every task stopped: new ports, every task again
                print(e.retry_line(), file=out, flush=True)
        return start(False)
    finally:
        signals.restore()
