"""psflow.launch.lifeline: stop requests in real child processes, launcher signals in this one.

Each child is a real ``python -c`` process, ended by pid (SIGKILL) if a test leaves it; every wait
is bounded (a safety net, never an assertion on speed).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator

import pytest
from support import REPO

from psflow.launch import launcher_signals, lifeline
from psflow.launch.lifeline import LauncherSignals, LaunchInterrupted, Lifeline, StopRequest, signal_name
from psflow.launch.supervisor import describe_exit

pytestmark = pytest.mark.timeout(120)

LIMIT = 60.0  # safety net, seconds

Starter = Callable[..., subprocess.Popen[str]]

# A child that starts a StopRequest (lifeline fd in argv[1], or -1), says "ready", then runs BODY. Its stop signals
# start at their default action, whatever this pytest process ignores (run under nohup, say).
CHILD = """
import logging, signal, sys, threading, time
for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):  # as a task not started ignoring any (nohup)
    signal.signal(sig, signal.SIG_DFL)
logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
from psflow.launch.lifeline import StopRequest
stop = StopRequest("/job:test/task:0", grace=GRACE, drain=DRAIN)
stop.install_handlers()
stop.start(int(sys.argv[1]) if int(sys.argv[1]) >= 0 else None)
print("ready", flush=True)
BODY
"""


@pytest.fixture
def child() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []

    def start(body: str, *, fd: int = -1, grace: float = 2.0, drain: float = 0.5) -> subprocess.Popen[str]:
        code = CHILD.replace("GRACE", str(grace)).replace("DRAIN", str(drain)).replace("BODY", textwrap.dedent(body))
        proc = subprocess.Popen([sys.executable, "-c", code, str(fd)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd=str(REPO), pass_fds=(fd,) if fd >= 0 else ())
        started.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the child is ready (or dies: then not "ready")
        assert line.strip() == "ready", line + proc.stdout.read()
        return proc

    try:
        yield start
    finally:
        for proc in started:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.communicate()


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=LIMIT)
    return proc.returncode, out


# A main loop that checks the request between steps, as the worker loop does.
LOOP = """
while stop.requested() is None:
    time.sleep(0.01)
print(f"left the loop: {stop.requested()}\\n", end="", flush=True)  # one write: the stop thread logs to stdout too
sys.exit(stop.exit_code)
"""


def test_sigterm_stops_the_loop_cleanly_with_143(child: Starter) -> None:
    proc = child(LOOP)
    os.kill(proc.pid, signal.SIGTERM)
    code, out = finish(proc)
    assert code == 143, out
    assert "left the loop: SIGTERM" in out and "exiting now" not in out, out


def test_lifeline_eof_stops_the_task_with_129(child: Starter) -> None:
    lifeline = Lifeline()
    try:
        proc = child(LOOP, fd=lifeline.task_fd)
    finally:
        lifeline.close()  # as the launcher's death would: the child holds the only read end left
    code, out = finish(proc)
    assert code == 129, out
    assert "left the loop: the launcher is gone" in out, out


def test_a_blocked_wait_is_ended_by_the_interrupt_callbacks(child: Starter) -> None:
    """A main thread blocked in a wait no signal ends (a sync barrier) is released by on_interrupt."""
    body = """
    barrier = threading.Event()
    stop.on_interrupt(barrier.set)
    barrier.wait()
    print(f"released: {stop.requested()}\\n", end="", flush=True)
    sys.exit(stop.exit_code)
    """
    proc = child(body, grace=30.0, drain=0.2)
    os.kill(proc.pid, signal.SIGHUP)
    code, out = finish(proc)
    assert code == 129 and "released: SIGHUP" in out, out


def test_a_stuck_main_thread_is_ended_by_the_deadline_with_the_same_status(child: Starter) -> None:
    """The deadlock of issue 17 (a non-reentrant lock taken again): the handler takes no lock and
    raises nothing, so the task cannot hang; the stop's deadline exits with 143."""
    body = """
    lock = threading.Lock()
    lock.acquire()
    lock.acquire()  # never returns
    """
    proc = child(body, grace=0.5, drain=0.1)
    os.kill(proc.pid, signal.SIGTERM)
    code, out = finish(proc)
    assert code == 143, out
    assert "exiting now with status 143" in out, out


