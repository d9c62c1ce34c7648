"""A new run of ``psflow server`` tasks on ps task 0's reused ``--state-dir`` never goes on past the earlier run's
step values (guarantee 2 says no value twice; skipping another run's is no part of it).

Run A (its own checkpoint directory, so its own run id) trains 600 steps and ends; its ps tasks exit. Run B starts
new ``psflow server`` processes over the same cluster file, ps task 0 on the same ``--state-dir``, and checkpoints
every 50 steps; past step 100 ps task 1 is SIGKILLed and started again, empty. The lease holder restores B's newest
checkpoint at a new generation with global_step past the values B handed out. Before, ps task 0's BeginRestore
replied run A's floor (its process read it from A's journal; the chief's claim restarted only the bound), so the
restore set global_step to 600 and B skipped every value up to it.

Replicated (a ``ps_backup`` job, every shard with one backup; shard 0's members each on a reused ``--state-dir``):
run B kills ps task 0 past step 100 (the workers promote its backup, whose journal is run A's), then both members of
shard 1 at once; the restore's BeginRestore goes to the promoted backup. Before, a backup's journal never named a run
(its clock's replica state carried none), so run B's claim never reached it and it kept run A's floor: the restore
set global_step past A's last value. Real processes on 127.0.0.1, killed by pid at the end if they still run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import A9A, REPO, TOKEN, wait_until

from psflow.cluster import ClusterSpec
from psflow.launch.ports import free_ports

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

_LIMIT = 180.0  # s: a safety net for a passing run, never reached by one
_STEP = re.compile(r"worker \d: step=(\d+) ")
_RESTORED = re.compile(r"restored checkpoint \S+ \(step \d+\) onto every ps task; generation \d+, global_step (\d+)")


class _Run:
    """One run's ``psflow server`` processes (logs ``<tag>-<job>-<index>[-again].log`` in ``workdir``)."""

    def __init__(self, workdir: Path, tag: str) -> None:
        self.workdir, self.tag = workdir, tag
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, job: str, index: int, *flags: str, name: str | None = None) -> None:
        name = name or f"{job}-{index}"
        env = {k: v for k, v in os.environ.items() if k not in ("PSFLOW_TOKEN", "TF_CONFIG")}
        env.update(PSFLOW_TOKEN=TOKEN, PYTHONUNBUFFERED="1")
        with open(self.workdir / f"{self.tag}-{name}.log", "wb") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "psflow", "server", "--cluster", str(self.workdir / "cluster.json"),
                 "--job", job, "--task", str(index), *flags],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO), env=env)

    def log(self, name: str) -> str:
        return (self.workdir / f"{self.tag}-{name}.log").read_text(errors="replace")

    def steps(self) -> list[int]:
        return [int(s) for w in (0, 1) for s in _STEP.findall(self.log(f"worker-{w}"))]

    def exit_code(self, name: str) -> int:
        try:
            return self.procs[name].wait(timeout=_LIMIT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{name} still running after {_LIMIT} s:\n{self.log(name)[-3000:]}") from None

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


def _start(run: _Run, state: Path, *train: str) -> None:
    for i in (0, 1):
        run.start("ps", i, "--checkpoint-root", str(run.workdir), *(("--state-dir", str(state)) if i == 0 else ()))
    for i in (0, 1):
        run.start("worker", i, "--train", str(A9A), "--num-features", "124", "--epochs", "1", "--batch-size", "32",
                  "--no-status", "--log-every", "1", "--lease-ttl", "3", *train)


def test_a_new_run_on_a_reused_state_dir_restores_a_lost_ps_task_at_its_own_steps(tmp_path: Path) -> None:
    ports = free_ports(4)
    (tmp_path / "cluster.json").write_text(ClusterSpec(
        {"ps": [f"127.0.0.1:{p}" for p in ports[:2]], "worker": [f"127.0.0.1:{p}" for p in ports[2:]]}).to_json())
    state, runs = tmp_path / "state-ps-0", [_Run(tmp_path, "a"), _Run(tmp_path, "b")]
    first, second = runs
    try:
        _start(first, state, "--checkpoint-dir", str(tmp_path / "ckpt-a"), "--max-steps", "600")
        for name in ("worker-0", "worker-1", "ps-0", "ps-1"):
            assert first.exit_code(name) == 0, f"run A's {name}:\n{first.log(name)[-3000:]}"
        ended = max(first.steps())
        assert ended >= 600, ended
        _start(second, state, "--checkpoint-dir", str(tmp_path / "ckpt-b"), "--save-checkpoints-steps", "50")
        wait_until(lambda: max(second.steps(), default=0) > 100, "run B past step 100", limit=_LIMIT)
        os.kill(second.procs["ps-1"].pid, signal.SIGKILL)
        killed_at = max(second.steps())
        second.procs["ps-1"].wait(timeout=30)
        time.sleep(0.5)  # (its port freed)
        second.start("ps", 1, "--checkpoint-root", str(tmp_path), name="ps-1-again")
        for name in ("worker-0", "worker-1"):
            assert second.exit_code(name) == 0, f"run B's {name}:\n{second.log(name)[-3000:]}"
    finally:
        for run in runs:
            run.kill_all()
    assert killed_at < ended - 100, (killed_at, ended)  # else this test could not tell the two apart
    logs = second.log("worker-0") + second.log("worker-1")
    restored = [int(s) for s in _RESTORED.findall(logs)]
    assert len(restored) == 1 and restored[0] < ended, (restored, ended, logs[-3000:])
    steps = second.steps()
    assert len(steps) == len(set(steps)), sorted(s for s in set(steps) if steps.count(s) > 1)[:20]


def _start_replicated(run: _Run, state: Path, *train: str) -> None:
    """2 ps + 2 ps_backup (shard 0's members on ``state/<job>-0``) + 2 workers."""
    for job in ("ps", "ps_backup"):
        for i in (0, 1):
            run.start(job, i, "--checkpoint-root", str(run.workdir),
                      *(("--state-dir", str(state / f"{job}-0")) if i == 0 else ()))
    for i in (0, 1):
        run.start("worker", i, "--train", str(A9A), "--num-features", "124", "--epochs", "1", "--batch-size", "32",
                  "--no-status", "--log-every", "1", "--lease-ttl", "3", *train)


def _journal_run(state: Path, member: str) -> object:
    return json.loads((state / member / "global_step.json").read_text()).get("run")


def test_a_new_run_s_promoted_backup_on_a_reused_state_dir_restores_at_its_own_steps(tmp_path: Path) -> None:
    ports = free_ports(6)
    (tmp_path / "cluster.json").write_text(ClusterSpec(
        {"ps": [f"127.0.0.1:{p}" for p in ports[:2]], "ps_backup": [f"127.0.0.1:{p}" for p in ports[2:4]],
         "worker": [f"127.0.0.1:{p}" for p in ports[4:]]}).to_json())
    state, runs = tmp_path / "state", [_Run(tmp_path, "a"), _Run(tmp_path, "b")]
    first, second = runs
    try:
        _start_replicated(first, state, "--checkpoint-dir", str(tmp_path / "ckpt-a"), "--max-steps", "600")
        for name in ("worker-0", "worker-1", "ps-0", "ps-1", "ps_backup-0", "ps_backup-1"):
            assert first.exit_code(name) == 0, f"run A's {name}:\n{first.log(name)[-3000:]}"
        ended = max(first.steps())
        assert ended >= 600, ended
        run_a = _journal_run(state, "ps-0")
        assert isinstance(run_a, str) and _journal_run(state, "ps_backup-0") == run_a  # the backup names A too
        _start_replicated(second, state, "--checkpoint-dir", str(tmp_path / "ckpt-b"), "--save-checkpoints-steps", "50")
        wait_until(lambda: max(second.steps(), default=0) > 100, "run B past step 100", limit=_LIMIT)
        os.kill(second.procs["ps-0"].pid, signal.SIGKILL)  # shard 0's backup is promoted
        second.procs["ps-0"].wait(timeout=30)
        promoted = re.compile(r"ps shard 0 routes to /job:ps_backup/task:0 at epoch \d+")
        wait_until(lambda: promoted.search(second.log("worker-0") + second.log("worker-1")), "ps_backup:0 promoted",
                   limit=_LIMIT)
        past = max(second.steps()) + 20
        wait_until(lambda: max(second.steps()) > past, f"run B past step {past}", limit=_LIMIT)
        for name in ("ps-1", "ps_backup-1"):  # every replica of shard 1 at once: a restore at a new generation
            os.kill(second.procs[name].pid, signal.SIGKILL)
        killed_at = max(second.steps())
        for name in ("ps-1", "ps_backup-1"):
            second.procs[name].wait(timeout=30)
        time.sleep(0.5)  # (their ports freed)
        second.start("ps", 1, "--checkpoint-root", str(tmp_path), name="ps-1-again")
        second.start("ps_backup", 1, "--checkpoint-root", str(tmp_path), name="ps_backup-1-again")
        for name in ("worker-0", "worker-1"):
            assert second.exit_code(name) == 0, f"run B's {name}:\n{second.log(name)[-3000:]}"
    finally:
        for run in runs:
            run.kill_all()
    assert killed_at < ended - 100, (killed_at, ended)  # else this test could not tell the two apart
    assert _journal_run(state, "ps_backup-0") not in (None, run_a)  # the promoted backup's journal names run B
    logs = second.log("worker-0") + second.log("worker-1")
    restored = [int(s) for s in _RESTORED.findall(logs)]
    assert len(restored) == 1 and killed_at <= restored[0] < ended, (restored, killed_at, ended, logs[-3000:])
    steps = second.steps()
    assert len(steps) == len(set(steps)), sorted(s for s in set(steps) if steps.count(s) > 1)[:20]
