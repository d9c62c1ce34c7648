"""A stop signal the kernel hands to a thread other than the main one still stops the process.

A signal sent to a process goes to whichever of its threads the kernel picks (one with no signal pending: the
main thread, if it has one pending already, is passed over). CPython's C handler runs in that thread and only
marks the signal; the Python handler runs on the main thread when it next runs Python code. A main thread
asleep in one long wait ran it only when the wait ended:

* a ps task in ``Server.join()`` (for ever): such a SIGTERM did nothing (StopRequest's wakeup fd now);
* the local launcher waiting for its eval set's read, an in-process run waiting for its reader process's next
  batch (:func:`psflow.waits.wait_woken` now); the in-process save's wait is test_in_process_interrupt_save's.

The signal goes to one named thread: of a real task process (``tgkill``, from this process), or of a real run in
a fresh process (``pthread_kill``), the case the kernel's choice gives now and then.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support import A9A, A9A_T, REPO, in_fresh_process, wait_until, with_stop_signals

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

LIMIT = 60.0  # safety net, seconds: a passing run takes well under one

_SYS_TGKILL = {"x86_64": 234, "aarch64": 131}


def tgkill(pid: int, tid: int, sig: int) -> None:
    """Sends ``sig`` to thread ``tid`` of process ``pid`` (Linux's tgkill; os.kill picks no thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    number = _SYS_TGKILL.get(os.uname().machine)
    if number is None:
        pytest.skip(f"tgkill's syscall number unknown on {os.uname().machine}")
    if libc.syscall(number, pid, tid, sig) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill({pid}, {tid}, {sig})")


def other_threads(pid: int) -> list[int]:
    """The ids of ``pid``'s threads other than its main one (whose id is the pid)."""
    return sorted(int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="tgkill and /proc are Linux's")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_serving_ps_task_stops_on_a_signal_handed_to_another_thread(tmp_path: Path, sig: int) -> None:
    address = f"127.0.0.1:{free_ports(1)[0]}"
    cluster = tmp_path / "cluster.json"
    cluster.write_text(ClusterSpec({"ps": [address], "worker": ["127.0.0.1:1"]}).to_json())
    log = tmp_path / "ps-0.log"
    with open(log, "wb") as out:
        # (with_stop_signals: SIGINT not ignored even where this pytest process inherited it ignored)
        command = [sys.executable, "-m", "psflow", "server", "--cluster", str(cluster), "--job", "ps", "--task", "0",
                   "--insecure"]
        proc = subprocess.Popen(with_stop_signals(command), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, cwd=str(REPO), env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        wait_until(lambda: "serving at" in log.read_text(errors="replace") or proc.poll() is not None,
                   "the ps task serving", limit=LIMIT)
        assert proc.poll() is None, log.read_text(errors="replace")
        threads = other_threads(proc.pid)
        assert threads, "the ps task runs one thread only"
        tgkill(proc.pid, threads[-1], sig)  # (the newest: a server's thread, not the main one)
        try:
            code = proc.wait(timeout=LIMIT)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the ps task still serves {LIMIT:.0f} s after {signal.Signals(sig).name} to its thread "
                        f"{threads[-1]}:\n{log.read_text(errors='replace')[-3000:]}")
        assert code == 128 + sig, log.read_text(errors="replace")[-3000:]
        assert f"stopping ({signal.Signals(sig).name})" in log.read_text(errors="replace")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def _main_thread_in(function: str, file: str) -> bool:
    """Whether the main thread is inside ``function`` of a file named ``file`` (a frame on its stack)."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)
    while frame is not None:
        if frame.f_code.co_name == function and frame.f_code.co_filename.endswith(file):
            return True
        frame = frame.f_back
    return False


def _interrupted_while_the_eval_set_is_read(tmp: str) -> tuple[int, list[bool]]:
    """In a fresh process: a local run (real tasks) whose eval set is still being read when the workers are done,
    and whose launcher gets SIGINT on the reading thread while its main thread waits for the read (which then
    hangs, as a read from a store that stopped answering does)."""
    from psflow.cli.main import main
    from psflow.launch import eval_set

    load_eval = eval_set.load_eval
    hung_to_the_end: list[bool] = []

    def signalled_then_hung(config: Any) -> Any:
        wait_until(lambda: _main_thread_in("result", "eval_set.py"), "the launcher waiting for the eval set",
                   limit=LIMIT)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)
        deadline = time.monotonic() + LIMIT  # a read that hangs; the signal must end the run before it ends
        while time.monotonic() < deadline:
            time.sleep(0.01)
        hung_to_the_end.append(True)
        return load_eval(config)

    eval_set.load_eval = signalled_then_hung  # type: ignore[assignment]
    code = main(["train", "--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--ps", "1",
                 "--workers", "1", "--batch-size", "128", "--max-steps", "20", "--output", f"{tmp}/run", "--quiet",
                 "--no-status"])
    return code, hung_to_the_end


def test_a_launcher_waiting_for_its_eval_set_stops_on_a_signal_handed_to_the_reading_thread(tmp_path: Path) -> None:
    """The local launcher reads the eval set on a thread of its own while the tasks train (EvalSet) and waits for
    it once they are done: a signal handed to that thread ended the run only once the read did."""
    code, hung_to_the_end = in_fresh_process(_interrupted_while_the_eval_set_is_read, str(tmp_path),
                                             limit=LIMIT + 120)
    assert code == 130 and not hung_to_the_end
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["phase"] == "interrupted", metrics


def _interrupted_while_waiting_for_a_batch(tmp: str) -> tuple[int, bool]:
    """In a fresh process: an in-process run whose reader process hangs before its 6th batch (a read from a store
    that stopped answering), and whose main thread, waiting for that batch, gets SIGINT by way of another thread.
    Returns the exit status and whether the reader's hang had ended when the run did."""
    from psflow.cli.main import main
    from psflow.data import reader_process

    layout = reader_process._layout
    seen: list[int] = []
    hung, ended = Path(tmp) / "reader-hung", Path(tmp) / "reader-hang-ended"

    def hangs_at_the_sixth(*args: Any) -> Any:  # runs in the reader process
        seen.append(1)
        if len(seen) == 6:
            hung.touch()
            deadline = time.monotonic() + LIMIT
            while time.monotonic() < deadline:
                time.sleep(0.01)
            ended.touch()
        return layout(*args)

    def signal_the_run() -> None:
        wait_until(lambda: hung.exists() and _main_thread_in("get", "reader_process.py"),
                   "the run waiting for a batch the reader hangs on", limit=LIMIT)
        signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    reader_process._layout = hangs_at_the_sixth  # type: ignore[assignment]
    threading.Thread(target=signal_the_run, name="signaller", daemon=True).start()
    code = main(["train", "--train", str(A9A), "--num-features", "124", "--in-process", "--batch-size", "128",
                 "--epochs", "1", "--output", f"{tmp}/run", "--quiet", "--no-status"])
    return code, ended.exists()


def test_an_in_process_run_waiting_for_a_batch_stops_on_a_signal_handed_to_another_thread(tmp_path: Path) -> None:
    """``psflow train --in-process`` waits in its main thread for the reader process's next batch: a signal handed
    to another thread ended the run only once the batch came (from a store that stopped answering: never)."""
    code, hang_ended = in_fresh_process(_interrupted_while_waiting_for_a_batch, str(tmp_path), limit=LIMIT + 120)
    assert code == 130 and not hang_ended
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["phase"] == "interrupted", metrics