def test_a_signal_handed_to_another_thread_stops_a_main_thread_blocked_for_good(child: Starter) -> None:
    """The kernel may hand the process's signal to any thread, and Python's handler runs on the main thread only
    when it next runs Python code: one blocked in a wait that nothing but the stop ends (a ps task's
    ``Server.join()``, a sync barrier) ran it never, and without the wakeup fd nothing woke the watcher either."""
    body = """
    import signal
    def main_thread_waits():  # in barrier.wait() (not in Thread.start()'s own wait, say)
        frame = sys._current_frames().get(threading.main_thread().ident)
        while frame is not None and frame.f_locals.get("self") is not barrier:
            frame = frame.f_back
        return frame is not None
    def signal_this_thread():
        deadline = time.monotonic() + 60
        while not (main_thread_waits() and time.sleep(0.05) is None and main_thread_waits()):  # asleep in it
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    barrier = threading.Event()
    stop.on_interrupt(barrier.set)
    threading.Thread(target=signal_this_thread, daemon=True).start()
    barrier.wait()
    print(f"released: {stop.requested()}\\n", end="", flush=True)
    sys.exit(stop.exit_code)
    """
    proc = child(body, grace=30.0, drain=0.2)
    code, out = finish(proc)
    assert code == 143 and "released: SIGTERM" in out, out


def test_signals_into_a_full_self_pipe_neither_block_nor_warn(child: Starter) -> None:
    """Once the stop is under way the watcher reads the self-pipe no more, and every later signal writes a byte to
    it (the C handler, as wakeup fd, and the Python handler): a full pipe must not block the handler nor print
    'Exception ignored when trying to write to the signal wakeup fd'. The first signal still decides the status."""
    body = """
    import os, signal
    os.kill(os.getpid(), signal.SIGTERM)
    while not stop._stopping:  # the watcher left its loop: nothing reads the pipe any more
        time.sleep(0.01)
    filled = 0
    for chunk in (4096, 1):  # (a write of up to 4096 bytes is all or nothing: the last bytes one by one)
        try:
            while True:
                filled += os.write(stop._wake_write, b"\\0" * chunk)
        except BlockingIOError:
            pass
    other = threading.Thread(target=time.sleep, args=(30,), daemon=True)
    other.start()
    for _ in range(20):
        signal.pthread_kill(other.ident, signal.SIGINT)
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(0.001)
    print(f"still running, the pipe full after {filled} bytes: {stop.requested()}\\n", end="", flush=True)
    os._exit(stop.exit_code)  # as a stopped task exits: a signal still on its way finds no default handler restored
    """
    proc = child(body, grace=30.0, drain=0.1)
    code, out = finish(proc)
    assert code == 143 and "still running, the pipe full" in out and ": SIGTERM" in out, out
    assert "Exception ignored" not in out and "Traceback" not in out, out


def test_stop_timings_are_checked() -> None:
    with pytest.raises(ValueError, match="drain"):
        StopRequest("/job:ps/task:0", grace=1.0, drain=2.0)


def test_describe_exit_names_the_stop_signal() -> None:
    assert describe_exit(143) == "exited on SIGTERM (code 143)"
    assert describe_exit(129) == "exited on SIGHUP (code 129)"
    assert describe_exit(130) == "exited on SIGINT (code 130)"
    assert describe_exit(137) == "exited with code 137"  # 128 + SIGKILL is not a stop: a process cannot exit "on" it
    assert describe_exit(-signal.SIGKILL) == "was killed by signal SIGKILL"
    assert signal_name(15) == "SIGTERM" and signal_name(99) == "signal 99"


def _deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    deadline = time.monotonic() + LIMIT
    while time.monotonic() < deadline:  # the handler runs on this thread between two bytecodes
        time.sleep(0.01)


