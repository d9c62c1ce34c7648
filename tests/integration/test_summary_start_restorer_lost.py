"""A restore within the run whose restorer is lost as the cluster settles still gets its SessionLog START.

A real run (--ps 2 --workers 2, --chaos kill:ps:1@step=300, --restart-policy on-failure, a 2 s lease): the chief
lease's holder restores the newest checkpoint onto every ps task and is SIGKILLed right after, before its hooks hear
of it (tests/integration/restorer_lost/sitecustomize.py), so no worker holds the lease as the cluster settles. Before,
the worker that took the lease next (the other one, or the restarted one) wrote no START: TensorBoard kept train/loss
between the checkpoint's step and the restore (220..300 past ckpt-000000211), points of a model discarded. Now the
first holder after the restore writes it, at the checkpoint's step, naming the restore's generation; read back with
TensorBoard's EventAccumulator.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
from support import A9A, REPO, run_bounded

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

_RESTORED = re.compile(r"restored checkpoint \S+ \(step (\d+)\) onto every ps task; generation (\d+), global_step (\d+)")


def test_the_start_of_a_restore_whose_restorer_was_lost(tmp_path: Path) -> None:
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    loader = pytest.importorskip("tensorboard.backend.event_processing.event_file_loader")
    out, summaries, died = tmp_path / "run", tmp_path / "summaries", tmp_path / "restorer-died"
    env = dict(os.environ, PSFLOW_TEST_RESTORER_DIES=str(died), PYTHONPATH=os.pathsep.join(
        [str(REPO), str(Path(__file__).parent / "restorer_lost"), *filter(None, [os.environ.get("PYTHONPATH")])]))
    r = run_bounded([sys.executable, "-m", "psflow", "train", "--train", str(A9A), "--num-features", "124",
                     "--ps", "2", "--workers", "2", "--batch-size", "64", "--epochs", "3", "--max-steps", "1500",
                     "--checkpoint-dir", str(tmp_path / "ckpt"), "--save-checkpoints-steps", "200",
                     "--summary-dir", str(summaries), "--save-summaries-steps", "10", "--lease-ttl", "2",
                     "--restart-policy", "on-failure", "--chaos", "kill:ps:1@step=300",
                     "--output", str(out), "--no-status", "--quiet"], timeout=400, env=env, cwd=REPO)
    assert r.returncode == 0, r.stderr[-3000:]
    assert died.exists()  # the restorer was lost once its restore was done
    logs = "".join(p.read_text() for p in sorted((out / "logs").glob("worker-*.log")))
    (restored,) = _RESTORED.findall(logs)
    checkpoint_step, generation, went_on_from = (int(x) for x in restored)

    events = [e for p in sorted(summaries.iterdir()) for e in loader.EventFileLoader(str(p)).Load()]
    starts = [(e.step, e.session_log.msg) for e in events if e.HasField("session_log")]
    assert starts == [(checkpoint_step + 1, f"psflow restore at generation {generation}")]
    acc = accumulator.EventAccumulator(str(summaries))
    acc.Reload()
    steps = [e.step for e in acc.Scalars("train/loss")]
    assert not [s for s in steps if checkpoint_step < s <= went_on_from], steps  # the discarded model's: dropped
    assert [s for s in steps if s <= checkpoint_step] and [s for s in steps if s > went_on_from], steps
