"""A sync run whose chief's checkpoint save outlasts --sync-timeout, and the waiting workers' own push deadline
(--rpc-timeout + --sync-timeout), because the object store stops answering for a while: the run goes on and
finishes. Real ``psflow train`` processes, a real GCS emulator
(tests/object_store_servers.py) stopped with SIGSTOP during a save and resumed with SIGCONT, so the save lasts
as long as the test holds it, whatever the machine's speed.

Before psflow.ps.save_hold the other worker's gradient for the next step waited for the chief's only
``--sync-timeout`` seconds, and the whole run failed with ``sync step 10 timed out ... missing:
/job:worker/task:0``, naming nothing of the save (seen with the emulator down for 20 s); a step held longer than
the other worker's push deadline failed that push, unless the ps answers it held and it is sent again.

The same with ``--mode ssp`` (the other worker runs --staleness steps ahead and waits for the saving chief's
clock: before, the chief was declared lost, 'made no progress', and the run failed; also the other worker,
waiting for the chief's initial checkpoint, was declared lost at the chief's first wait) and with
``--ps-replicas 1`` (before, no notice was sent to replicated shards: the step timed out).

And the store stopped for good: the save is given up once it outlasted --save-timeout (psflow.checkpoint.bounded_save),
and ``psflow train`` ends, naming the save in one line and the checkpoint lock it could not release (it waited for ever
on that release; in async mode, where nothing holds a step, on the chief stuck in its save). In async mode with the store
stopped for a while only: the chief gives its save up, trains on and finishes, its final checkpoint the newest.

And the chief killed mid-save with a short --sync-timeout: its step times out and every worker, the restarted ones
at once, ends on that timeout, each with one line (it was a full traceback, whose tail the failure report showed)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from object_store_servers import StoreServer
from support import A9A, wait_until

from psflow.checkpoint.pointer import latest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SYNC_TIMEOUT = 2.0
RPC_TIMEOUT = 4.0  # a waiting push's deadline: RPC_TIMEOUT + SYNC_TIMEOUT
MAX_STEPS = 200


def _ps_logs(out: Path) -> str:
    """Every ps task's log (ps-0, ps-1 and, with --ps-replicas, their backups)."""
    return "".join(p.read_text(errors="replace") for p in sorted((out / "logs").glob("ps*.log")))


def _save_under_way(ps_log: str) -> bool:
    """Whether the ps task heard of a periodic save (not the final one) that has not ended."""
    begun = re.findall(r"is saving a checkpoint into gs://\S+?(?: at global_step (\d+))?;", ps_log)
    ended = ps_log.count("saved a checkpoint into gs://")
    return len(begun) > ended and int(begun[-1] or 0) < MAX_STEPS


def _log(out: Path, name: str) -> str:
    path = out / "logs" / f"{name}.log"
    return path.read_text(errors="replace") if path.exists() else ""


# ``psflow train`` with its lock release bounded at RELEASE_BOUND s instead of
# psflow.checkpoint.lock_release.RELEASE_TIMEOUT (60 s, all of it waited on a stopped store: 60 of a case's ~77 s).
# Only the bound's length changes: the same release, on the same stopped store, given up the same way.
RELEASE_BOUND = 10.0
# Every ``psflow train`` here writes its Python stacks to its stderr on SIGUSR1 (psflow registers no handler for
# it): a run that does not end in time shows where it waited (:func:`_stacks_then_killed`).
_STACKS_ON_SIGUSR1 = "import faulthandler, signal; faulthandler.register(signal.SIGUSR1, all_threads=True); "
_PSFLOW = _STACKS_ON_SIGUSR1 + "import sys; from psflow.cli.main import main; sys.exit(main())"
_RELEASE_BOUNDED = (_STACKS_ON_SIGUSR1 + "import sys; import psflow.checkpoint.lock_release as r; "
                    "from psflow.cli.main import main; "
                    f"r.BoundedRelease.__init__.__kwdefaults__['timeout'] = {RELEASE_BOUND}; sys.exit(main())")


