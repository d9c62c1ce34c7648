"""TensorFlow's evaluator task under ``psflow server``: every new checkpoint evaluated, the final one last.

Real processes: a ps task, a chief and a worker (``psflow server`` with TF_CONFIG, gRPC on 127.0.0.1) train
a9a with checkpoints; a fourth process, whose TF_CONFIG names it ``evaluator`` (a task outside the cluster,
as a TFJob's Evaluator replica is), watches the checkpoint directory.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from support import A9A, A9A_T, REPO, TOKEN, run_bounded, wait_until

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.data import read_all
from psflow.export import load_checkpoint_model
from psflow.launch.evaluator import run_evaluator
from psflow.launch.ports import free_ports
from psflow.train.config import ConfigError, TrainConfig
from psflow.train.evaluation import ArrayParameters, evaluate
from psflow.train.summary import read_scalars

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _spawn(job: str, index: int, cluster: dict[str, list[str]], args: list[str], log: Path,
           **extra_env: str) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PSFLOW_TOKEN=TOKEN, PYTHONUNBUFFERED="1",
               TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": job, "index": index}}), **extra_env)
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "psflow", "server", *args], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env, cwd=str(REPO))


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()


def test_the_evaluator_evaluates_each_new_checkpoint_and_ends_after_the_final_one(tmp_path: Path) -> None:
    ports = free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"], "ps": [f"127.0.0.1:{ports[2]}"]}
    ckpt, summaries = tmp_path / "ckpt", tmp_path / "summaries"
    # The same arguments for every task, as a TFJob gives them.
    args = ["--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--epochs", "2", "--batch-size", "256",
            "--checkpoint-dir", str(ckpt), "--save-checkpoints-steps", "40", "--max-to-keep", "100",
            "--summary-dir", str(summaries), "--no-status", "--eval-poll-secs", "0.2"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        # The evaluator first: it waits for the first checkpoint.
        evaluator = _spawn("evaluator", 0, cluster, args, tmp_path / "evaluator.log")
        procs.append(evaluator)
        wait_until(lambda: "evaluator: watching" in (tmp_path / "evaluator.log").read_text(), "the evaluator started")
        procs.append(_spawn("ps", 0, cluster, ["--checkpoint-root", str(ckpt)], tmp_path / "ps.log"))
        trainers = [_spawn("chief", 0, cluster, args, tmp_path / "chief.log"),
                    _spawn("worker", 0, cluster, args, tmp_path / "worker.log")]
        procs += trainers
        for proc, name in zip(trainers, ["chief", "worker"], strict=True):
            assert proc.wait(timeout=180) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
        assert evaluator.wait(timeout=120) == 0, (tmp_path / "evaluator.log").read_text()[-3000:]
    finally:
        _kill(procs)

    final = latest_checkpoint(str(ckpt))
    assert final is not None
    manifest = read_manifest(final)
    assert manifest.final
    assert not any(read_manifest(str(p)).final for p in ckpt.glob("ckpt-*") if str(p) != final)
    log = (tmp_path / "evaluator.log").read_text()
    evaluated = [(int(step), name, bool(last)) for step, name, last in
                 re.findall(r"evaluator: step=(\d+) .*\((ckpt-[0-9-]+)(, final)?\)", log)]
    assert evaluated, log
    steps = [step for step, _, _ in evaluated]
    assert steps == sorted(steps) and len(set(steps)) == len(steps), evaluated  # each checkpoint once, in order
    # The last one evaluated is the final checkpoint: saved final, or marked final after it was evaluated
    # (the chief's last periodic save fell on the last step), which the evaluator then says on a line of its own.
    name = os.path.basename(final)
    assert evaluated[-1][:2] == (manifest.global_step, name), (evaluated, final)
    assert evaluated[-1][2] or f"evaluator: {name} is the final checkpoint" in log, log
    assert "training ended" in log

    # The metrics are those of the checkpoint's own parameters on --eval, and TensorBoard has them.
    model = load_checkpoint_model(final)
    expected = evaluate(model.model, ArrayParameters(model.values), read_all([str(A9A_T)], "libsvm", num_features=124))
    assert expected["auc"] >= 0.89, expected
    scalars = read_scalars(str(summaries / "eval"))
    assert [s for s, _ in scalars["eval/auc"]] == steps
    last_auc = scalars["eval/auc"][-1][1]
    assert math.isclose(last_auc, expected["auc"], rel_tol=1e-6), (last_auc, expected)


def test_the_evaluator_ends_on_a_stop_and_refuses_a_run_without_its_inputs(tmp_path: Path) -> None:
    config = TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124, checkpoint_dir=str(tmp_path / "none"))
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    assert run_evaluator(config, poll_secs=0.05, stop=stop) == []  # no checkpoint yet: it waited, then stopped
    with pytest.raises(ConfigError, match="--checkpoint-dir"):
        run_evaluator(TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124))
    with pytest.raises(ConfigError, match="--eval"):
        run_evaluator(TrainConfig.flat(train=(str(A9A),), num_features=124, checkpoint_dir=str(tmp_path)))

    # Under psflow server: one line naming the flag, exit status 1, no traceback.
    port = free_ports(1)[0]
    env = dict(os.environ, PSFLOW_TOKEN=TOKEN, TF_CONFIG=json.dumps(
        {"cluster": {"ps": [f"127.0.0.1:{port}"]}, "task": {"type": "evaluator", "index": 0}}))
    done = run_bounded([sys.executable, "-m", "psflow", "server", "--train", str(A9A), "--eval", str(A9A_T),
                        "--num-features", "124"], timeout=60, env=env)
    assert done.returncode == 1, done
    assert "--checkpoint-dir" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_run_whose_last_periodic_save_falls_on_its_last_step_still_marks_it_final(tmp_path: Path) -> None:
    """One worker, --max-steps 20, a save every 10 steps: the save at step 20 is the last; the session's
    end marks it final instead of saving twice; the evaluator (in this process) ends on it."""
    from support import run_cli

    ckpt = tmp_path / "ckpt"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "1", "--quiet",
                "--max-steps", "20", "--save-checkpoints-steps", "10", "--checkpoint-dir", str(ckpt),
                "--output", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-2000:]
    saved = sorted((read_manifest(str(p)).global_step, read_manifest(str(p)).final) for p in ckpt.glob("ckpt-*"))
    assert saved == [(0, False), (10, False), (20, True)], saved
    config = TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124, checkpoint_dir=str(ckpt))
    done = run_evaluator(config, poll_secs=0.05)
    assert [(e.global_step, e.final) for e in done] == [(20, True)]


def _trained(tmp_path: Path) -> Path:
    """A finished run's checkpoint directory: ckpt-000000000, -10, -20 (final), one ps task, one worker; every
    save full (an increment reads its base's shards too)."""
    from support import run_cli

    ckpt = tmp_path / "ckpt"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "1", "--quiet",
                "--max-steps", "20", "--save-checkpoints-steps", "10", "--full-checkpoint-every", "1",
                "--checkpoint-dir", str(ckpt), "--output", str(tmp_path / "run"))
    assert r.returncode == 0, r.stderr[-2000:]
    return ckpt


