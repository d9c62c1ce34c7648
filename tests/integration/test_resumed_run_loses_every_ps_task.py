"""A resumed run that loses the chief and every ps task before its first checkpoint hands out no step value twice.

The second ``psflow train`` over the same ``--checkpoint-dir`` restores the first run's checkpoint (step ~400); a
step later, before it writes one of its own, the chief and both ps tasks are killed together and restarted. The restarted
chief's join finds every ps task empty. It took that for a fresh resume because the newest checkpoint was the
earlier run's (:func:`psflow.train.within_run.lost_within_run` counted the loss as within the run only after a
checkpoint of its own): it restored at the checkpoint's step and generation 0, so the values handed out since
were handed out again ("recovered at global_step 403" after a kill at 405), and a worker still at
generation 0 died with a TaskUnavailableError traceback. ps task 0's global_step journal now records the run that
handed its values out: the join goes on past its bound at a new generation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import A9A, run_cli

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

COMMON = ("--train", str(A9A), "--num-features", "124", "--ps", "2", "--workers", "3", "--batch-size", "32",
          "--epochs", "1", "--no-status", "--save-checkpoints-steps", "100", "--log-every", "1")


def test_a_resumed_run_that_loses_the_chief_and_every_ps_task_hands_out_no_step_twice(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first = run_cli("train", *COMMON, "--max-steps", "400", "--output", str(tmp_path / "a"),
                    "--checkpoint-dir", str(ckpt), timeout=240)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = read_manifest(latest_checkpoint(str(ckpt)) or "").global_step  # 400, or a step or two past it
    kill = f"@step={resumed + 1}"  # before the resumed run's first checkpoint (step 500)
    out = tmp_path / "b"
    r = run_cli("train", *COMMON, "--output", str(out), "--checkpoint-dir", str(ckpt),
                "--restart-policy", "on-failure", "--max-restarts", "1", "--lease-ttl", "2", "--connect-timeout", "60",
                "--chaos", f"kill:chief{kill}", "--chaos", f"kill:ps:0{kill}", "--chaos", f"kill:ps:1{kill}",
                timeout=360)
    logs = {w: (out / "logs" / f"worker-{w}.log").read_text() for w in range(3)}
    tails = "".join(f"\n--- worker {w}\n{text[-1500:]}" for w, text in logs.items())
    assert r.returncode == 0, r.stderr[-3000:] + tails
    for w in (1, 2):
        assert "Traceback" not in logs[w], logs[w][-3000:]
    # Restored once, at a new generation, by whoever held the lease: the restarted chief's join, or a worker (the
    # chief then waited for it); never at generation 0 and the checkpoint's step by the join ("... at step N").
    after = logs[0].split("serving at")[2] + logs[1] + logs[2]
    assert "onto every ps task" in after, after[-3000:]
    assert not re.search(r"restored checkpoint \S+ at step \d+$", after, re.M), after[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["faults"], metrics
    for fault in metrics["faults"]:
        assert fault["recovered"] and fault["recovered_at_step"] > fault["at_step"], metrics["faults"]
    steps = [int(s) for text in logs.values() for s in re.findall(r"worker \d+: step=(\d+) ", text)]
    assert steps and len(steps) == len(set(steps)), sorted(s for s in set(steps) if steps.count(s) > 1)[:20]
    assert min(steps) > resumed, min(steps)  # the resumed run's own values only
    final = read_manifest(latest_checkpoint(str(ckpt)) or "")
    assert final.final and final.examples == 32561, final
