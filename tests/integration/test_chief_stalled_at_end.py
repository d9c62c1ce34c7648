"""A chief stalled (SIGSTOP) past ``--lease-ttl`` under ``psflow server`` while a finished worker lingers: that
worker takes the chief duties over, writes the final checkpoint and evaluates the final model; the chief, resumed
(SIGCONT), must neither write a second checkpoint marked final nor evaluate again (:mod:`psflow.train.taken_over`).

Before: the resumed chief campaigned again, was elected (the take-over's worker had left), trained its data to the
end and wrote its own final checkpoint (in the reproduction ckpt-000000067 by worker 1, then ckpt-000003084 by
worker 0, both marked final, and ``eval step=67`` then ``eval step=3084``); an evaluator task had ended at the first.

The same for a chief stalled right after its last push (it runs no step once resumed: checked at its session's
end) and for one stalled in its final evaluation (its evaluation is not reported once the take-over's is recorded):
there worker 0 stops itself at that point (tests/integration/stall_chief on the processes' PYTHONPATH).

Real ``psflow server`` processes, as test_chief_lost_at_end starts them. Asserted on the log lines, the exit codes
and the checkpoints' manifests, never on time.
"""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import test_server_run_end
from support import A9A_T, wait_until
from test_chief_lost_at_end import _files, _start
from test_evaluator import _spawn
from test_server_run_end import _SAFETY, _channel, _cluster, _global_step, _Tasks

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.cluster import ClusterSpec
from psflow.train.summary import read_scalars

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

tasks = test_server_run_end.tasks  # the fixture: its psflow server processes are killed by pid after the test


def test_a_chief_stalled_past_the_lease_ttl_and_resumed_leaves_the_take_overs_final_checkpoint_alone(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path) -> None:
    """Worker 1 (300 lines: ~30 steps) finishes and lingers; worker 0, the chief (all of a9a, 3 epochs: ~3,000
    steps), is stopped once worker 1 waits for it, and resumed once worker 1 took the duties over and exited."""
    cluster = tasks(_cluster(1, 2))
    ckpt = _start(cluster, tmp_path, [None, 300])
    chief = cluster.procs["worker-0"]
    # An evaluator task beside them (TF_CONFIG, as a TFJob starts it): it ends at the run's final checkpoint.
    cluster.procs["evaluator-0"] = _spawn(
        "evaluator", 0, {job: list(cluster.cluster.job_tasks(job)) for job in ("ps", "worker")},
        ["--checkpoint-dir", str(ckpt), "--eval", str(A9A_T), "--num-features", "124", "--no-status",
         "--eval-poll-secs", "0.2"], tmp_path / "evaluator-0.log")
    wait_until(lambda: "finished its data" in cluster.log("worker-1"), "worker 1 finished its data", limit=_SAFETY)
    assert chief.poll() is None, cluster.log("worker-0")[-3000:]
    # Stopped outside the checkpoint directory's mutex: a chief stopped inside it is the next test's case.
    wait_until(lambda: _stop_outside_the_mutex(chief.pid), "worker 0 stopped outside a locked section", limit=_SAFETY)
    try:
        assert cluster.exit_code("worker-1") == 0, cluster.log("worker-1")[-3000:]
    finally:
        os.kill(chief.pid, signal.SIGCONT)
    took = re.search(r"worker 1: took the chief duties over from the workers still training \(/job:worker/task:0\)"
                     r".*at global_step (\d+)", cluster.log("worker-1"))
    assert took, cluster.log("worker-1")[-3000:]
    step = int(took.group(1))
    code = cluster.exit_code("worker-0")
    log = cluster.log("worker-0")
    assert code != 0, log[-3000:]  # it did not end its part of the run: the run ended without it
    assert "Traceback" not in log, log[-3000:]
    assert re.search(r"/job:worker/task:0: the run was ended without this worker: /job:worker/task:1 took the chief "
                     rf"duties over .*global_step {step}", log), log[-3000:]
    final = latest_checkpoint(str(ckpt))
    assert final is not None and read_manifest(final).final and read_manifest(final).global_step == step, final
    finals = [name for name in sorted(os.listdir(ckpt)) if name.startswith("ckpt-")
              and (ckpt / name / "manifest.json").exists() and read_manifest(str(ckpt / name)).final]
    assert finals == [os.path.basename(final)], finals
    newer = [name for name in os.listdir(ckpt) if name.startswith("ckpt-") and name > os.path.basename(final)]
    assert newer == [], newer  # not even a periodic one past the final
    evals = re.findall(r"eval step=(\d+)", cluster.log("worker-1") + log)
    assert evals == [str(step)], evals
    assert cluster.exit_code("evaluator-0") == 0, cluster.log("evaluator-0")[-3000:]
    evaluated = re.findall(r"evaluator: step=\d+ .*\((ckpt-[0-9-]+)(, final)?\)", cluster.log("evaluator-0"))
    assert evaluated and evaluated[-1][0] == os.path.basename(final), evaluated  # it ended at the run's final