def _damage(checkpoint: Path) -> Path:
    shard = sorted(checkpoint.glob("shard-*"))[0]
    shard.write_bytes(shard.read_bytes()[:100])
    return shard


def test_a_damaged_checkpoint_is_named_once_and_the_evaluator_waits_for_a_newer_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The newest checkpoint cannot be read (a shard cut short): one WARNING names it and the shard, and the
    evaluator waits for the next checkpoint instead of reading the damaged one again at every turn of its loop
    (it did, without pause: thousands of lines a second). The final checkpoint that follows is evaluated."""
    ckpt = _trained(tmp_path)
    final = ckpt / "ckpt-000000020"
    aside = tmp_path / "aside"
    final.rename(aside)  # the pointer names it; gone, the newest complete one it lists is ckpt-000000010
    shard = _damage(ckpt / "ckpt-000000010")
    config = TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124, checkpoint_dir=str(ckpt))
    stop = threading.Event()
    result: list[list[tuple[int, bool]]] = []
    caplog.set_level("INFO", logger="psflow.evaluator")
    thread = threading.Thread(target=lambda: result.append(
        [(e.global_step, e.final) for e in run_evaluator(config, poll_secs=0.05, stop=stop)]))
    thread.start()
    try:
        def named() -> list[str]:
            return [f"{r.levelname} {r.getMessage()}" for r in caplog.records
                    if r.name == "psflow.evaluator" and "ckpt-000000010" in r.getMessage()]

        wait_until(lambda: named() or None, "the evaluator named the damaged checkpoint")
        aside.rename(final)  # polls went by meanwhile (wait_until looks every 0.1 s; the evaluator, 0.05 s)
        thread.join(timeout=120)
    finally:
        stop.set()
        thread.join(timeout=30)
    assert result == [[(20, True)]], (result, caplog.text[-3000:])
    lines = named()
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith("WARNING ") and str(shard) in lines[0], lines


def test_a_damaged_final_checkpoint_stops_the_evaluator_naming_it(tmp_path: Path) -> None:
    """The run's final checkpoint cannot be read: nothing newer will come, so the evaluator fails with one
    line naming the checkpoint and the shard (exit status 1), instead of reading it again for ever."""
    ckpt = _trained(tmp_path)
    shard = _damage(ckpt / "ckpt-000000020")
    port = free_ports(1)[0]
    env = dict(os.environ, PSFLOW_TOKEN=TOKEN, TF_CONFIG=json.dumps(
        {"cluster": {"ps": [f"127.0.0.1:{port}"], "worker": [f"127.0.0.1:{port + 1}"]},
         "task": {"type": "evaluator", "index": 0}}))
    done = run_bounded([sys.executable, "-m", "psflow", "server", "--train", str(A9A), "--eval", str(A9A_T),
                        "--num-features", "124", "--checkpoint-dir", str(ckpt), "--eval-poll-secs", "0.05"],
                       timeout=120, env=env)
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr, done.stderr
    assert "ckpt-000000020" in done.stderr and str(shard) in done.stderr and "final" in done.stderr, done.stderr
    assert done.stderr.count("ckpt-000000020") <= 3, done.stderr[-3000:]  # not one line per poll


def test_an_evaluator_beside_a_resumed_run_evaluates_the_resumed_run_up_to_its_final_checkpoint(tmp_path: Path) -> None:
    """A finished run's final checkpoint (ckpt-000000020) is newest when a resumed run (--max-steps 60) starts:
    the evaluator evaluated it and exited at once, and the resumed run's checkpoints were never evaluated. The
    resumed run took the directory's lock after that checkpoint was written, so the evaluator waits for its
    checkpoints and ends on its final one. Real processes: ``psflow train`` resumes; the evaluator runs here."""
    ckpt = _trained(tmp_path)
    resumed = subprocess.Popen(
        [sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124", "--ps", "1",
         "--workers", "1", "--quiet", "--max-steps", "60", "--save-checkpoints-steps", "20",
         "--checkpoint-dir", str(ckpt), "--output", str(tmp_path / "resumed")],
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "resumed.err", "wb"), stdin=subprocess.DEVNULL,
        cwd=str(REPO), start_new_session=True)
    lock = ckpt / "checkpoint.lock"
    config = TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124, checkpoint_dir=str(ckpt))
    stop = threading.Event()
    result: list[list[tuple[int, bool]]] = []
    thread = threading.Thread(target=lambda: result.append(
        [(e.global_step, e.final) for e in run_evaluator(config, poll_secs=0.05, stop=stop)]))
    try:
        # Started once the resumed run holds the directory (its launcher takes it before any task starts).
        wait_until(lambda: lock.exists() and str(tmp_path / "resumed") in lock.read_text(), "the resumed run's lock")
        thread.start()
        assert resumed.wait(timeout=180) == 0, (tmp_path / "resumed.err").read_text()[-3000:]
        thread.join(timeout=120)
        ended_by_itself = not thread.is_alive()
    finally:
        stop.set()
        if thread.ident is not None:
            thread.join(timeout=30)
        _kill([resumed])
    assert ended_by_itself and result, result
    assert result[0][-1] == (60, True), result  # the resumed run's final checkpoint, not only the old one (20)


def test_an_evaluator_started_after_a_run_ended_ends_on_its_final_checkpoint_unless_a_live_run_holds_the_dir(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The lock tells a resumed run from a finished one: no lock (the run ended), a lock taken before the final
    checkpoint (its own run, ending), or a lock of a process that is gone: the evaluator evaluates the final
    checkpoint and exits. A live run's lock taken after it: the evaluator says so once and waits."""
    ckpt = _trained(tmp_path)
    config = TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124, checkpoint_dir=str(ckpt))
    assert [(e.global_step, e.final) for e in run_evaluator(config, poll_secs=0.05)] == [(20, True)]
    manifest = read_manifest(str(ckpt / "ckpt-000000020"))
    created, writer = manifest.created, (manifest.run or {})["run_id"]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = ckpt / "checkpoint.lock"
    holder = {"run_id": "20261127-000000-00000000", "host": socket.gethostname(), "boot_id": None,
              "since": created + 60, "since_text": "later", "run_dir": None}
    lock.write_text(json.dumps(dict(holder, pid=dead.pid, pid_start=None)))  # a resumed run that died
    assert [(e.global_step, e.final) for e in run_evaluator(config, poll_secs=0.05)] == [(20, True)]
    lock.write_text(json.dumps(dict(holder, run_id=writer, pid=os.getpid(), since=created - 1)))  # its run, ending
    assert [(e.global_step, e.final) for e in run_evaluator(config, poll_secs=0.05)] == [(20, True)]

    lock.write_text(json.dumps(dict(holder, pid=os.getpid())))  # a live run that took the directory since
    caplog.set_level("INFO", logger="psflow.evaluator")

    def waiting() -> list[str]:
        return [r.getMessage() for r in caplog.records if "took the checkpoint directory" in r.getMessage()]

    with _evaluator_in_thread(config) as (thread, result):
        wait_until(waiting, "the evaluator said it waits for the resumed run")
        lock.unlink()  # that run ended without a checkpoint (nothing left to train): the final one is still newest
        thread.join(timeout=120)
        assert not thread.is_alive()
    assert result == [[(20, True)]], result
    assert len(waiting()) == 1 and "20261127-000000-00000000" in waiting()[0], waiting()


