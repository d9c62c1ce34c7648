"""Checkpoints that cannot be silently lost (issue 17, items 5 and 6), with real ``psflow train`` runs:
two runs sharing a --checkpoint-dir, a dead run's stale lock, a checkpoint of another model or seed,
a full disk and a directory made read-only mid-run.

Every run is started in a session of its own and ended here by pid (the launcher and, from their logs,
its tasks), whatever happens. benchmarks/drill_recovery.py (``--storage-drills``) reuses the helpers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import A9A, REPO, run_cli

from psflow.checkpoint.lock import LOCK_NAME
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.variables import read_variables

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

COMMON = ("--train", str(A9A), "--num-features", "124", "--ps", "2", "--workers", "2", "--quiet")


def task_pids(out: Path) -> list[int]:
    """Pids of the task processes of the run in ``out``, from their logs."""
    pids = []
    for log in (out / "logs").glob("*.log"):
        pids += [int(p) for p in re.findall(r"serving at \S+ \(pid (\d+)\)", log.read_text(errors="replace"))]
    return pids


def kill_task(pid: int) -> None:
    """SIGKILLs ``pid`` if it is still a psflow task (never a reused pid of another program)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    if b"psflow.launch.task" in cmdline:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def background_run(out: Path, *args: str) -> Iterator[subprocess.Popen[str]]:
    """``psflow train`` in the background; on exit the launcher and every task of it are SIGKILLed by pid."""
    proc = subprocess.Popen([sys.executable, "-m", "psflow", "train", *COMMON, "--output", str(out), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(REPO),
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
        for pid in task_pids(out):
            kill_task(pid)


def wait_for(what: str, ready: Any, proc: subprocess.Popen[str], timeout: float = 150.0) -> None:
    """Polls ``ready()`` until true (a safety net of ``timeout`` s, not a timed assertion)."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.02)


def all_listed_readable(ckpt: Path) -> list[str]:
    """Every checkpoint the pointer lists restores (sha256-checked); returns their names."""
    names = json.loads((ckpt / "checkpoint").read_text())["all"]
    for name in names:
        read_variables(str(ckpt / name), slots=True)
    assert latest_checkpoint(str(ckpt)) == str(ckpt / names[-1])
    return list(names)


def no_partial_directories(ckpt: Path) -> None:
    partial = [p.name for p in ckpt.glob("ckpt-*") if not (p / "manifest.json").exists()]
    assert not partial, f"partial checkpoint directories left: {partial}"


def test_two_runs_started_together_one_is_refused_and_another_model_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    results: dict[int, subprocess.CompletedProcess[str]] = {}

    def run(seed: int) -> None:
        results[seed] = run_cli("train", *COMMON, "--epochs", "2", "--checkpoint-dir", str(ckpt),
                                "--save-checkpoints-steps", "20", "--seed", str(seed), "--output", str(tmp_path / f"r{seed}"))

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=250)
    assert sorted(r.returncode for r in results.values()) == [0, 1], {s: r.stderr[-2000:] for s, r in results.items()}
    (winner,) = [s for s, r in results.items() if r.returncode == 0]
    (loser,) = [s for s, r in results.items() if r.returncode == 1]
    refusal = results[loser].stderr
    assert "Traceback" not in refusal and "FileExistsError" not in refusal, refusal[-3000:]
    assert re.search(rf"checkpoint directory \S*ckpt is in use by run \S+ \(pid \d+ on .*run directory \S*r{winner}\)",
                     refusal), refusal[-3000:]
    assert not (tmp_path / f"r{loser}" / "logs").exists()  # refused before any task started
    all_listed_readable(ckpt)
    assert {read_manifest(str(p)).model["config"]["seed"] for p in ckpt.glob("ckpt-*")} == {winner}  # type: ignore[index]
    assert not (ckpt / LOCK_NAME).exists()  # released when the run ended
    # A run of another model (or data settings) is refused plainly, before it starts anything.
    r = run_cli("train", *COMMON, "--epochs", "1", "--checkpoint-dir", str(ckpt), "--model", "fm",
                "--output", str(tmp_path / "fm"))
    assert r.returncode == 1, r.stderr[-3000:]
    assert re.search(r"checkpoint \S+ was written with another model: --model 'logistic' \(this run: 'fm'\)", r.stderr)
    assert "Traceback" not in r.stderr and not (tmp_path / "fm" / "logs").exists()


def test_a_live_runs_directory_is_refused_then_its_stale_lock_taken_over_and_its_lineage_continued(tmp_path: Path) -> None:
    """The issue's repro: a second run 0.3 s (or any time) after the first, with another seed."""
    ckpt = tmp_path / "ckpt"
    first_out = tmp_path / "first"
    with background_run(first_out, "--epochs", "500", "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "20",
                         "--seed", "1") as first:
        wait_for("first checkpoint", lambda: latest_checkpoint(str(ckpt)) is not None, first)
        holder = json.loads((ckpt / LOCK_NAME).read_text())
        assert holder["pid"] == first.pid  # the launcher holds it for the run
        r = run_cli("train", *COMMON, "--epochs", "1", "--checkpoint-dir", str(ckpt), "--seed", "2",
                    "--output", str(tmp_path / "second"))
        assert r.returncode == 1, r.stderr[-3000:]
        assert f"is in use by run {holder['run_id']} (pid {first.pid} on {holder['host']}" in r.stderr, r.stderr[-3000:]
        assert first.poll() is None  # the first run was never disturbed
        # The first run dies at once, every process of it (SIGKILL): its lock is left behind, stale.
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        for pid in task_pids(first_out):
            kill_task(pid)
    # Read once nothing writes: while the first run lived, its saves and rotation moved the pointer under us.
    before = all_listed_readable(ckpt)
    assert json.loads((ckpt / LOCK_NAME).read_text())["run_id"] == holder["run_id"]
    assert set(before) <= {p.name for p in ckpt.glob("ckpt-*")}  # nothing of the first run's deleted by the refused one
    resumed_from = latest_checkpoint(str(ckpt))
    assert resumed_from is not None
    resumed = read_manifest(resumed_from)  # read now: the next run's rotation may delete the directory
    step = resumed.global_step
    # A later run takes the dead run's lock over (saying so), restores its checkpoint with a plain warning about
    # the other seed, and continues its lineage: its rotation may delete the first run's older checkpoints.
    r = run_cli("train", *COMMON, "--epochs", "1", "--checkpoint-dir", str(ckpt), "--seed", "2",
                "--save-checkpoints-steps", "20", "--output", str(tmp_path / "third"))
    assert r.returncode == 0, r.stderr[-3000:]
    # The lock names the run's last process to vouch for it: the launcher, or its chief if that re-vouched after
    # the launcher died and before the lifeline ended it.
    assert f"taking over the stale lock of run {holder['run_id']} (pid " in r.stderr, r.stderr[-3000:]
    assert re.search(r"warning: checkpoint \S+ was written by a run with --seed 1; this run has --seed 2: resuming it",
                     r.stderr), r.stderr[-3000:]
    assert f"restored checkpoint {resumed_from} at step {step}" in (tmp_path / "third" / "logs" / "worker-0.log").read_text()
    names = all_listed_readable(ckpt)
    assert {read_manifest(str(ckpt / n)).lineage for n in names} == {resumed.lineage}
    no_partial_directories(ckpt)
    assert not (ckpt / LOCK_NAME).exists()


def test_a_lock_the_chief_takes_again_after_it_was_deleted_is_gone_after_a_clean_exit(tmp_path: Path) -> None:
    """Someone deletes checkpoint.lock mid-run, once every worker has joined: the chief takes it again at its next
    save and, the run over, removes it, also when its final save comes after it released it (issue 30, item 5: the
    final save took it again, and it was left behind naming the chief's dead pid)."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "run"
    worker_1_log = out / "logs" / "worker-1.log"
    with background_run(out, "--epochs", "5", "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "30",
                        "--log-every", "1") as run:
        # Worker 1 logs a step only after it joined (and confirmed the lock, as a candidate for chief).
        wait_for("worker 1's first step", lambda: worker_1_log.exists() and "step=" in worker_1_log.read_text(), run)
        (ckpt / LOCK_NAME).unlink()  # the launcher's lock; the run (5 epochs, 320 steps) is far from its end
        _, stderr = run.communicate(timeout=250)
    assert run.returncode == 0, stderr[-3000:]
    step = json.loads((out / "metrics.json").read_text())["global_step"]
    assert step % 30 != 0  # so the last checkpoint is the final save's, not a periodic one marked final
    assert latest_checkpoint(str(ckpt)) == str(ckpt / f"ckpt-{step:09d}")
    assert not (ckpt / LOCK_NAME).exists(), (ckpt / LOCK_NAME).read_text()


@contextlib.contextmanager
def small_tmpfs(path: Path, size_kib: int, fill_kib: int) -> Iterator[None]:
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (the read-only test covers this without)")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path)], capture_output=True,
                       text=True, timeout=30)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        (path / "filler").write_bytes(b"\0" * (fill_kib * 1024))
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)


def test_a_full_disk_fails_the_run_loudly_and_leaves_no_partial_checkpoint(tmp_path: Path) -> None:
    """The issue's repro: a nearly full 200 KiB tmpfs as --checkpoint-dir, 2 epochs, a checkpoint every 20 steps."""
    ckpt = tmp_path / "ckpt"
    with small_tmpfs(ckpt, 200, 150):
        r = run_cli("train", *COMMON, "--epochs", "2", "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "20",
                    "--output", str(tmp_path / "run"))
        assert r.returncode == 1, r.stderr[-3000:]
        failed = re.findall(r"psflow: checkpoint at global_step \d+ FAILED \(/job:worker/task:\d\): .*No space left "
                            r"on device", r.stderr)
        assert len(failed) >= 3, r.stderr[-3000:]  # one console line per failed save, at the launcher
        assert re.search(r"3 checkpoint saves in a row into \S+ failed \(--max-failed-saves 3\): stopping", r.stderr)
        no_partial_directories(ckpt)
        all_listed_readable(ckpt)


@contextlib.contextmanager
def read_only(path: Path, *, on_busy: Any = None) -> Iterator[None]:
    """Makes ``path`` read-only: a read-only bind mount as root (root ignores modes), else mode 0555.

    ``on_busy``: called before each retry of a remount refused as busy (a file open for writing there)."""
    if os.geteuid() == 0:
        r = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            pytest.skip(f"cannot bind-mount here: {r.stderr.strip()}")
        try:
            # EBUSY ("mount point is busy") while a save holds a file open for writing: that save ends
            # in well under a second, so retry for a while before calling this machine unable.
            deadline = time.monotonic() + 30
            while True:
                r = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True, text=True,
                                   timeout=30)
                if r.returncode == 0 or "busy" not in r.stderr or time.monotonic() > deadline:
                    break
                if on_busy is not None:
                    on_busy()
                time.sleep(0.05)
            if r.returncode != 0:
                pytest.skip(f"cannot remount read-only here: {r.stderr.strip()}")
            yield
        finally:
            subprocess.run(["umount", "-l", str(path)], capture_output=True, timeout=30)
    else:
        path.chmod(0o555)
        try:
            yield
        finally:
            path.chmod(0o755)


def worker_pids(out: Path) -> list[int]:
    """Pids of the run's worker processes, from their logs (one each; none restarted in these runs)."""
    pids = []
    for log in sorted((out / "logs").glob("worker-*.log")):
        pids += [int(p) for p in re.findall(r"serving at \S+ \(pid (\d+)\)", log.read_text(errors="replace"))]
    return pids


def held(pid: int) -> bool:
    """Whether ``pid`` is stopped (SIGSTOP: state T in /proc/PID/stat)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def test_a_directory_made_read_only_mid_run_is_reported_and_counted(tmp_path: Path) -> None:
    """With --max-failed-saves 0 the run goes on (each failure still a console line) and metrics.json counts them.

    The directory is made read-only while both workers are held (``--chaos stop`` at step 120 of ~1,018), so
    the remount lands mid-run however slow the machine: a run that ended before it (its training is about a
    second once the initial checkpoint is there) saved every checkpoint and failed this test under load. A
    remount refused as busy (the chief held at a save, a file open) lets one worker run a moment at a time:
    the run cannot end while the other is held (a worker that finished waits for the others)."""
    ckpt, out = tmp_path / "ckpt", tmp_path / "run"
    ckpt.mkdir()
    with background_run(out, "--epochs", "1", "--batch-size", "32", "--checkpoint-dir", str(ckpt),
                         "--save-checkpoints-steps", "50", "--max-failed-saves", "0", "--liveness-timeout", "0",
                         "--chaos", "stop:worker:0@step=120", "--chaos", "stop:worker:1@step=120") as run:
        wait_for("both workers held", lambda: len(worker_pids(out)) == 2 and all(map(held, worker_pids(out))), run)
        workers = worker_pids(out)
        turn = iter(range(1_000_000))

        def let_one_run() -> None:
            pid = workers[next(turn) % 2]
            os.kill(pid, signal.SIGCONT)
            time.sleep(0.02)
            os.kill(pid, signal.SIGSTOP)

        try:
            with read_only(ckpt, on_busy=let_one_run):
                for pid in workers:
                    os.kill(pid, signal.SIGCONT)
                stdout, stderr = run.communicate(timeout=250)
        finally:
            for pid in workers:  # a skip or failure before the resume: never leave them stopped
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        assert run.returncode == 0, stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["checkpoints_failed"] >= 1 and metrics["checkpoints_saved"] >= 1, metrics
    assert re.search(r"psflow: checkpoint at global_step \d+ FAILED .*(Read-only file system|Permission denied)", stderr)
    assert "--max-failed-saves 0: the run goes on without checkpoints" in stderr
    # A save the remount caught midway (shards written, then its manifest refused) leaves its directory:
    # on a read-only file system it cannot be removed either. It must never be listed or restored.
    partial = [p.name for p in ckpt.glob("ckpt-*") if not (p / "manifest.json").exists()]
    assert len(partial) <= 1, partial
    newest = latest_checkpoint(str(ckpt))
    assert newest is not None and os.path.basename(newest) not in partial
    all_listed_readable(ckpt)
    shutil.rmtree(ckpt)