def test_a_worker_restarted_after_the_run_ended_normally_trains_again(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path) -> None:
    """Both workers finish (no take-over: the run is over, worker 0 wrote the final checkpoint); ps task 0 keeps
    serving (``--keep-serving``) and worker 0 is started again with ``--epochs 2``. It trains its second epoch and
    writes the final checkpoint. Before, elected at its first step, it read worker 1's ``Done`` and the final
    checkpoint as a take-over's and stopped with 'the run was ended without this worker: /job:worker/task:1 took
    the chief duties over' (exit 1), when nobody had taken anything over."""
    cluster = tasks(_cluster(1, 2))
    ckpt = tmp_path / "ckpt"
    flags = [*_files(tmp_path, [600, 300]), "--num-features", "124", "--batch-size", "32", "--no-status",
             "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "50", "--eval", str(A9A_T),
             "--lease-ttl", "2"]
    cluster.start("ps", 0, "--checkpoint-dir", str(ckpt), "--keep-serving")
    for i in range(2):
        cluster.start("worker", i, *flags, "--epochs", "1")
    for i in range(2):
        assert cluster.exit_code(f"worker-{i}") == 0, cluster.log(f"worker-{i}")[-3000:]
    first = latest_checkpoint(str(ckpt))
    assert first is not None and read_manifest(first).final, first
    cluster.start("worker", 0, *flags, "--epochs", "2")
    log = cluster.log  # (read once it exited)
    assert cluster.exit_code("worker-0") == 0, log("worker-0")[-3000:]
    assert "the run was ended without this worker" not in log("worker-0"), log("worker-0")[-3000:]
    final = latest_checkpoint(str(ckpt))
    assert final is not None and read_manifest(final).final, final
    assert read_manifest(final).global_step > read_manifest(first).global_step, (first, final)


def test_a_chief_started_again_by_hand_after_a_take_over_pushes_no_step_past_the_final(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path) -> None:
    """Worker 0, the chief, killed once worker 1 finished, is started again by hand (same flags) once worker 1 took
    the duties over and exited: it stops with one line before its first step, and ps task 0's global_step stays
    at the final checkpoint's. Before, it campaigned only once it trained: it pushed a few batches (3 in a run
    here) past the run's final checkpoint on ps tasks that serve on, then was elected and stopped."""
    cluster = tasks(_cluster(1, 2))
    ckpt = _start(cluster, tmp_path, [None, 300])
    wait_until(lambda: "finished its data" in cluster.log("worker-1"), "worker 1 finished its data", limit=_SAFETY)
    flags = [str(a) for a in cluster.procs["worker-0"].args][10:]  # (after ... --job worker --task 0)
    os.kill(cluster.procs["worker-0"].pid, signal.SIGKILL)
    cluster.procs["worker-0"].wait(timeout=_SAFETY)
    assert cluster.exit_code("worker-1") == 0, cluster.log("worker-1")[-3000:]
    final = latest_checkpoint(str(ckpt))
    assert final is not None and read_manifest(final).final, final
    step = read_manifest(final).global_step
    cluster.start("worker", 0, *flags)
    code = cluster.exit_code("worker-0")
    log = cluster.log("worker-0")
    assert code != 0 and "Traceback" not in log, log[-3000:]
    assert re.search(r"/job:worker/task:0: the run was ended without this worker: /job:worker/task:1 took the chief "
                     rf"duties over .*global_step {step}; it trains no step", log), log[-3000:]
    ps0 = _channel(cluster, "ps", 0)
    try:
        assert _global_step(ps0) == step, log[-3000:]
    finally:
        ps0.close()
    assert latest_checkpoint(str(ckpt)) == final and "eval step=" not in log, log[-3000:]