@pytest.mark.parametrize("both_hold", [False, True], ids=["as-it-comes", "both-workers-hold-the-duties"])
def test_psflow_server_training_tasks_evaluate_on_eval_when_training_ended(tmp_path: Path, both_hold: bool) -> None:
    """``--eval`` without ``--eval-every-steps`` under ``psflow server``: the chief duties' holder evaluates once
    training ended, as ``psflow train``'s launcher does (it was ignored: no evaluation, and nothing said so).
    Two workers finishing together both hold the duties at their own end, one after the other (both_hold: every
    time, tests/integration/both_hold_duties); the final model is evaluated once all the same (it was twice)."""
    hold = os.pathsep.join([str(Path(__file__).parent / "both_hold_duties"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {"PYTHONPATH": hold} if both_hold else {}
    ports = free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"], "ps": [f"127.0.0.1:{ports[2]}"]}
    summaries = tmp_path / "summaries"
    args = ["--train", str(A9A), "--eval", str(A9A_T), "--num-features", "124", "--max-steps", "40",
            "--batch-size", "256", "--summary-dir", str(summaries), "--no-status"]
    procs = [_spawn("ps", 0, cluster, [], tmp_path / "ps.log")]
    try:
        trainers = {name: _spawn(name, 0, cluster, args, tmp_path / f"{name}.log", **env) for name in ("chief", "worker")}
        procs += trainers.values()
        for name, proc in trainers.items():
            assert proc.wait(timeout=180) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    finally:
        _kill(procs)
    lines = [line for name in ("chief", "worker") for line in (tmp_path / f"{name}.log").read_text().splitlines()
             if re.search(r"eval step=\d+ auc=", line)]
    # Once, by the task that held the chief duties at its end: two workers finishing together both hold them at
    # their own end, and the second skips the final model the first evaluated (psflow.train.final_eval).
    assert len(lines) == 1, lines
    step = int(re.findall(r"eval step=(\d+)", lines[0])[0])
    assert step >= 40, lines
    auc = read_scalars(str(summaries))["eval/auc"]
    assert [s for s, _ in auc] == [step] and auc[0][1] > 0.85, auc
    # ps task 0 recorded it (FinalEval) and its exit line says so.
    assert re.search(rf"run over \(.*, final model evaluated at step {step} by /job:worker/task:[01]\): exiting",
                     (tmp_path / "ps.log").read_text()), (tmp_path / "ps.log").read_text()[-2000:]
    if both_hold:
        skipped = [line for name in ("chief", "worker") for line in (tmp_path / f"{name}.log").read_text().splitlines()
                   if f"the final model (global_step {step}) was evaluated by /job:worker/task:" in line]
        assert len(skipped) == 1 and skipped[0].endswith("already: not again"), skipped


def test_an_evaluator_waits_for_a_resumed_run_on_another_host_and_says_how_to_end_the_wait(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A resumed run's lock names another host: whether its process lives cannot be told here (its pid means
    nothing on this host, even one that is dead here), so the evaluator waits; and since a run that crashed
    there leaves its lock for ever, the line says so and names the lock file to delete once that run is over
    (it said only 'waiting for its checkpoints'). Deleting it ends the wait on the final checkpoint."""
    ckpt = _trained(tmp_path)
    config = TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124, checkpoint_dir=str(ckpt))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = ckpt / "checkpoint.lock"
    lock.write_text(json.dumps({"run_id": "20261127-000000-00000000", "host": f"not-{socket.gethostname()}",
                                "pid": dead.pid, "pid_start": None, "boot_id": None,
                                "since": read_manifest(str(ckpt / "ckpt-000000020")).created + 60,
                                "since_text": "later", "run_dir": None}))
    caplog.set_level("INFO", logger="psflow.evaluator")

    def waiting() -> list[str]:
        return [r.getMessage() for r in caplog.records if "took the checkpoint directory" in r.getMessage()]

    with _evaluator_in_thread(config) as (thread, result):
        wait_until(waiting, "the evaluator said it waits for the resumed run")
        assert thread.is_alive()  # the dead local pid is not that host's process: it still waits
        assert str(lock) in waiting()[0] and "delete" in waiting()[0], waiting()
        lock.unlink()
        thread.join(timeout=120)
        assert not thread.is_alive()
    assert result == [[(20, True)]], result


def test_an_evaluator_past_a_crashed_runs_last_checkpoint_says_once_what_it_waits_for_and_how_to_end_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A run killed mid-training leaves only periodic checkpoints: the evaluator waits for a newer one, which never
    comes. While a live run holds the directory that is the normal wait; once none does (its lock released, or
    naming a process gone) one WARNING names the checkpoint and how to end the wait (it waited silently for ever)."""
    from support import run_cli

    ckpt = tmp_path / "ckpt"
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "1", "--workers", "1", "--quiet",
                "--max-steps", "400", "--save-checkpoints-steps", "10", "--full-checkpoint-every", "1",
                "--chaos", "kill:worker:0@step=15", "--checkpoint-dir", str(ckpt), "--output", str(tmp_path / "run"))
    assert r.returncode != 0, r.stdout[-2000:]
    newest = latest_checkpoint(str(ckpt))
    assert newest is not None and not read_manifest(newest).final, newest
    name, step = os.path.basename(newest), read_manifest(newest).global_step
    config = TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124, checkpoint_dir=str(ckpt))
    caplog.set_level("INFO", logger="psflow.evaluator")

    def lines(text: str) -> list[str]:
        return [r.getMessage() for r in caplog.records if text in r.getMessage()]

    from psflow.checkpoint.lock import CheckpointDirLock

    resumed = CheckpointDirLock(str(ckpt), "20261127-000000-resumed")  # a live run (this process) holds it
    resumed.acquire()
    with _evaluator_in_thread(config) as (thread, result):
        wait_until(lambda: lines(f"evaluator: step={step} "), "the evaluator evaluated the newest checkpoint")
        resumed.release()  # that run ended (or crashed) without a newer checkpoint
        wait_until(lambda: lines("waiting for a checkpoint newer than"), "the evaluator said what it waits for")
    assert result == [[(step, False)]], result
    said = [r for r in caplog.records if "waiting for a checkpoint newer than" in r.getMessage()]
    assert len(said) == 1 and said[0].levelname == "WARNING", said
    assert said[0].getMessage() == (
        f"evaluator: waiting for a checkpoint newer than {name} (global_step {step}, not final) in {ckpt}, but no run "
        "holds the directory (no checkpoint.lock: the run that wrote it ended or crashed): if that run crashed, none "
        "comes until it is resumed with this --checkpoint-dir; stop the evaluator (SIGTERM or Ctrl-C) to end the wait")

    caplog.clear()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    resumed.acquire()
    holder = json.loads((ckpt / "checkpoint.lock").read_text())
    (ckpt / "checkpoint.lock").write_text(json.dumps(dict(holder, pid=dead.pid)))  # a run here that crashed
    with _evaluator_in_thread(config):
        wait_until(lambda: lines("waiting for a checkpoint newer than"), "the evaluator said what it waits for")
    # Only that process may be gone: with chief election the other workers of a live run train on, and the one holding
    # the chief duties takes the lock over at its next save (a psflow server run, the worker that took the lock
    # killed: the line said the run was gone).
    assert [m for m in lines("waiting for a checkpoint newer than") if f"the process that holds it is gone: run "
            f"20261127-000000-resumed (pid {dead.pid} on {socket.gethostname()}" in m and "SIGTERM" in m
            and "or only that process: the worker holding the chief duties takes the lock over at its next save"
            in m], caplog.text



def test_an_evaluator_past_a_checkpoint_says_nothing_while_a_live_run_may_still_write_one(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side of the crashed run's warning (843b4e0): past a checkpoint that is not final, the evaluator
    waits in silence however often it looks while a run that may still save holds the directory: a live run on
    this host (a normal run between two saves), a lock naming another host, or one written in another pid
    namespace on this host (another container: its pid, dead here, says nothing, a9022bc). A lock of another
    host gets the line once no newer checkpoint came for UNSEEN_HOLDER_QUIET, naming the lock file to delete."""
    import psflow.launch.evaluator as evaluator
    from psflow.checkpoint.lock import CheckpointDirLock

    ckpt = _trained(tmp_path)
    shutil.rmtree(ckpt / "ckpt-000000020")  # the run was killed after its save at step 10: ckpt-10 is not final
    config = TrainConfig.flat(train=(str(A9A),), eval=(str(A9A_T),), num_features=124, checkpoint_dir=str(ckpt))
    caplog.set_level("INFO", logger="psflow.evaluator")
    looks: list[int] = []  # the evaluator's looks past ckpt-10 (each one judges the lock)
    judge = evaluator._Stalled.__call__

    def counted(self: object, path: str, step: int) -> None:
        judge(self, path, step)  # type: ignore[arg-type]
        looks.append(step)

    monkeypatch.setattr(evaluator._Stalled, "__call__", counted)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "waiting for a checkpoint newer than" in r.getMessage()]

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = CheckpointDirLock(str(ckpt), "20261127-000000-live")  # a live run here (this process) holds it
    live.acquire()
    mine = json.loads((ckpt / "checkpoint.lock").read_text())
    holders = {"a live run on this host": mine,
               "another host": dict(mine, host=f"not-{socket.gethostname()}", pid=dead.pid),
               "another pid namespace": dict(mine, pid=dead.pid, pid_ns="pid:[1]")}
    for what, holder in holders.items():
        (ckpt / "checkpoint.lock").write_text(json.dumps(holder))
        looks.clear()
        with _evaluator_in_thread(config) as (thread, _):
            wait_until(lambda: len(looks) >= 40, f"the evaluator looked past ckpt-10 40 times ({what})")
            assert thread.is_alive()
        assert looks and set(looks) == {10}, looks
        assert not said(), (what, said())
    monkeypatch.setattr(evaluator, "UNSEEN_HOLDER_QUIET", 0.5)  # the 30 min, shortened: no newer checkpoint came
    (ckpt / "checkpoint.lock").write_text(json.dumps(holders["another host"]))
    with _evaluator_in_thread(config):
        wait_until(said, "the evaluator said what it waits for, once the other host's run was quiet")
    assert len(said()) == 1 and str(ckpt / "checkpoint.lock") in said()[0] and "delete" in said()[0], said()
    assert f"not-{socket.gethostname()}" in said()[0] and "ckpt-000000010" in said()[0], said()


@contextlib.contextmanager
def _evaluator_in_thread(config: TrainConfig) -> Iterator[tuple[threading.Thread, list[list[tuple[int, bool]]]]]:
    """``run_evaluator`` in a thread: (the thread, [its (global_step, final) list] once it returned); stopped and
    joined on the way out."""
    stop = threading.Event()
    result: list[list[tuple[int, bool]]] = []
    thread = threading.Thread(target=lambda: result.append(
        [(e.global_step, e.final) for e in run_evaluator(config, poll_secs=0.05, stop=stop)]))
    thread.start()
    try:
        yield thread, result
    finally:
        stop.set()
        thread.join(timeout=30)
