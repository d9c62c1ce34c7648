"""A signal that reaches ``psflow train`` after its finished run's end was written does not make the run a failure:
the launcher exits 0 (the finished run's own status), says the signal came after the end, and prints the run's
summary; metrics.json stays ``finished`` and no task outlives the launcher. After a failed run's end, the exit status
is the failure's (1), its error in the report.

Before, such a SIGTERM made the launcher exit 143 (128 + signum) although metrics.json said ``finished``, so a
script or scheduler reading the exit status took a finished run for an interrupted one; or, where it landed while the
launcher shut its tasks down, it was swallowed without a word. Real ``psflow train`` runs on a9a; the launcher sends
itself the SIGTERM (by pid, a real signal) at the point the case names (``late_signal/sitecustomize.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support import A9A, REPO, run_bounded, wait_until

from psflow.checkpoint.holder import holder_alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

HOOK = Path(__file__).parent / "late_signal"


def _tasks_of(out: Path) -> list[int]:
    """The pids of live task processes of the run in ``out`` (their command line names its config.json)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if "psflow.launch.task" in argv and str(out) in argv and state not in ("Z", "X"):
                pids.append(int(entry))
    return pids


def _train(out: Path, point: str, *extra: str, phase: str = "finished", quiet: bool = True,
           metrics_unwritable: bool = False) -> subprocess.CompletedProcess[str]:
    """``psflow train`` (1 ps, 1 worker, 20 steps) signalled at ``point`` of the ``phase`` end; every task gone.
    ``metrics_unwritable``: its metrics.json cannot be written (a full disk)."""
    env = dict(os.environ, PSFLOW_TEST_LATE_SIGNAL=point, PSFLOW_TEST_LATE_SIGNAL_PHASE=phase,
               PSFLOW_TEST_METRICS_UNWRITABLE="1" if metrics_unwritable else "0",
               # the repository first: the hook imports psflow before ``-m`` puts the working directory on the path
               PYTHONPATH=os.pathsep.join([str(REPO), str(HOOK), *filter(None, [os.environ.get("PYTHONPATH")])]))
    try:
        r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124",
                         "--ps", "1", "--workers", "1", "--batch-size", "128", "--max-steps", "20",
                         "--output", str(out), *(["--quiet"] if quiet else []), *extra], timeout=250, env=env, cwd=REPO)
        wait_until(lambda: not _tasks_of(out), f"every task of {out} gone", 60.0)
    finally:
        for pid in _tasks_of(out):
            os.kill(pid, signal.SIGKILL)
    return r


@pytest.mark.parametrize("point", ["while_written", "after_written", "in_shutdown"])
def test_a_sigterm_after_a_finished_run_s_end_exits_0_and_says_so(tmp_path: Path, point: str) -> None:
    out = tmp_path / "run"
    r = _train(out, point)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "finished" and "interrupted" not in metrics, metrics
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert (f"psflow train: SIGTERM arrived after the run had finished at global_step {metrics['global_step']}: "
            "its end stands") in r.stderr, r.stderr[-3000:]
    assert "interrupted by" not in r.stderr, r.stderr[-3000:]
    summary = json.loads(r.stdout)  # the run's summary, as after any finished run
    assert summary["global_step"] == metrics["global_step"] and summary["examples"] == metrics["examples"]


@pytest.mark.parametrize("point", ["while_written", "after_written", "in_process_written"])
def test_a_sigterm_after_a_finished_run_s_end_leaves_its_last_line(tmp_path: Path, point: str) -> None:
    """Without ``--quiet`` a finished run's last line (``psflow: done: global_step N | ...``) follows its end; a SIGTERM
    as the end was written, or just after, left it out (the bar closed without it), in a cluster run and in an
    ``--in-process`` one, whose launcher prints it after the run returns."""
    out = tmp_path / "run"
    r = _train(out, point, *(["--in-process"] if point == "in_process_written" else []), quiet=False)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "finished" and r.returncode == 0, (r.returncode, r.stderr[-3000:])
    done = [line for line in r.stderr.splitlines() if line.startswith("psflow: done: ")]
    assert len(done) == 1 and done[0].startswith(f"psflow: done: global_step {metrics['global_step']} |"), \
        r.stderr[-3000:]
    assert r.stderr.index("psflow: done: ") < r.stderr.index("SIGTERM arrived after the run had finished"), \
        r.stderr[-3000:]


def test_a_sigterm_as_a_failed_run_s_end_is_written_exits_with_the_failure_s_status(tmp_path: Path) -> None:
    """The chief exits at its first checkpoint save (``--fault-point shards_written``): the run fails, and the
    SIGTERM lands as its end is written. The launcher exited 143 for a run whose metrics.json says failed, exit 1."""
    out = tmp_path / "run"
    r = _train(out, "while_written", "--checkpoint-dir", str(tmp_path / "ckpt"), "--save-checkpoints-steps", "5",
               "--fault-point", "shards_written", phase="failed")
    metrics = json.loads((out / "metrics.json").read_text())
    assert (metrics["phase"], metrics["exit_code"]) == ("failed", 1), metrics
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    assert (f"psflow train: SIGTERM arrived after the run had failed at global_step {metrics['global_step']}: "
            "its end stands") in r.stderr, r.stderr[-3000:]
    assert "/job:worker/task:0" in r.stderr.split("arrived after the run had failed", 1)[1], r.stderr[-3000:]
    assert r.stdout == "", r.stdout  # no summary: the run failed


