"""A diverged model (NaN or infinite values on a ps task) is never saved over good checkpoints: the ps task refuses
the shard naming the partition, the save fails and is counted, and rotation deletes nothing. Before, a resumed run
whose learning-rate schedule gave NaN (``exponential_decay`` with a negative ``decay_rate``) saved NaN checkpoints
with ``--save-checkpoints-steps 1 --max-to-keep 2`` and rotated away every good one before its worker saw a NaN loss.
ps services in this process (tests/two_ps_in_process.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from two_ps_in_process import SGD, train_a_step, two_ps_cluster

from psflow.checkpoint.naming import RETIRED_DIR
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.checkpoint.variables import read_variables
from psflow.errors import CheckpointError
from psflow.gradients import DenseGradient
from psflow.train.chief import join_cluster


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_shard_with_non_finite_values_is_refused_and_the_good_checkpoints_are_kept(tmp_path: Path,
                                                                                      bad: float) -> None:
    ckpt = tmp_path / "ckpt"
    client, _ = two_ps_cluster()
    join_cluster(client, SGD, chief=True)
    manager = CheckpointManager(str(ckpt), max_to_keep=1, full_every=1, run_id="run-a")
    train_a_step(client)
    good = manager.save(client).path
    before = {p.name: p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    gradient = np.ones(2, np.float32)
    gradient[1] = bad
    client.push({"bias": DenseGradient(gradient)}, generation=client.ps_stats().generation)  # ps task 1 diverged
    with pytest.raises(CheckpointError, match=r"/job:ps/task:1: refused to save .*bias/part_0 holds 1 non-finite "
                                              r"value \(NaN or infinite\)"):
        manager.save(client)
    assert manager.saves_failed == 1
    assert latest_checkpoint(str(ckpt)) == good
    # nothing written or deleted but the failed save's name's marker (psflow.checkpoint.naming)
    assert {p.name: p.read_bytes() for p in ckpt.rglob("*") if p.is_file() and RETIRED_DIR not in p.parts} == before
    assert [p.name for p in (ckpt / RETIRED_DIR).iterdir()] == ["ckpt-000000002"]
    assert np.isfinite(read_variables(good)["bias"]).all()
