"""The chief's duties do not lapse (issue 25, item 9): real processes, the embedded lease on ps task 0.

Before: a worker whose data had ended could take the chief lease (and resign at once), the last worker
to finish gave up on the lease after 1 s, so after the chief was killed no checkpoint was written for the
rest of the run, the final one included; and ``--chaos kill:chief`` killed worker 0 even after it had
handed the duties on.

Now only a worker that trains takes the lease, the last to finish waits for it and writes the final
checkpoint, and ``kill:chief`` hits whoever holds the lease when it fires.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support import A9A, run_cli

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(200)]

SAVE_EVERY = 100


def train(out: Path, files: list[Path], *extra: str) -> subprocess.CompletedProcess[str]:
    """``psflow train``, 2 ps and 3 workers (worker i reads ``files[i]``), a checkpoint every 100 steps."""
    args = [a for f in files for a in ("--train", str(f))]
    return run_cli("train", *args, "--num-features", "124", "--ps", "2", "--workers", "3", "--batch-size", "32",
                   "--log-every", "50", "--quiet", "--output", str(out), "--checkpoint-dir", str(out / "ckpt"),
                   "--save-checkpoints-steps", str(SAVE_EVERY), "--restart-policy", "on-failure", *extra, timeout=180)


def data(tmp_path: Path, sizes: list[int | None]) -> list[Path]:
    """One a9a file per worker, in the order the workers read them (sorted names): ``sizes`` lines, None: all."""
    lines = A9A.read_text().splitlines(keepends=True)
    files = []
    for i, size in enumerate(sizes):
        files.append(tmp_path / f"{'abc'[i]}_part")
        files[-1].write_text("".join(lines[:size]))
    return files


def lives(out: Path, worker: int) -> list[str]:
    """Worker ``worker``'s log, one entry per process it ran as."""
    return ["serving at" + part for part in (out / "logs" / f"worker-{worker}.log").read_text().split("serving at")[1:]]


def saves(out: Path) -> list[int]:
    """The global steps of every checkpoint the workers saved, in order."""
    return sorted(int(s) for w in range(3) for s in
                  re.findall(r"saved checkpoint \S+ at step (\d+)", (out / "logs" / f"worker-{w}.log").read_text()))


def check_final(out: Path) -> dict[str, Any]:
    metrics: dict[str, Any] = json.loads((out / "metrics.json").read_text())
    final = read_manifest(latest_checkpoint(str(out / "ckpt")) or "")
    assert final.final and final.global_step == metrics["global_step"], (final, metrics["global_step"])
    return metrics


def test_checkpoints_go_on_after_the_chief_is_killed_late_in_a_3_worker_run(tmp_path: Path) -> None:
    """2 epochs: workers 1 and 2 read 3,000 lines each (~190 steps) and finish early; worker 0 (the chief)
    reads a9a whole (~2,040 steps) and is killed at step 1,900, the last one training. Its new process
    finishes its data before the dead process's lease lapses (10 s), and waits for the lease to write the
    final checkpoint (before: none was written after the kill). The workers whose data ended never take it."""
    out = tmp_path / "run"
    r = train(out, data(tmp_path, [None, 3000, 3000]), "--epochs", "2", "--chaos", "kill:chief@step=1900")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = check_final(out)
    (fault,) = metrics["faults"]
    assert fault["task"] == "/job:worker/task:0" and f"elected chief (epoch {fault['lease_epoch']})" in lives(out, 0)[0]
    check_saves_after(out, fault, metrics)
    assert "elected chief" in lives(out, 0)[1], lives(out, 0)[1][-3000:]
    for w in (1, 2):  # a worker whose data ended never took the lease
        (life,) = lives(out, w)
        assert "finished its data" in life and "elected chief" not in life[life.index("finished its data"):], life[-3000:]


def test_kill_chief_hits_the_worker_holding_the_duties_not_worker_0(tmp_path: Path) -> None:
    """Worker 0 (the configured chief) reads 320 lines and hands the duties on when its data ends; the
    chief kill at step 1,000 (of ~2,050) must hit the worker that holds them then (before: worker 0), and
    the other worker, still training, takes them over and saves at the interval."""
    out = tmp_path / "run"
    r = train(out, data(tmp_path, [320, None, None]), "--epochs", "1", "--lease-ttl", "3",
              "--chaos", "kill:chief@step=1000")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = check_final(out)
    (fault,) = metrics["faults"]
    victim = int(fault["task"].rsplit(":", 1)[1])
    assert victim != 0, fault
    assert f"elected chief (epoch {fault['lease_epoch']})" in lives(out, victim)[0], (fault, lives(out, victim)[0][-3000:])
    (first,) = lives(out, 0)
    assert "elected chief" not in first[first.index("finished its data"):], first[-3000:]
    check_saves_after(out, fault, metrics)


def check_saves_after(out: Path, fault: dict[str, Any], metrics: dict[str, Any]) -> None:
    """After the kill: a checkpoint at the interval from the first one on (the take-over, within the lease
    time), up to the final one at the run's last step."""
    after = [s for s in saves(out) if s > fault["at_step"]]
    assert after and after[-1] == metrics["global_step"], (saves(out), fault)
    gaps = [b - a for a, b in zip(after, after[1:], strict=False)]
    assert all(gap <= SAVE_EVERY + SAVE_EVERY // 2 for gap in gaps), (after, fault)


def test_a_chief_the_launcher_restarts_keeps_its_duties_however_slow_its_restart(tmp_path: Path) -> None:
    """psflow train restarts a killed chief (--restart-policy on-failure) or stops the run (never): no finished
    worker takes the duties over meanwhile (psflow.train.take_over is for a chief that nothing restarts). With a 2 s
    lease the restarted chief pushes again only after nobody pushed or held the lease for the lease's ttl (its
    restart's 0.5 s pause, then its start-up): before, worker 1 or 2 took the duties over then, wrote a checkpoint
    marked final at step 1,900 and left while worker 0 trained on (~500 steps more)."""
    out = tmp_path / "run"
    r = train(out, data(tmp_path, [None, 3000, 3000]), "--epochs", "2", "--lease-ttl", "2",
              "--chaos", "kill:chief@step=1900")
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = check_final(out)
    assert len(metrics["restarts"]) == 1 and metrics["global_step"] > metrics["faults"][0]["at_step"], metrics
    finals = [ckpt.name for ckpt in sorted((out / "ckpt").glob("ckpt-*")) if read_manifest(str(ckpt)).final]
    assert finals == [f"ckpt-{metrics['global_step']:09d}"], finals
    for w in (1, 2):  # a worker whose data ended never took the lease
        (life,) = lives(out, w)
        assert "finished its data" in life and "elected chief" not in life[life.index("finished its data"):], life[-3000:]
        assert "took the chief duties over" not in life and "is written already" not in life, life[-3000:]
