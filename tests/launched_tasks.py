"""Stand-ins of the launcher's task processes and of its cluster, for the chaos and resilience tests that drive
:class:`~psflow.launch.resilience.Resilience` and :class:`~psflow.launch.chaos.ChaosInjector` without starting a
cluster: what they read of a task (job, index, name, pid, exit code) and of the cluster (spec, tasks, token, output
directory)."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from psflow.cluster import ClusterSpec
from psflow.launch.exits import exit_status, stopped


@dataclass
class FakeTask:
    """A launched task: a pid (a real process's where a test signals it), running while ``exit_code`` is None."""

    job: str
    index: int
    pid: int
    exit_code: int | None = None
    popen: subprocess.Popen[bytes] | None = None  # a real process's, where a test lets its exit be found

    def exited(self) -> int | None:
        """As :meth:`psflow.launch.processes.TaskProcess.exited`: the recorded exit code, else ``popen``'s (not reaped)."""
        if self.exit_code is not None or self.popen is None:
            return self.exit_code
        return exit_status(self.popen)

    def stopped(self) -> bool:
        """As :meth:`psflow.launch.processes.TaskProcess.stopped`: ``popen``'s where given (by pid: not reaped), else
        the state of the test's own process at ``pid`` (True where there is none)."""
        if self.exit_code is not None:
            return True
        if self.popen is not None:
            return stopped(self.popen)
        try:
            state = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return True
        return state in ("T", "t", "Z", "X")

    def send_signal(self, sig: int) -> None:
        """As :meth:`psflow.launch.processes.TaskProcess.send_signal`, by pid (a test's own process, or none)."""
        os.kill(self.pid, sig)

    @property
    def name(self) -> str:
        return f"/job:{self.job}/task:{self.index}"


@dataclass
class FakeCluster:
    """A launched cluster: its spec and its tasks (a test replaces one to restart it)."""

    cluster: ClusterSpec
    tasks: list[FakeTask]
    token: str | None = None
    output_dir: str = "."