@pytest.mark.parametrize("in_process", [False, True], ids=["cluster", "in_process"])
def test_a_sigterm_after_the_handlers_were_put_back_keeps_the_end_s_status(tmp_path: Path, in_process: bool) -> None:
    """The launcher puts its signal handlers back once the run is over (``LocalCluster.__exit__``, ``--in-process``'s
    end); a SIGTERM from there to the process's exit (a supervisor's at the end of a job) killed it with 143 (the
    default action) although metrics.json said finished: a script reading the exit status read a failed run."""
    out = tmp_path / "run"
    r = _train(out, "after_restore", *(["--in-process"] if in_process else []))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "finished", metrics
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert (f"psflow: SIGTERM arrived after the run had finished at global_step {metrics['global_step']}: "
            "its end stands") in r.stderr, r.stderr[-3000:]
    assert json.loads(r.stdout)["global_step"] == metrics["global_step"]  # the summary, whole


@pytest.mark.parametrize("point", ["while_written", "in_process_written"])
def test_a_sigterm_as_a_finished_end_s_metrics_json_fails_prints_the_run_s_result(tmp_path: Path, point: str) -> None:
    """A finished run whose metrics.json cannot be written (a full disk) failed: exit status 1, its error said; a
    SIGTERM as its end was written changes none of that, and the run's last line and summary are printed as without
    the signal (``EndNotWritten``). ``--in-process`` printed neither, the cluster path no summary."""
    out = tmp_path / "run"
    r = _train(out, point, *(["--in-process"] if point == "in_process_written" else []), quiet=False,
               metrics_unwritable=True)
    assert not (out / "metrics.json").exists()
    assert r.returncode == 1, (r.returncode, r.stderr[-3000:])
    done = [line for line in r.stderr.splitlines() if line.startswith("psflow: done: global_step 20 |")]
    assert len(done) == 1, r.stderr[-3000:]
    assert "SIGTERM arrived after the run had finished at global_step 20: its end was not written whole" \
        in r.stderr, r.stderr[-3000:]
    assert f"could not write {out}/metrics.json: [Errno 28] No space left on device" in r.stderr, r.stderr[-3000:]
    assert json.loads(r.stdout)["global_step"] == 20  # training's own result


def test_a_stop_at_once_before_the_summary_says_what_it_left_and_the_next_run_takes_the_directory(
        tmp_path: Path) -> None:
    """Two SIGTERMs once the launcher's handlers were put back (the end's held to the exit): the second stops the
    process at once with the end's status, before the run's summary is printed and its run lock released. The line
    says both (the summary's figures are in metrics.json, written whole before); run.lock is a file naming the dead
    process (not an flock), and the next ``psflow train`` in the same directory takes it over (refused or waited for
    by no one). Before, the line said neither: the summary missing from stdout without a word."""
    out = tmp_path / "run"
    r = _train(out, "after_restore_twice", "--checkpoint-dir", str(tmp_path / "ckpt"))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "finished" and metrics["global_step"] == 20, metrics
    assert r.returncode == 0 and r.stdout == "", (r.returncode, r.stdout, r.stderr[-3000:])
    last = r.stderr.splitlines()[-1]
    assert last.startswith("psflow: SIGTERM: the launcher stops now, exit status 0; not done: "), r.stderr[-3000:]
    assert f"the run's summary (its figures are in {out}/metrics.json)" in last, last
    for path in (out / "run.lock", tmp_path / "ckpt" / "checkpoint.lock"):
        assert f"{path} is left (a run there from this host takes it over, its process gone; from another host, delete it)" in last, last
        assert holder_alive(json.loads(path.read_text())) is False, path  # left, naming the launcher stopped
    run = json.loads((out / "run.lock").read_text())["run_id"]
    assert json.loads((tmp_path / "ckpt" / "checkpoint.lock").read_text())["run_id"] == run
    again = _train(out, "none", "--checkpoint-dir", str(tmp_path / "ckpt"), "--max-steps", "40")  # taken over
    assert again.returncode == 0, (again.returncode, again.stderr[-3000:])
    assert json.loads(again.stdout)["global_step"] == 40  # (resumed from the first run's final checkpoint)
    assert f"run directory {out}: taking over the stale lock of run {run}" in again.stderr, again.stderr[-3000:]
    assert not (out / "run.lock").exists() and not (tmp_path / "ckpt" / "checkpoint.lock").exists()


def test_a_sigterm_as_the_launcher_s_interpreter_finalizes_leaves_the_exit_status_0(tmp_path: Path) -> None:
    """Python puts the default action back in place of its handlers as it finalizes (after the exit functions, before
    the modules are cleared): a SIGTERM from there killed the launcher with 143 after a finished run had printed its
    summary (seen on a real run SIGTERMed as it exited). Now ignored there: the exit status is the run's."""
    out = tmp_path / "run"
    r = _train(out, "as_it_exits")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["phase"] == "finished", metrics
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert json.loads(r.stdout)["global_step"] == metrics["global_step"]
