"""A signal that arrives while ``LauncherSignals.restore`` puts the end's handlers in place of the launcher's (a process
held to its exit: ``hold_to_exit``, ``psflow train``'s) is the end's: said after the end and ignored, the next one
stops the process with the end's status, as one after the swap. The handlers are swapped one signal at a time; before,
a SIGINT landing after SIGTERM's was swapped met the launcher's own handler, which (no run going on, nothing
deferred) raised ``LaunchInterrupted`` out of ``restore``: ``psflow train`` said ``interrupted by SIGINT`` of a
finished run, and the swap stopped half-way, SIGHUP and SIGINT left with the launcher's handler, which then ignored
every later one without a word. Real processes, real signals: the swap point is made exact by a wrapper of
``signal.signal`` in the child that sends the signal (to itself, by pid) once the first handler was swapped."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from psflow.launch import launcher_signals
    from psflow.launch.launcher_signals import LauncherSignals, hold_to_exit
    from psflow.launch.stop_signals import STOP_SIGNALS

    hold_to_exit()
    signals = LauncherSignals()
    signals.install()
    signals.end_written({"phase": PHASE, "global_step": 20, "exit_code": CODE}, None)
    real = signal.signal
    sent = []

    def swapping(sig, handler):
        previous = real(sig, handler)
        if not sent and previous == signals._handle:  # the first handler swapped: the last one not yet
            sent.append(STOP_SIGNALS[-1])
            os.kill(os.getpid(), STOP_SIGNALS[-1])
            time.sleep(0.05)  # (handled at the next instruction of this thread)
        return previous

    signal.signal = swapping
    try:
        signals.restore()
    except BaseException as e:
        print(f"restore raised {type(e).__name__}: {e}", flush=True)
    signal.signal = real
    print("swapped:", sorted(signal.getsignal(s) == signals._handle for s in STOP_SIGNALS), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(1.0)
    print("reached the exit", flush=True)
    sys.exit(7)
""")


@pytest.mark.parametrize(("phase", "code", "status"), [("finished", None, 0), ("failed", 1, 1)])
def test_a_signal_during_the_swap_to_the_end_s_handlers_is_the_end_s(phase: str, code: int | None,
                                                                    status: int) -> None:
    script = SCRIPT.replace("PHASE", repr(phase)).replace("CODE", repr(code))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert "restore raised" not in r.stdout, (r.stdout, r.stderr)
    assert "swapped: [False, False, False]" in r.stdout, (r.stdout, r.stderr)  # every handler the end's
    assert r.returncode == status and "reached the exit" not in r.stdout, (r.returncode, r.stdout, r.stderr)
    lines = r.stderr.splitlines()
    assert lines[0] == (f"psflow: SIGINT arrived after the run had {phase} at global_step 20: its end stands (exit "
                        f"status {status}); another signal stops the launcher at once"), r.stderr
    assert lines[-1].startswith(f"psflow: SIGTERM: the launcher stops now, exit status {status}"), r.stderr


EXIT_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from psflow.launch.launcher_signals import LauncherSignals, hold_to_exit

    class SignalledAtTheExit:  # destroyed as the interpreter clears its modules: after Python's own handlers went
        def __del__(self, kill=os.kill, pid=os.getpid(), sig=signal.SIGTERM):
            kill(pid, sig)

    hold_to_exit()
    signals = LauncherSignals()
    signals.install()
    signals.end_written({"phase": "finished", "global_step": 20}, None)
    signals.restore()
    print("exiting", flush=True)
    kept = SignalledAtTheExit()
    sys.exit(0)
""")


def test_a_signal_as_the_interpreter_finalizes_leaves_the_end_s_status() -> None:
    """Python puts the default action back in place of every Python handler as it finalizes (after the exit functions,
    before the modules are cleared); a SIGTERM from there killed ``psflow train`` with 143 beside a finished run's
    metrics.json and summary (seen: a real run SIGTERMed as it exited). Now, once an end is held, the exit functions
    leave the stop signals ignored for that last stretch: the exit status is the one the process exits with."""
    r = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=50)
    assert (r.returncode, r.stdout) == (0, "exiting\n"), (r.returncode, r.stdout, r.stderr)