def _stall(monkeypatch: pytest.MonkeyPatch, point: str) -> None:
    """The psflow server processes started next run tests/integration/stall_chief: worker 0 stops itself (SIGSTOP)
    at ``point``."""
    here = Path(__file__).parent / "stall_chief"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(here), *filter(None, [os.environ.get("PYTHONPATH")])]))
    monkeypatch.setenv("PSFLOW_TEST_STALL", point)


def _holds_flock(pid: int) -> bool:
    """Whether process ``pid`` holds a ``flock`` (/proc/locks; a waiter's line has ``->``): the checkpoint
    directory's mutex is the only one psflow takes."""
    return any(f[1] == "FLOCK" and f[4] == str(pid) for f in
               (line.split() for line in Path("/proc/locks").read_text().splitlines()) if len(f) > 4 and "->" not in f)


def _stop_outside_the_mutex(pid: int) -> bool:
    """Stops ``pid`` (SIGSTOP); resumes it at once, returning False, if it held a ``flock`` there."""
    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: _stopped(pid), f"pid {pid} stopped", limit=_SAFETY)
    if not _holds_flock(pid):
        return True
    os.kill(pid, signal.SIGCONT)
    return False


def _stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped (its state in /proc/PID/stat is T)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2] == "T"


def _taken_over_chief(cluster: _Tasks) -> tuple[int, str]:
    """Worker 1 took the chief duties over at global_step S and worker 0, resumed, failed with no traceback:
    (S, worker 0's log)."""
    took = re.search(r"worker 1: took the chief duties over from .*at global_step (\d+)", cluster.log("worker-1"))
    assert took, cluster.log("worker-1")[-3000:]
    code = cluster.exit_code("worker-0")
    log = cluster.log("worker-0")
    assert code != 0 and "Traceback" not in log, log[-3000:]
    return int(took.group(1)), log