def _train(ckpt: str, out: Path, *flags: str, release_bounded: bool = False) -> subprocess.Popen[str]:
    """``psflow train`` on a9a, 2 workers of batch 32, MAX_STEPS steps, a save into ``ckpt`` every 10 steps, a log
    line every step, and ``flags`` (the mode, the ps tasks, the timeouts); ``release_bounded``: its lock's release
    given up after RELEASE_BOUND s."""
    return subprocess.Popen(
        [sys.executable, "-c", _RELEASE_BOUNDED if release_bounded else _PSFLOW,
         "train", "--train", str(A9A), "--num-features", "124", *flags,
         "--workers", "2", "--batch-size", "32", "--max-steps", str(MAX_STEPS), "--checkpoint-dir", ckpt,
         "--save-checkpoints-steps", "10", "--log-every", "1", "--output", str(out), "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stacks_then_killed(run: subprocess.Popen[str]) -> str:
    """``run``'s stderr, its Python stacks written at its end (SIGUSR1, given 10 s), after it was killed."""
    os.kill(run.pid, signal.SIGUSR1)
    with contextlib.suppress(subprocess.TimeoutExpired):
        run.communicate(timeout=10)  # (what it reads is kept for the next call)
    run.kill()
    return run.communicate()[1]


def _finished(run: subprocess.Popen[str], out: Path) -> dict[str, Any]:
    """Waits for ``run`` (the store answering again) and checks it succeeded; returns its metrics.json."""
    _, stderr = run.communicate(timeout=240)
    assert run.returncode == 0, stderr[-3000:]
    metrics: dict[str, Any] = json.loads((out / "metrics.json").read_text())
    return metrics


def _newest_is_final(ckpt: str, metrics: dict[str, Any]) -> str:
    """Checks that the newest checkpoint in ``ckpt`` is the run's final one (of its last global_step); returns it."""
    latest = latest_checkpoint(ckpt)
    assert latest is not None and latest.endswith(str(metrics["global_step"])), (latest, metrics)
    return latest


@contextlib.contextmanager
def _store_stopped(store: StoreServer, run: subprocess.Popen[str], out: Path) -> Iterator[Callable[[], None]]:
    """Stops ``store`` (SIGSTOP) once the chief trains (its session's start, which reads the store, is over), so
    its next periodic save waits for it, and yields the call that resumes it (SIGCONT). Not right after the
    initial checkpoint: the chief's session then still reads the store outside any save, and step 0 timed out,
    as it did before the notices. On exit, ``run`` is killed if it still runs, and the store resumed if it is
    still stopped."""
    stopped = False

    def resume() -> None:
        nonlocal stopped
        if stopped:
            os.kill(store.pid, signal.SIGCONT)
            stopped = False

    try:
        wait_until(lambda: re.search(r"worker 0: step=[1-9]", _log(out, "worker-0")) or run.poll() is not None,
                   "the chief's first steps")
        os.kill(store.pid, signal.SIGSTOP)
        stopped = True
        yield resume
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
        resume()


@pytest.mark.parametrize("mode,extra", [("sync", []), ("ssp", []), ("sync", ["--ps-replicas", "1"])],
                         ids=["sync", "ssp", "sync-replicated"])
def test_a_sync_run_outlives_a_chief_save_longer_than_its_sync_timeout(
        mode: str, extra: list[str], gcs_server: object, gcs_bucket: str, tmp_path: Path) -> None:
    assert isinstance(gcs_server, StoreServer)
    ckpt, out = f"{gcs_bucket}/ckpt", tmp_path / "run"
    run = _train(ckpt, out, "--mode", mode, *extra, "--ps", "2", "--sync-timeout", str(SYNC_TIMEOUT),
                 "--rpc-timeout", str(RPC_TIMEOUT))
    with _store_stopped(gcs_server, run, out) as resume:
        # A save under way, told to the ps tasks (on a ps task without notices the step times out instead, and
        # the run fails below, naming it).
        wait_until(lambda: _save_under_way(_ps_logs(out)) or "timed out" in _ps_logs(out)
                   or "made no progress" in _ps_logs(out) or run.poll() is not None,
                   "a periodic save of the chief begun, told to the ps tasks")
        # The fault's length: the save cannot end before the store answers again.
        time.sleep(2 * (RPC_TIMEOUT + SYNC_TIMEOUT))
        resume()
        metrics = _finished(run, out)
    # (ssp: each push is a step; the two workers may both take a step at the end: one more)
    steps = metrics["global_step"]
    assert (steps == MAX_STEPS or mode == "ssp" and steps == MAX_STEPS + 1) and metrics["phase"] == "finished", metrics
    # Each step's two pushes of 32 counted once, held and sent again or not (ssp: one push a step).
    assert metrics["examples"] == steps * (2 if mode == "sync" else 1) * 32, metrics
    ps_logs = _ps_logs(out)
    assert "timed out" not in ps_logs and "made no progress" not in ps_logs
    assert "/job:worker/task:0 saved a checkpoint into gs://" in ps_logs  # the end notice: the timeout runs again
    _newest_is_final(ckpt, metrics)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_save_past_its_save_timeout_ends_the_run_naming_the_save_and_the_lock_left_behind(
        mode: str, gcs_server: object, gcs_bucket: str, tmp_path: Path) -> None:
    """The store stops for good during a save: the save is given up once --save-timeout is over (a failed save;
    sync: or the step fails), the next ones as well, and ``psflow train`` then ends (it waited for ever to release
    the run lock on the stopped store; async: on the chief stuck in its save), non-zero, its error line the save's
    (not the failed worker's traceback), a line saying it waits to release the lock, and one line naming the lock it
    could not release and the URL."""
    assert isinstance(gcs_server, StoreServer)
    ckpt, out = f"{gcs_bucket}/ckpt", tmp_path / "run"
    sync = ["--sync-timeout", str(SYNC_TIMEOUT)] if mode == "sync" else []  # (refused with --mode async: d6dfe2f)
    run = _train(ckpt, out, "--mode", mode, "--ps", "1", *sync, "--rpc-timeout", str(RPC_TIMEOUT),
                 "--save-timeout", "5", release_bounded=True)
    with _store_stopped(gcs_server, run, out):  # for good: resumed once the run has ended
        try:
            _, stderr = run.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail("psflow train did not end within 180 s of the store stopping (--save-timeout 5); its stderr "
                        "ends with its Python stacks:\n" + _stacks_then_killed(run)[-12000:])
    assert run.returncode != 0
    lines = stderr.splitlines()
    # The root cause's one line: the save and the flag (it was the failed worker's traceback tail).
    error = next(i for i, line in enumerate(lines) if line.startswith("psflow train: error:"))
    assert "root cause" in lines[error] and "--save-timeout (5 s)" in lines[error + 1], stderr[-3000:]
    assert "Traceback" not in stderr and "last lines of its log" not in stderr, stderr[-3000:]
    assert any(f"could not release the lock {ckpt}/checkpoint.lock" in line
               and f"no answer within {RELEASE_BOUND:g} s" in line for line in lines), stderr[-3000:]
    # Told while it waited (NOTICE_AFTER s into the bound), not only once the bound was over.
    assert f"psflow: releasing the lock {ckpt}/checkpoint.lock: waiting up to {RELEASE_BOUND:g} s for the store..." \
        in lines, stderr[-3000:]


def test_an_async_chief_gives_up_a_save_past_its_save_timeout_and_trains_on(
        gcs_server: object, gcs_bucket: str, tmp_path: Path) -> None:
    """Async mode (nothing holds a step for a save): the store stops answering during the chief's periodic save.
    The chief gives the save up once --save-timeout is over, counts it as a failed save and trains on, while the
    store is still stopped (it waited in the save for ever: the other worker finished, and the launcher waited
    on the chief). Once the store answers again the abandoned save may end late; the run's final checkpoint is
    still the newest, the pointer names it, and metrics.json counts the failed save."""
    assert isinstance(gcs_server, StoreServer)
    ckpt, out = f"{gcs_bucket}/ckpt", tmp_path / "run"
    run = _train(ckpt, out, "--mode", "async", "--ps", "1", "--save-timeout", "5", "--max-failed-saves", "20")
    with _store_stopped(gcs_server, run, out) as resume:
        # While the store is still stopped: the save is given up and counted, and the chief trains on.
        wait_until(lambda: "FAILED" in _log(out, "worker-0") or run.poll() is not None,
                   "the chief's save given up after --save-timeout, the store still stopped")
        assert "--save-timeout (5 s)" in _log(out, "worker-0"), _log(out, "worker-0")[-3000:]
        resume()
        metrics = _finished(run, out)
    assert metrics["phase"] == "finished" and metrics["checkpoints_failed"] >= 1, metrics
    latest = _newest_is_final(ckpt, metrics)
    assert metrics["checkpoints"]["last_saved_path"] == latest, metrics["checkpoints"]  # the last truly written


def test_a_failed_runs_end_does_not_wait_for_a_stopped_store(gcs_server: object, gcs_bucket: str) -> None:
    """A run's end reads its directory's newest checkpoint where the launcher's ledger names no save (none made yet,
    or no reading of the ledger came back: the launcher's channel backing off its reconnects on a loaded machine).
    With the store stopped for good that read never ended, so ``psflow train`` waited for ever after every task of
    its failed run had ended (one way the test above can hang with the launcher alive). Now the read is given up
    after NEWEST_READ_TIMEOUT s and the snapshot names no newest checkpoint."""
    from psflow.status.final_snapshot import newest_if_unnamed

    assert isinstance(gcs_server, StoreServer)
    ckpt = f"{gcs_bucket}/ckpt"
    got: list[object] = []
    ended = threading.Event()

    def read() -> None:
        got.append(newest_if_unnamed({"saved": 0, "failed": 3, "last_saved_path": None}, ckpt))
        ended.set()

    os.kill(gcs_server.pid, signal.SIGSTOP)
    try:
        threading.Thread(target=read, name="test-newest-read", daemon=True).start()
        # NEWEST_READ_TIMEOUT (15 s) and a generous margin for a loaded machine; the old code never ended.
        assert ended.wait(75.0), f"the run's end still reading {ckpt} from the stopped store after 75 s"
    finally:
        os.kill(gcs_server.pid, signal.SIGCONT)
    assert got == [None]


def _task_pid(out: Path, job: str, index: int) -> int | None:
    """The pid of the run's live ``/job:JOB/task:INDEX`` process (its command line names the run's cluster file)."""
    marker = [str(out / "cluster.json"), "--job", job, "--task", str(index)]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                args = open(f"/proc/{entry}/cmdline", "rb").read().decode(errors="replace").split("\0")
            except OSError:
                continue
            if any(args[i:i + len(marker)] == marker for i in range(len(args))):
                return int(entry)
    return None


def test_a_chief_killed_mid_save_fails_each_worker_in_one_line(
        gcs_server: object, gcs_bucket: str, tmp_path: Path) -> None:
    """Sync mode, a short --sync-timeout: the chief is killed while its save waits for the stopped store, so the
    step it was missing from times out, and every later push fails with that timeout (the step's failure stays until
    a restore). Each worker's exit, the restarted ones' too, said so with a full Python traceback; now one line naming
    the task, the step and what timed out, and the run still fails (exit status non-zero)."""
    assert isinstance(gcs_server, StoreServer)
    ckpt, out = f"{gcs_bucket}/ckpt", tmp_path / "run"
    run = _train(ckpt, out, "--mode", "sync", "--ps", "1", "--sync-timeout", str(SYNC_TIMEOUT),
                 "--rpc-timeout", str(RPC_TIMEOUT), "--restart-policy", "on-failure", "--max-restarts", "1")
    with _store_stopped(gcs_server, run, out) as resume:
        wait_until(lambda: _save_under_way(_ps_logs(out)) or run.poll() is not None,
                   "a periodic save of the chief begun, told to the ps task")
        chief = _task_pid(out, "worker", 0)
        assert chief is not None, "no live /job:worker/task:0 process"
        os.kill(chief, signal.SIGKILL)
        wait_until(lambda: "timed out" in _ps_logs(out) or run.poll() is not None, "the chief's step timed out")
        resume()
        try:
            _, stderr = run.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            pytest.fail("psflow train did not end within 180 s of the chief's kill; its stderr ends with its "
                        "Python stacks:\n" + _stacks_then_killed(run)[-12000:])
    assert run.returncode != 0, stderr[-3000:]
    # The launcher's report: the root cause's one line (it showed the tail of that worker's traceback).
    assert "Traceback" not in stderr and "last lines of its log" not in stderr and 'File "' not in stderr, \
        stderr[-6000:]
    lines = stderr.splitlines()
    cause = next(i for i, line in enumerate(lines) if line.startswith("psflow train: error:"))
    assert "root cause" in lines[cause] and re.match(
        rf"  /job:ps/task:0: PushPull: sync step \d+ timed out after {SYNC_TIMEOUT} s with 1 of 2 gradients; "
        r"missing: /job:worker/task:0", lines[cause + 1]), stderr[-3000:]
    # Each worker's exit on it is one ERROR line in its log, naming the worker, the step and what timed out.
    for name in ("worker-0", "worker-1"):
        text = _log(out, name)
        assert "Traceback" not in text, f"{name}.log:\n{text[-6000:]}"
    assert re.search(rf"ERROR .*/job:worker/task:1: /job:ps/task:0: PushPull: sync step \d+ timed out after "
                     rf"{SYNC_TIMEOUT} s", _log(out, "worker-1")), _log(out, "worker-1")[-3000:]
