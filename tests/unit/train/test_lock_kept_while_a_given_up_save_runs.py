"""A session whose final checkpoint was given up at --save-timeout (its save still running in its thread:
psflow.checkpoint.bounded_save) keeps the run's checkpoint-directory lock until that save ended, then releases it.

Review of 3f97d23 (the lock's release runs also after an earlier end() raised): FinalCheckpointError from a save
given up at --save-timeout released the lock at once, while the save went on (a ps task's shard write stuck on its
disk, the directory answering); that save may still end and make its checkpoint current, so a later run in the same
process (the Python API) took the directory while this run's save could still switch the pointer over its
checkpoints. Before 3f97d23 the lock stayed for good (the later run refused, also after the save had ended); the same
release ran with --max-failed-saves 0 (the final save's failure logged, not raised).

Real in-process ps services (tests/two_ps_in_process.py), make_session's hooks ended as a session ends them, the
manager's save held by the test until it lets it end."""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from two_ps_in_process import SGD, train_a_step, two_ps_cluster

from psflow.checkpoint.lock import CheckpointDirLock, CheckpointLockedError
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager, FinalCheckpointError
from psflow.cluster import ClusterSpec
from psflow.train.config import TrainConfig
from psflow.train.duties import make_session
from psflow.train.session import MonitoredTrainingSession

pytestmark = pytest.mark.timeout(60)

_CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.mark.parametrize("max_failed_saves", [3, 0], ids=["final_must_succeed", "max_failed_saves_0"])
def test_the_lock_is_kept_until_the_given_up_final_save_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              max_failed_saves: int) -> None:
    client, _ = two_ps_cluster()
    with MonitoredTrainingSession(client, SGD, is_chief=True):  # the cluster initialized and ready
        pass
    ckpt = str(tmp_path / "ckpt")
    config = TrainConfig.flat(train=("unused",), num_features=8, checkpoint_dir=ckpt, save_checkpoints_steps=1000,
                              summary_dir=str(tmp_path / "summaries"), max_failed_saves=max_failed_saves)
    made = make_session(config, _CLUSTER, client, SimpleNamespace(initial_values=None), "worker", 0)  # type: ignore[arg-type]
    lock_file = os.path.join(ckpt, "checkpoint.lock")
    assert os.path.exists(lock_file)  # taken by the session: no launcher holds it
    for hook in made.hooks:
        hook.after_create_session(made)
    assert latest_checkpoint(ckpt) is not None  # the initial checkpoint written: only the final save is given up
    client.config = dataclasses.replace(client.config, save_timeout=0.5)  # (after it: under load it took over 0.5 s)
    train_a_step(client)
    let_go, ended = threading.Event(), threading.Event()

    def stuck(*args: Any, **kwargs: Any) -> Any:  # a ps task's shard write stuck on its disk
        try:
            let_go.wait(30)
        finally:
            ended.set()

    monkeypatch.setattr(CheckpointManager, "save", stuck)
    if max_failed_saves:
        with pytest.raises(FinalCheckpointError, match="given up"):
            made.__exit__(None, None, None)
    else:
        made.__exit__(None, None, None)  # logged, not raised
    try:
        assert not ended.is_set()
        assert os.path.exists(lock_file)  # before: released while the save ran
        with pytest.raises(CheckpointLockedError):
            CheckpointDirLock(ckpt, "the-next-run").acquire()
    finally:
        let_go.set()
    _until(lambda: not os.path.exists(lock_file), "the lock released once the given-up save ended")
    CheckpointDirLock(ckpt, "the-next-run").acquire()