def test_a_chief_stalled_after_its_last_push_and_resumed_after_the_take_over_saves_and_evaluates_nothing(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker 0, the chief and the last to finish (3,000 lines against worker 1's 300), stops itself right after its
    last push (its ``Leave`` sent, its session's end to come), and is resumed once worker 1 took the duties over,
    wrote the final checkpoint, evaluated and exited. It stops with one line naming the take-over and its final,
    exit 1, writing nothing: the pointer stays the take-over's, no 'eval step='. Before, no check ran (it pushed no
    step after it resumed): it was elected, marked the take-over's checkpoint final again under its own epoch,
    sent ``Done`` and exited 0 as if its session had ended the run."""
    _stall(monkeypatch, "after_last_push")
    cluster = tasks(_cluster(1, 2))
    ckpt = _start(cluster, tmp_path, [3000, 300])
    chief = cluster.procs["worker-0"]
    try:
        wait_until(lambda: _stopped(chief.pid) or chief.poll() is not None, "worker 0 stopped after its last push",
                   limit=_SAFETY)
        assert chief.poll() is None, cluster.log("worker-0")[-3000:]
        assert cluster.exit_code("worker-1") == 0, cluster.log("worker-1")[-3000:]
        pointer = (ckpt / "checkpoint").read_bytes()
    finally:
        os.kill(chief.pid, signal.SIGCONT)
    step, log = _taken_over_chief(cluster)
    assert re.search(r"/job:worker/task:0: the run was ended without this worker: /job:worker/task:1 took the chief "
                     rf"duties over and wrote the final checkpoint ckpt-\d+ at global_step {step}", log), log[-3000:]
    assert (ckpt / "checkpoint").read_bytes() == pointer  # not marked final again, nor saved
    final = latest_checkpoint(str(ckpt))
    assert final is not None and read_manifest(final).final and read_manifest(final).global_step == step, final
    evals = re.findall(r"eval step=(\d+)", cluster.log("worker-1") + log)
    assert evals == [str(step)], evals


def test_a_holder_stalled_mid_final_evaluation_and_resumed_after_the_take_over_reports_no_second_evaluation(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``--checkpoint-dir`` (the run ends with its evaluation only): worker 0, the chief and the last to finish,
    stops itself in its final evaluation, after ps task 0 said nobody had evaluated the final model. Worker 1 takes
    the duties over, evaluates that model, records it and exits; worker 0, resumed, finishes its evaluation and
    drops it: one ``eval step=`` line, one ``eval/auc`` point, and ps task 0's record names worker 1. Before, the
    resumed chief logged its own ``eval step=S`` (a second evaluation of the same model, with its own figures) and
    its record replaced the take-over's."""
    _stall(monkeypatch, "mid_final_eval")
    cluster = tasks(_cluster(1, 2))
    summaries = tmp_path / "summaries"
    cluster.start("ps", 0)
    for i in range(2):
        cluster.start("worker", i, *_files(tmp_path, [3000, 300]), "--num-features", "124", "--epochs", "3",
                      "--batch-size", "32", "--no-status", "--eval", str(A9A_T), "--summary-dir", str(summaries),
                      "--lease-ttl", "2")
    chief = cluster.procs["worker-0"]
    try:
        wait_until(lambda: _stopped(chief.pid) or chief.poll() is not None, "worker 0 stopped in its final evaluation",
                   limit=_SAFETY)
        assert chief.poll() is None, cluster.log("worker-0")[-3000:]
        assert cluster.exit_code("worker-1") == 0, cluster.log("worker-1")[-3000:]
    finally:
        os.kill(chief.pid, signal.SIGCONT)
    took = re.search(r"worker 1: took the chief duties over from .*ending the run \(no --checkpoint-dir\) at "
                     r"global_step (\d+)", cluster.log("worker-1"))
    assert took, cluster.log("worker-1")[-3000:]
    step = int(took.group(1))
    assert cluster.exit_code("worker-0") == 0, cluster.log("worker-0")[-3000:]
    log = cluster.log("worker-0")
    assert "Traceback" not in log, log[-3000:]
    assert re.search(rf"/job:worker/task:0: the final model \(global_step {step}\) was evaluated by "
                     r"/job:worker/task:1 while this worker evaluated it", log), log[-3000:]
    evals = re.findall(r"eval step=(\d+)", cluster.log("worker-1") + log)
    assert evals == [str(step)], evals
    auc = read_scalars(str(summaries))["eval/auc"]
    assert [s for s, _ in auc] == [step], auc
    assert cluster.exit_code("ps-0") == 0, cluster.log("ps-0")[-3000:]
    assert f"final model evaluated at step {step} by /job:worker/task:1" in cluster.log("ps-0"), cluster.log("ps-0")


def test_a_chief_stopped_inside_a_saves_locked_section_leaves_the_take_over_its_final_checkpoint(
        tasks: Callable[[ClusterSpec], _Tasks], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the first test, but worker 0 stops itself inside a periodic save's locked section (the checkpoint
    directory's mutex held, its pointer about to be switched), once worker 1 finished its data. Worker 1 takes
    the duties over and must still write the run's final checkpoint and exit 0; worker 0, resumed, must not take
    the pointer from it. Found flaky (2 in 8 beside two CPU hogs) where the test's own SIGSTOP fell there: the
    take-over's final save waited 30 s for the mutex, failed, and the run ended with no final checkpoint."""
    trigger = tmp_path / "stall-now"
    _stall(monkeypatch, "in_save_lock")
    monkeypatch.setenv("PSFLOW_TEST_STALL_FILE", str(trigger))
    cluster = tasks(_cluster(1, 2))
    ckpt = _start(cluster, tmp_path, [None, 300])
    chief = cluster.procs["worker-0"]
    wait_until(lambda: "finished its data" in cluster.log("worker-1"), "worker 1 finished its data", limit=_SAFETY)
    trigger.touch()
    try:
        wait_until(lambda: _stopped(chief.pid) or chief.poll() is not None, "worker 0 stopped inside a save",
                   limit=_SAFETY)
        assert chief.poll() is None and _holds_flock(chief.pid), cluster.log("worker-0")[-3000:]
        assert cluster.exit_code("worker-1") == 0, cluster.log("worker-1")[-3000:]
    finally:
        os.kill(chief.pid, signal.SIGCONT)
    step, log = _taken_over_chief(cluster)
    final = latest_checkpoint(str(ckpt))
    assert final is not None and read_manifest(final).final and read_manifest(final).global_step == step, final
    # worker 1 went past the mutex and published through its own epoch's pointer file, which decides; worker 0,
    # resumed, wrote its older epoch's and was fenced off
    epochs = [p for p in ckpt.glob("checkpoint.e*") if p.name.removeprefix("checkpoint.e").isdigit()]
    newest = max(epochs, key=lambda p: int(p.name.removeprefix("checkpoint.e")))
    assert json.loads(newest.read_text())["latest"] == Path(final).name, newest.read_text()
    assert json.loads((ckpt / "checkpoint").read_text()) == json.loads(newest.read_text())
    assert "checkpoint not made current" in log, log[-3000:]
