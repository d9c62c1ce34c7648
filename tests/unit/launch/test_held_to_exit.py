"""A process held to its exit (``psflow train``'s: ``hold_to_exit``) keeps a written end's exit status to the last
instruction: once the launcher put its handlers back after the end (``LauncherSignals.restore``), a stop signal is
said and ignored, the next one stops the process at once with the end's status; the release puts the handlers before
the run back. Before, the default action killed the process with 128 + n beside a finished end. Real processes, real
signals (each sent by the process to itself, by pid)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from psflow.launch.launcher_signals import LauncherSignals, hold_to_exit

pytestmark = pytest.mark.timeout(60)

SCRIPT = textwrap.dedent("""
    import os, signal, sys, time
    from psflow.launch.launcher_signals import LauncherSignals, hold_to_exit
    hold_to_exit()
    signals = LauncherSignals()
    signals.install()
    signals.end_written({"phase": PHASE, "global_step": 20, "exit_code": CODE}, ERROR)
    signals.restore()
    for n in range(SIGNALS):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)
    print("reached the exit", flush=True)
    sys.exit(7)
""")


def _run(phase: str, code: int | None, error: str | None, signals: int) -> subprocess.CompletedProcess[str]:
    script = (SCRIPT.replace("PHASE", repr(phase)).replace("CODE", repr(code)).replace("ERROR", repr(error))
              .replace("SIGNALS", str(signals)))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)


def test_a_signal_after_the_handlers_were_put_back_is_said_and_ignored() -> None:
    r = _run("finished", None, None, 1)
    assert (r.returncode, r.stdout) == (7, "reached the exit\n"), r  # its own exit: nothing killed it
    assert r.stderr == ("psflow: SIGTERM arrived after the run had finished at global_step 20: its end stands (exit "
                        "status 0); another signal stops the launcher at once\n"), r.stderr


@pytest.mark.parametrize(("phase", "code", "error", "status"), [("finished", None, None, 0), ("failed", 1, None, 1),
                                                                  ("finished", None, "could not write m.json", 1)])
def test_the_next_signal_stops_the_process_with_the_end_s_status(phase: str, code: int | None, error: str | None,
                                                                 status: int) -> None:
    r = _run(phase, code, error, 2)
    assert r.returncode == status and "reached the exit" not in r.stdout, r
    assert r.stderr.splitlines()[-1] == f"psflow: SIGTERM: the launcher stops now, exit status {status}", r.stderr
    if error is not None:
        assert "its end was not written whole (exit status 1)" in r.stderr, r.stderr


def test_the_release_puts_back_the_handlers_before_the_run() -> None:
    before = signal.getsignal(signal.SIGTERM)
    release = hold_to_exit()
    try:
        signals = LauncherSignals()
        assert signals.install()
        signals.end_written({"phase": "finished", "global_step": 3}, None)
        signals.restore()
        assert signal.getsignal(signal.SIGTERM) not in (before, signals._handle)  # the end's own
    finally:
        release()
    assert signal.getsignal(signal.SIGTERM) == before
    unheld = LauncherSignals()  # released: a later run's restore puts its previous handlers back
    assert unheld.install()
    unheld.end_written({"phase": "finished", "global_step": 3}, None)
    unheld.restore()
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_stop_at_once_says_what_it_leaves_undone() -> None:
    """``stop_at_once_leaves``: each part asked at the stop, with the end and whether it was written; one that returns
    None or raises is left out (the stop goes on, its status the end's)."""
    script = SCRIPT.replace("signals.restore()\n", "signals.restore()\n" + textwrap.dedent("""
        launcher_signals.stop_at_once_leaves("a", lambda end, written: f"a of step {end['global_step']} {written}")
        launcher_signals.stop_at_once_leaves("none", lambda end, written: None)
        launcher_signals.stop_at_once_leaves("raises", lambda end, written: 1 / 0)
        launcher_signals.stop_at_once_leaves("removed", lambda end, written: "removed")
        launcher_signals.stop_at_once_leaves("removed", None)
    """)).replace("from psflow.launch.launcher_signals import", "from psflow.launch import launcher_signals\n"
                  "from psflow.launch.launcher_signals import")
    script = (script.replace("PHASE", repr("finished")).replace("CODE", "None").replace("ERROR", "None")
              .replace("SIGNALS", "2"))
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=50)
    assert r.returncode == 0 and "reached the exit" not in r.stdout, r
    assert r.stderr.splitlines()[-1] == ("psflow: SIGTERM: the launcher stops now, exit status 0; not done: a of step "
                                         "20 True"), r.stderr
