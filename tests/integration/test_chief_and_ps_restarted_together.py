"""The chief and a ps task dying together, with a checkpoint: real processes, the launcher restarts both.

ps task 1: the chief's new process joins a cluster whose ps task 0 kept its state and whose ps task 1 came
back empty: its Register creates ps task 1's variables (not ready) and, ps task 0 being ready, restores nothing
there (:func:`psflow.train.chief.join_cluster`); its first push then fails and it waits for the lease holder to
restore the cluster. Before, nobody held the lease (the dead chief's lapsed, and a restarted chief campaigns only
after a step of its own): each of its processes failed with "cluster not restored after N s (not ready:
/job:ps/task:1)" until the launcher gave up. A worker that waits for a restore now campaigns, and restores every
ps task. ps task 0: see its test.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from support import A9A, run_cli

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def _kill_the_chief_and_ps_task(out: Path, task: int, *options: str,
                                workers: int = 1) -> tuple[subprocess.CompletedProcess[str], str]:
    """One pass over a9a (2 ps, ``workers`` workers, checkpoints every 100 steps) whose chief and ps task ``task``
    are killed at step 300 and restarted once; its result and worker 0's log."""
    r = run_cli("train", "--train", str(A9A), "--num-features", "124", "--ps", "2", "--workers", str(workers),
                *options,
                "--batch-size", "32", "--epochs", "1", "--no-status", "--output", str(out),
                "--checkpoint-dir", str(out / "ckpt"), "--save-checkpoints-steps", "100",
                "--restart-policy", "on-failure", "--max-restarts", "1", "--lease-ttl", "2",
                "--connect-timeout", "60", "--chaos", f"kill:ps:{task}@step=300", "--chaos", "kill:chief@step=300",
                timeout=360)
    return r, (out / "logs" / "worker-0.log").read_text()


def test_a_chief_restarted_beside_an_empty_ps_task_1_restores_the_cluster(tmp_path: Path) -> None:
    out = tmp_path / "run"
    r, log = _kill_the_chief_and_ps_task(out, 1)
    assert r.returncode == 0, r.stderr[-3000:] + log[-3000:]
    lives = log.split("serving at")[1:]
    assert len(lives) == 2, log[-3000:]  # restarted once, by the chaos kill
    second = lives[1]
    assert "restored checkpoint" in second and "onto every ps task" in second, second[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    final = read_manifest(latest_checkpoint(str(out / "ckpt")) or "")
    assert final.final and final.global_step == metrics["global_step"], (final, metrics["global_step"])
    # One pass over a9a (32,561 records): the records since the restored checkpoint were trained again, none
    # lost or counted twice.
    assert final.examples == 32561, final


def test_a_chief_restarted_beside_an_empty_ps_task_0_hands_out_no_step_twice(tmp_path: Path) -> None:
    """Its join restores the checkpoint (ps task 0 came back empty): global_step went back to the checkpoint's
    (step=300 was logged by both lives, the chaos report said recovered at 206 after the fault at 303), though ps
    task 0's journal (--state-dir) bounds the steps handed out, as a restore after a ps death uses.

    Each step is logged (--log-every 1): every step the second life logs is past every step the first logged.
    Not that step=300 is logged once: the launcher kills when ps task 0 has handed out 300, which may come before
    the first life logs that step (the push's reply, then the hooks), and the second life goes on past it."""
    out = tmp_path / "run"
    r, log = _kill_the_chief_and_ps_task(out, 0, "--log-every", "1")
    assert r.returncode == 0, r.stderr[-3000:] + log[-3000:]
    lives = log.split("serving at")[1:]
    assert len(lives) == 2 and "restored checkpoint" in lives[1], log[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    for fault in metrics["faults"]:
        assert fault["recovered"] and fault["recovered_at_step"] > fault["at_step"], metrics["faults"]
    first, second = ([int(s) for s in re.findall(r"worker 0: step=(\d+) ", life)] for life in lives)
    assert first and second, log[-3000:]
    # The restore's line says which global_step it set, not only the checkpoint's (which was behind it).
    restored_line = next(ln for ln in log.splitlines() if "restored checkpoint" in ln)
    set_step = int(restored_line.split(", global_step ")[1].split()[0])
    assert set_step >= metrics["faults"][0]["at_step"], restored_line
    # No step value twice: the first life logged none past the step the restore set, the second none up to it.
    assert max(first) <= set_step < min(second), (first[-5:], restored_line, second[:5])
    final = read_manifest(latest_checkpoint(str(out / "ckpt")) or "")
    assert final.final and final.examples == 32561, final


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_chief_restarted_beside_an_empty_ps_task_0_restores_at_a_new_generation(tmp_path: Path, mode: str) -> None:
    """With a second worker still training, the join's restore moves the cluster to a new generation: the worker
    is rewound to the checkpoint as after any ps death. Before, the join restored with no new generation: worker 1
    saw the cluster settled at its old one and died with a TaskUnavailableError traceback (a restart), or had its
    next push admitted over a model rewound to the checkpoint (its records since then never trained)."""
    out = tmp_path / "run"
    r, log0 = _kill_the_chief_and_ps_task(out, 0, "--mode", mode, "--log-every", "1", workers=2)
    log1 = (out / "logs" / "worker-1.log").read_text()
    assert r.returncode == 0, r.stderr[-3000:] + log0[-2000:] + log1[-2000:]
    assert log1.count("serving at") == 1 and "Traceback" not in log1, log1[-3000:]
    assert "cluster restored (generation" in log1, log1[-3000:]
    # Restored once, by whoever held the lease: the chief's join, or worker 1 (the chief then waited for it).
    assert "restored checkpoint" in log0.split("serving at")[2] + log1, log0[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert not [e for e in metrics["restarts"] if e["task"] == "/job:worker/task:1"], metrics["restarts"]
    for fault in metrics["faults"]:
        assert fault["recovered"] and fault["recovered_at_step"] > fault["at_step"], metrics["faults"]
    steps = [int(s) for text in (log0, log1) for s in re.findall(r"worker \d+: step=(\d+) ", text)]
    assert steps and len(steps) == len(set(steps)), sorted(s for s in set(steps) if steps.count(s) > 1)[:20]
    final = read_manifest(latest_checkpoint(str(out / "ckpt")) or "")
    assert final.final and final.examples == 32561, final
