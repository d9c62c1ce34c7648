"""Sends the ``psflow train`` launcher a SIGTERM (to itself, by pid: a real signal, handled as any other) at one
point after its finished run's end was written (for tests/integration/test_signal_after_the_end.py; on a process's
path only where a test puts this directory on PYTHONPATH). ``PSFLOW_TEST_LATE_SIGNAL`` names the point:

* ``while_written``: as the finished run's metrics.json, status.json and metrics.prom have just been written, inside
  the section that defers signals while they are (``RunEnd._write``): raised once it is left (a failed run's instead
  with ``PSFLOW_TEST_LATE_SIGNAL_PHASE=failed``);
* ``after_written``: as ``RunEnd.finished`` returns (the end written, signals not deferred: raised at once);
* ``in_shutdown``: as the launcher asks the ps tasks to shut down (the section after the end that defers signals);
* ``in_process_written``: (``--in-process``) as the finished run's files have just been written (its ``on_end``, which
  defers signals while it writes them): raised once they are;
* ``after_restore``: as the launcher's signal handlers were put back after a run's end was written (``LauncherSignals
  .restore``: ``LocalCluster.__exit__``, or ``--in-process``'s end), before the process exits;
* ``after_restore_twice``: there, two SIGTERMs (the second stops the process at once: before the run's summary is
  printed and its run lock released);
* ``as_it_exits``: as the interpreter finalizes, its modules cleared (after Python put its default signal actions
  back): an object of this module's, destroyed then.

With ``PSFLOW_TEST_METRICS_UNWRITABLE=1`` every write of the launcher's metrics.json fails too, as on a full disk
(``metrics_unwritable/sitecustomize.py``, run from here: one sitecustomize is imported per process).

Only the first time; the task processes (which also read this file) are never signalled.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

_POINT = os.environ.get("PSFLOW_TEST_LATE_SIGNAL")
_sent: list[bool] = []

if os.environ.get("PSFLOW_TEST_METRICS_UNWRITABLE") == "1":
    import runpy

    runpy.run_path(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "metrics_unwritable",
                                "sitecustomize.py"))


def _signal_the_launcher(times: int = 1) -> None:
    if not _sent and "psflow.launch.task" not in " ".join(sys.argv) and "train" in sys.argv:
        _sent.append(True)
        os.kill(os.getpid(), signal.SIGTERM)
        if times == 2:  # the second once the first was handled (said: two pending at once would be one)
            from psflow.launch import launcher_signals

            for _ in range(600):
                if launcher_signals._HELD.said:
                    break
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10.0)  # (it stops the process meanwhile)


if _POINT == "while_written":
    from psflow.launch import run_end

    _write = run_end.write_run_files

    def _signalled_write(final: Any, *args: Any, **kwargs: Any) -> Any:
        written = _write(final, *args, **kwargs)
        if final.get("phase") == os.environ.get("PSFLOW_TEST_LATE_SIGNAL_PHASE", "finished"):
            _signal_the_launcher()
        return written

    run_end.write_run_files = _signalled_write

elif _POINT == "after_written":
    from psflow.launch import run_end

    _finished = run_end.RunEnd.finished

    def _signalled_finished(self: Any, **kwargs: Any) -> Any:
        final = _finished(self, **kwargs)
        _signal_the_launcher()
        return final

    run_end.RunEnd.finished = _signalled_finished  # type: ignore[method-assign]

elif _POINT == "in_process_written":
    from psflow.launch import run_status

    _write_in_process = run_status.write_run_files

    def _signalled_in_process(final: Any, *args: Any, **kwargs: Any) -> Any:
        written = _write_in_process(final, *args, **kwargs)
        if final.get("phase") == "finished":
            _signal_the_launcher()
        return written

    run_status.write_run_files = _signalled_in_process

elif _POINT in ("after_restore", "after_restore_twice"):
    from psflow.launch import launcher_signals

    _restore = launcher_signals.LauncherSignals.restore

    def _signalled_restore(self: Any) -> None:
        _restore(self)
        if self.ended is not None or self.unwritten is not None:  # a run's end was written (or its writing failed)
            _signal_the_launcher(2 if _POINT == "after_restore_twice" else 1)

    launcher_signals.LauncherSignals.restore = _signalled_restore  # type: ignore[method-assign]

elif _POINT == "in_shutdown":
    from psflow.ps import client

    _shutdown = client.ParameterClient.shutdown_servers

    def _signalled_shutdown(self: Any, *args: Any, **kwargs: Any) -> Any:
        _signal_the_launcher()
        return _shutdown(self, *args, **kwargs)

    client.ParameterClient.shutdown_servers = _signalled_shutdown  # type: ignore[method-assign]

elif _POINT == "as_it_exits":

    class _SignalledAtTheExit:
        """Sends the launcher its SIGTERM when destroyed: as the interpreter clears this module, at its exit."""

        def __del__(self, kill: Any = os.kill, pid: int = os.getpid(), sig: int = signal.SIGTERM) -> None:
            kill(pid, sig)  # (the module's globals may be gone by then)

    if "psflow.launch.task" not in " ".join(sys.argv) and "train" in sys.argv:
        _AT_THE_EXIT = _SignalledAtTheExit()
