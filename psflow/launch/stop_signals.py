"""psflow's stop signals (SIGTERM, SIGHUP, SIGINT), and which of them this process ignores.

The task side (:class:`~psflow.launch.lifeline.StopRequest`) and the launcher's
(:class:`~psflow.launch.launcher_signals.LauncherSignals`) both handle these.
A stop signal that is ignored (``SIG_IGN``) when the handlers are
installed stays ignored: ``nohup psflow server ...`` or ``nohup psflow
train ... &`` survives the terminal's hangup, and a background job of a
non-interactive shell (``psflow server ... &`` in a script) is not stopped
by SIGINT. This is the POSIX convention (``nohup`` sets SIGHUP to be
ignored and execs the command; the GNU C Library's manual, *Initial
Signal Actions*, asks a program to check for an inherited ``SIG_IGN``
before it installs a handler) and Python's own (it raises
KeyboardInterrupt on SIGINT only where SIGINT was not ignored at start).
The process logs once which signals stop it (``SIGHUP is ignored
(inherited): stop with SIGTERM or SIGINT``). An ignored signal is
inherited across ``exec``, so the tasks that ``psflow train`` starts
ignore what their launcher ignores, and behave as it was asked to: a
SIGHUP to one of them is ignored too. The launcher's death still stops
them (the lifeline pipe; the parent-death signal is SIGHUP, ignored then).
"""

from __future__ import annotations

import signal

__all__ = ["STOP_SIGNALS", "ignored_stop_signals", "signal_name", "stop_signals_notice"]

#: The signals that stop a task or the launcher in order (the first one wins).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; ``signal 99`` for a number that names no signal."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def ignored_stop_signals() -> tuple[int, ...]:
    """The :data:`STOP_SIGNALS` this process ignores now (``SIG_IGN``; inherited, as under ``nohup``)."""
    return tuple(sig for sig in STOP_SIGNALS if signal.getsignal(sig) == signal.SIG_IGN)


def stop_signals_notice(ignored: tuple[int, ...]) -> str | None:
    """The line that says which stop signals are ignored and which still stop; None when none is ignored.

    ``SIGHUP is ignored (inherited): stop with SIGTERM or SIGINT``.
    """
    if not ignored:
        return None
    names = [signal_name(sig) for sig in STOP_SIGNALS if sig in ignored]
    stoppers = [signal_name(sig) for sig in STOP_SIGNALS if sig not in ignored]
    said = names[0] + " is" if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]} are"
    how = f"stop with {' or '.join(stoppers)}" if stoppers else "only SIGKILL (or a launcher's exit) stops it"
    return f"{said} ignored (inherited): {how}"
