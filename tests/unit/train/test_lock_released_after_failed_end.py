"""A session whose chief duties took the run's checkpoint-directory lock (``psflow server``, or the Python API: no
launcher holds it) releases it at its end also when an end() before the release raised: a final checkpoint that
failed (FinalCheckpointError, raised by RaiseDeferred or by the saver's guard), or a worker resumed after a take-over
(RunTakenOverError, before its duties). The release was the last hook and a session stops at the first end() that
raises, so the lock stayed, naming this process: a later run in the same process (a notebook fixing the disk and
training again) was refused ("in use by run ...: wait for it to end"), and one from another host or container after
this process exited was refused until the file was deleted by hand. The first error is still the one raised; each
duty's end() still runs (the final evaluation too, after a failed final checkpoint).

Real in-process ps services (tests/two_ps_in_process.py), make_session's hooks ended as a session ends them."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from two_ps_in_process import SGD, train_a_step, two_ps_cluster

from psflow.checkpoint.lock import CheckpointDirLock
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager, FinalCheckpointError
from psflow.cluster import ClusterSpec
from psflow.coord import Lease
from psflow.train.config import TrainConfig
from psflow.train.duties import make_session
from psflow.train.session import MonitoredTrainingSession
from psflow.train.taken_over import RunTakenOverError, TakenOverHook

pytestmark = pytest.mark.timeout(60)

_CLUSTER = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
_LEASE = Lease("chief", "/job:worker/task:0", "/job:worker/task:0#1", 7, 10.0, float("inf"))


class _Leadership:
    """The chief lease, held by this worker (LeaderOnlyHook, the saver's fence and TakenOverHook ask it)."""

    candidate = "/job:worker/task:0"

    def lease(self) -> Lease | None:
        return _LEASE

    confirmed_lease = lease


def _ended_with_a_failed_final_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, summaries: bool,
                                          election: bool, evaluation: bool = False) -> tuple[str, list[int]]:
    client, _ = two_ps_cluster()
    with MonitoredTrainingSession(client, SGD, is_chief=True):  # the cluster initialized and ready
        pass
    ckpt = str(tmp_path / "ckpt")
    settings: dict[str, Any] = {"summary_dir": str(tmp_path / "summaries")} if summaries else {}
    if evaluation:
        settings.update(eval=("unused",), eval_at_end=True)
    config = TrainConfig.flat(train=("unused",), num_features=8, checkpoint_dir=ckpt, save_checkpoints_steps=1000,
                              **settings)
    evaluated: list[int] = []
    if evaluation:  # the eval set is not read: the final evaluation is recorded
        monkeypatch.setattr("psflow.train.duties.read_all", lambda *args, **kwargs: None)
        monkeypatch.setattr("psflow.train.ready_eval.evaluate", lambda *args: evaluated.append(1) or {"loss": 0.5})
    made = make_session(config, _CLUSTER, client, SimpleNamespace(initial_values=None), "worker", 0,
                        leadership=_Leadership() if election else None)  # type: ignore[arg-type]
    assert os.path.exists(os.path.join(ckpt, "checkpoint.lock"))  # taken by the session: no launcher holds it
    for hook in made.hooks:
        hook.after_create_session(made)
    for _ in range(3):
        train_a_step(client)

    def unwritable(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error", ckpt)

    monkeypatch.setattr(CheckpointManager, "save", unwritable)
    with pytest.raises(FinalCheckpointError, match="Input/output error"):
        made.__exit__(None, None, None)  # every hook's end(), in order, as a session ends
    return ckpt, evaluated


@pytest.mark.parametrize(("summaries", "election"), [(True, False), (False, False), (True, True), (False, True)],
                         ids=["chief_summaries", "chief", "election_summaries", "election"])
def test_a_failed_final_checkpoint_leaves_the_directory_to_the_next_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, summaries: bool, election: bool) -> None:
    ckpt, _ = _ended_with_a_failed_final_checkpoint(tmp_path, monkeypatch, summaries=summaries, election=election)
    assert not os.path.exists(os.path.join(ckpt, "checkpoint.lock"))
    # before: CheckpointLockedError 'checkpoint directory ... is in use by run ... (pid <this process>)'
    CheckpointDirLock(ckpt, "the-next-run").acquire()


@pytest.mark.parametrize("election", [False, True], ids=["chief", "election"])
def test_the_final_evaluation_runs_after_a_failed_final_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   election: bool) -> None:
    """The final model is evaluated (its metrics logged and written) although its checkpoint failed; the checkpoint's
    error is the one raised."""
    ckpt, evaluated = _ended_with_a_failed_final_checkpoint(tmp_path, monkeypatch, summaries=True, election=election,
                                                            evaluation=True)
    assert evaluated == [1]
    assert not os.path.exists(os.path.join(ckpt, "checkpoint.lock"))


def test_a_worker_stopped_by_a_take_over_releases_the_lock_it_took(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """TakenOverHook stops the duties (RunTakenOverError before any of them runs); the lock this worker took is
    released all the same, and the take-over's error is the one raised."""
    client, _ = two_ps_cluster()
    with MonitoredTrainingSession(client, SGD, is_chief=True):
        pass
    ckpt = str(tmp_path / "ckpt")
    config = TrainConfig.flat(train=("unused",), num_features=8, checkpoint_dir=ckpt, save_checkpoints_steps=1000)
    made = make_session(config, _CLUSTER, client, SimpleNamespace(initial_values=None), "worker", 1,
                        leadership=_Leadership(), take_over=True)  # type: ignore[arg-type]
    saved: list[int] = []
    monkeypatch.setattr(CheckpointManager, "save", lambda *args, **kwargs: saved.append(1))

    def taken_over(hook: TakenOverHook, session: Any) -> None:
        raise RunTakenOverError("/job:worker/task:1: the run was ended without this worker (the test)")

    monkeypatch.setattr(TakenOverHook, "end", taken_over)
    with pytest.raises(RunTakenOverError):
        made.__exit__(None, None, None)
    assert saved == []  # its duties skipped, as before
    assert not os.path.exists(os.path.join(ckpt, "checkpoint.lock"))


def test_a_session_whose_ends_all_succeed_releases_the_lock_last(tmp_path: Path) -> None:
    """Unchanged: after the final checkpoint (which takes the lock again where it was deleted meanwhile)."""
    client, _ = two_ps_cluster()
    with MonitoredTrainingSession(client, SGD, is_chief=True):
        pass
    ckpt = str(tmp_path / "ckpt")
    config = TrainConfig.flat(train=("unused",), num_features=8, checkpoint_dir=ckpt, save_checkpoints_steps=1000,
                              summary_dir=str(tmp_path / "summaries"))
    made = make_session(config, _CLUSTER, client, SimpleNamespace(initial_values=None), "worker", 0)
    for hook in made.hooks:
        hook.after_create_session(made)
    train_a_step(client)
    made.__exit__(None, None, None)
    assert latest_checkpoint(ckpt) is not None
    assert not os.path.exists(os.path.join(ckpt, "checkpoint.lock"))