@pytest.fixture
def stop_signals_default() -> Iterator[None]:
    """This process's stop signals at their default action for the test (a pytest run under nohup ignores SIGHUP,
    and one in the background of a script SIGINT, which LauncherSignals would leave ignored), as they were after."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    for sig in before:
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@pytest.mark.usefixtures("stop_signals_default")
def test_launcher_signal_in_a_deferred_section_waits_for_the_check() -> None:
    before = signal.getsignal(signal.SIGTERM)
    signals = LauncherSignals()
    assert signals.install()
    try:
        with signals.deferring(check=False):
            os.kill(os.getpid(), signal.SIGTERM)
            while signals.received is None:  # recorded, not raised
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGHUP)  # a second signal changes nothing: a cleanup is never cut
            time.sleep(0.05)
            with pytest.raises(LaunchInterrupted) as caught:
                signals.check()
        assert caught.value.signum == signal.SIGTERM and caught.value.exit_code == 143
        assert isinstance(caught.value, KeyboardInterrupt)  # what SIGINT always raised
        with pytest.raises(LaunchInterrupted), signals.deferring():  # leaving the section checks
            pass
    finally:
        signals.restore()
    assert signal.getsignal(signal.SIGTERM) == before


@pytest.mark.usefixtures("stop_signals_default")
def test_launcher_signal_outside_a_deferred_section_raises_at_once() -> None:
    signals = LauncherSignals()
    assert signals.install()
    try:
        with pytest.raises(LaunchInterrupted) as caught:
            _deliver(signal.SIGHUP)
        assert caught.value.exit_code == 129 and "SIGHUP" in str(caught.value)
    finally:
        signals.restore()


# A caller with handlers and a wakeup fd of its own runs StopRequests, one after another, and goes on.
CALLER = """
import os, signal, sys, time
from psflow.launch.lifeline import STOP_SIGNALS, StopRequest
got = []
def mine(signum, frame):
    got.append(signum)
signal.signal(signal.SIGTERM, mine)
signal.signal(signal.SIGINT, mine)
signal.signal(signal.SIGHUP, signal.SIG_IGN)  # ignored by the caller: a StopRequest leaves it so
read, write = os.pipe()
os.set_blocking(write, False)
signal.set_wakeup_fd(write, warn_on_full_buffer=False)
before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
for round in range(2):
    with StopRequest("/job:test/task:0") as stop:
        assert stop.install_handlers(), round
        stop.start()
        assert signal.getsignal(signal.SIGTERM) == stop._handle and stop.ignored == (signal.SIGHUP,), round
        watcher = stop._thread
    assert {sig: signal.getsignal(sig) for sig in STOP_SIGNALS} == before, round
    assert signal.set_wakeup_fd(write, warn_on_full_buffer=False) == write, round  # the caller's, back
    assert watcher is not None and not watcher.is_alive() and stop.requested() is None, round
    assert not stop.install_handlers(), round  # closed: installs nothing again
os.kill(os.getpid(), signal.SIGTERM)
deadline = time.monotonic() + 60
while not got and time.monotonic() < deadline:  # the handler runs on this thread between two bytecodes
    time.sleep(0.01)
print(f"caller got {got}; wakeup fd read {list(os.read(read, 16))}", flush=True)
"""


def test_close_puts_back_the_callers_handlers_and_wakeup_fd_and_a_second_request_works() -> None:
    """A program that runs a task (``run_task(stop=None)``) and goes on: once the StopRequest is closed, its own
    SIGTERM and SIGINT handlers and its wakeup fd are in place again (they were psflow's for the rest of the
    process), its ignored SIGHUP still ignored, the watcher thread ended; a second StopRequest works the same."""
    proc = subprocess.run([sys.executable, "-c", CALLER], capture_output=True, text=True, cwd=str(REPO),
                          timeout=LIMIT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"caller got [{int(signal.SIGTERM)}]; wakeup fd read [{int(signal.SIGTERM)}]" in proc.stdout, proc.stdout


@pytest.mark.usefixtures("stop_signals_default")
def test_the_launcher_leaves_an_inherited_ignored_signal_ignored_and_says_so_once(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``nohup psflow train``: SIGHUP stays ignored (its tasks inherit the ignore through exec), SIGTERM and SIGINT
    stop the run; one line on stderr says so, once however often the handlers are installed."""
    monkeypatch.setattr(launcher_signals, "_SAID", set())
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    for _ in range(2):
        signals = LauncherSignals()
        assert signals.install()
        try:
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN and signals.ignored == (signal.SIGHUP,)
            assert signal.getsignal(signal.SIGTERM) == signals._handle
            os.kill(os.getpid(), signal.SIGHUP)  # discarded as it is sent: nothing to raise
        finally:
            signals.restore()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert capsys.readouterr().err == "psflow: SIGHUP is ignored (inherited): stop with SIGTERM or SIGINT\n"


def test_the_notice_names_what_still_stops() -> None:
    assert lifeline.stop_signals_notice(()) is None
    assert lifeline.stop_signals_notice((signal.SIGHUP, signal.SIGINT)) == \
        "SIGHUP and SIGINT are ignored (inherited): stop with SIGTERM"
    assert lifeline.stop_signals_notice(lifeline.STOP_SIGNALS) == \
        "SIGTERM, SIGHUP and SIGINT are ignored (inherited): only SIGKILL (or a launcher's exit) stops it"
