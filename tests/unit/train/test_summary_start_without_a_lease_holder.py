"""A restore within the run whose cluster settled while no worker held the chief lease (the holder that restored was
lost right after, or its lease lapsed in its own view while the restore ran) was told to every worker's LeaderOnlyHook
while none led: each passed it over, and the worker that took the lease later wrote no SessionLog START
(SummarySaverHook.after_create_session wrote one only at its session's start, for its own join's restore). TensorBoard
then kept the points of the discarded model, past the restored checkpoint's step, beside the restored model's. Seen
on a real run (tests/integration/test_summary_start_restorer_lost.py).

Rule: one START per restore within the run, by the first worker to hold the duties after it, before any point; it
names the restore's generation, so a later holder writes none (a second one would drop the points since the restore).

Hooks of workers A, B and C (C joins after the restore: it never heard of it) on a real in-process cluster restored by
ClusterRecovery, the lease set by the test; read back with TensorBoard's EventAccumulator."""

from __future__ import annotations

import errno
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from summary_holders import lease_of, loss_steps, summary_holders, worker_session
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager, FinalCheckpointError
from psflow.cluster import ClusterSpec
from psflow.coord import Lease
from psflow.rpc.api import TaskUnavailableError
from psflow.train.config import TrainConfig
from psflow.train.deferred_end import DeferredEnd
from psflow.train.duties import make_session
from psflow.train.hook_api import RunContext, RunValues
from psflow.train.hooks import CheckpointSaverHook, SummarySaverHook
from psflow.train.leader_hooks import LeaderOnlyHook
from psflow.train.recovery import ClusterRecovery
from psflow.train.session import MonitoredTrainingSession
from psflow.train.summary import SummaryWriter

pytestmark = pytest.mark.timeout(60)

_NAMES = ("a", "b", "c")


class _Lease:
    """The chief lease: held by one candidate, or by none (``holder`` None: in transition)."""

    def __init__(self) -> None:
        self.holder: str | None = "a"

    def for_(self, name: str) -> Any:
        state = self

        class _Leadership:
            candidate = name

            def lease(self) -> Lease | None:
                return lease_of(name) if state.holder == name else None

        return _Leadership()


class _Run:
    def __init__(self, tmp_path: Path) -> None:
        self.client, self.services = two_ps_cluster()
        self.ckpt = str(tmp_path / "ckpt")
        with MonitoredTrainingSession(self.client, SGD, is_chief=True):  # the cluster initialized and ready
            pass
        self.logdir = tmp_path / "summaries"
        self.lease = _Lease()
        self.writers, self.hooks, self.sessions = summary_holders(self.client, self.logdir, _NAMES, self.lease.for_,
                                                                  checkpoint_dir=self.ckpt)
        self.running = ["a", "b"]  # C starts after the restore
        for name in self.running:
            self.hooks[name].after_create_session(self.sessions[name])

    def steps(self, name: str, count: int) -> None:
        for _ in range(count):
            train_a_step(self.client)
            step = self.client.global_step()
            for other in self.running:  # every worker's hooks run; only the holder's write
                context = RunContext(session=self.sessions[other], local_step=0)  # type: ignore[arg-type]
                self.hooks[other].before_run(context)
                if other == name:
                    self.hooks[other].after_run(context, RunValues(step=step, loss=0.5, examples=1))

    def save(self) -> None:
        CheckpointManager(self.ckpt).save(self.client)

    def restore(self, restorer: str) -> None:
        """ps task 1 lost and back empty; ``restorer`` (its lease) restores; the hooks of every worker running hear
        of it as the cluster settles, whoever holds the lease then."""
        restart_ps(self.client, self.services, 1)

        def told(checkpoint: str | None, step: int | None) -> None:
            for name in self.running:
                self.hooks[name].after_restore(self.sessions[name], checkpoint, step)

        recovery = ClusterRecovery(self.client, SGD, checkpoint_dir=self.ckpt, leader=lambda: lease_of(restorer),
                                   timeout=30.0, generation=self.client.ps_stats().generation, on_restored=told)
        assert recovery.wait()[0]

    def start(self, name: str) -> None:
        self.running.append(name)
        self.hooks[name].after_create_session(self.sessions[name])

    def curve(self) -> list[int]:
        for writer in self.writers.values():
            writer.close()
        return loss_steps(self.logdir)


@pytest.mark.parametrize("taker", ["a", "b", "c"], ids=["holder_again", "other_worker", "worker_joined_since"])
def test_a_restore_no_one_held_the_lease_through_gets_its_start_from_the_next_holder(tmp_path: Path,
                                                                                     taker: str) -> None:
    run = _Run(tmp_path)
    run.steps("a", 2)
    run.save()                 # the checkpoint of step 2
    run.steps("a", 3)          # 3..5 by A: lost with ps task 1
    run.lease.holder = None    # A restores, then is lost (or its lease lapses): nobody leads as the cluster settles
    run.restore("a")
    run.start("c")             # C starts (a restarted worker): it never heard of the restore
    run.lease.holder = taker   # the lease taken again
    run.steps(taker, 2)        # 6, 7: the restored model
    assert run.curve() == [1, 2, 6, 7]


@pytest.mark.parametrize("taker", ["b", "c"], ids=["other_worker", "worker_joined_since"])
def test_the_start_is_written_once_per_restore(tmp_path: Path, taker: str) -> None:
    run = _Run(tmp_path)
    run.steps("a", 2)
    run.save()
    run.steps("a", 3)          # 3..5: lost
    run.restore("a")           # A leads: its START at 3
    run.steps("a", 2)          # 6, 7 by A: the restored model
    run.start("c")
    run.lease.holder = taker   # a worker taking the duties after A writes no second START
    run.steps(taker, 2)        # 8, 9
    assert run.curve() == [1, 2, 6, 7, 8, 9]


def test_a_later_restore_nobody_led_through_is_marked_too(tmp_path: Path) -> None:
    run = _Run(tmp_path)
    run.steps("a", 2)
    run.save()
    run.steps("a", 1)          # 3: lost with the first restore
    run.restore("a")           # A leads: START at 3
    run.steps("a", 2)          # 4, 5
    run.save()                 # the checkpoint of step 5
    run.steps("a", 2)          # 6, 7: lost with the second restore
    run.lease.holder = None
    run.restore("a")           # settles with nobody leading
    run.lease.holder = "b"
    run.steps("b", 2)          # 8, 9
    assert run.curve() == [1, 2, 4, 5, 8, 9]


def test_a_worker_first_holding_the_duties_at_its_end_starts_at_the_restored_step(tmp_path: Path) -> None:
    """The first worker to hold the duties after the restore takes them at its session's end (it took the lease while
    it lingered, or its last steps ran before the holder's lease lapsed): its duties' end() calls are its first as the
    holder. In make_session's order the checkpoint saver's goes first: it writes the final checkpoint, and the START,
    taken from the newest checkpoint, went to that one's step, past the discarded model's points. It belongs at the
    restored checkpoint's step, which the ps tasks name (the summary hook once went first for it: no longer needed)."""
    run = _Run(tmp_path)
    config = TrainConfig.flat(train=("unused",), num_features=8, checkpoint_dir=run.ckpt, summary_dir=str(run.logdir),
                              save_summaries_steps=1, save_checkpoints_steps=1000)
    leadership = run.lease.for_("d")
    leadership.confirmed_lease = leadership.lease
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
    made = make_session(config, cluster, run.client, SimpleNamespace(initial_values=None), "worker", 1,
                        leadership=leadership)
    duties = [h.inner if isinstance(h, DeferredEnd) else h for h in made.hooks]  # in its order
    duties = [h for h in duties if isinstance(h, LeaderOnlyHook)]
    kinds = [type(h.inner) for h in duties]
    assert kinds.index(CheckpointSaverHook) < kinds.index(SummarySaverHook)
    session = worker_session(run.client, run.ckpt)
    for hook in duties:
        hook.after_create_session(session)
    run.steps("a", 2)
    run.save()                 # the checkpoint of step 2
    run.steps("a", 3)          # 3..5 by A: lost with ps task 1
    run.lease.holder = None
    run.restore("a")           # A restores, then is lost: nobody leads as the cluster settles
    run.steps("b", 2)          # 6, 7: the restored model, by workers not holding the duties
    run.lease.holder = "d"     # taken by D as its session ends
    session.global_step = run.client.global_step()
    for hook in duties:
        hook.end(session)
    assert run.curve() == [1, 2, 7]


def test_a_summary_end_that_fails_does_not_skip_the_final_checkpoint(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A session stops at the first end() that raises: a summary write failing at the end (the summary disk full; the
    checkpoint directory may be elsewhere) skipped the final checkpoint while the summary hook went first among the
    duties. The saver goes first (the test above): the final checkpoint is written, then the error raised."""
    run = _Run(tmp_path)
    config = TrainConfig.flat(train=("unused",), num_features=8, checkpoint_dir=run.ckpt, summary_dir=str(run.logdir),
                              save_summaries_steps=1000, save_checkpoints_steps=1000)
    run.lease.holder = "d"
    leadership = run.lease.for_("d")
    leadership.confirmed_lease = leadership.lease
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
    made = make_session(config, cluster, run.client, SimpleNamespace(initial_values=None), "worker", 1,
                        leadership=leadership)
    session = worker_session(run.client, run.ckpt)
    for hook in made.hooks:
        hook.after_create_session(session)
    run.running = []  # the other workers' hooks stay out of it
    run.steps("d", 3)
    session.global_step = run.client.global_step()

    def full(writer: SummaryWriter, event: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", writer.path)

    monkeypatch.setattr(SummaryWriter, "_append", full)
    with pytest.raises(OSError, match="No space left"):
        made.__exit__(None, None, None)  # every hook's end(), in order, as a session ends
    latest = latest_checkpoint(run.ckpt)
    assert latest is not None and read_manifest(latest).global_step == 3


# ---- the restored checkpoint's step, read from the ps tasks ---------------------------------------------------------
# The START's step was the newest checkpoint's in the directory, taken for the one the restore read: any save between
# the restore and the START (a holder's periodic or final checkpoint) put it past the discarded points, which stayed.
# The restore's LoadShard now tells every ps task the checkpoint and its step, and their Stats say it
# (tests/unit/ps/test_restored_from.py).

def test_the_start_is_at_the_restored_step_though_a_newer_checkpoint_was_saved_since(tmp_path: Path) -> None:
    run = _Run(tmp_path)
    run.steps("a", 2)
    run.save()                 # the checkpoint of step 2
    run.steps("a", 3)          # 3..5 by A: lost with ps task 1
    run.lease.holder = None    # A restores, then is lost: nobody leads as the cluster settles
    run.restore("a")
    run.steps("b", 2)          # 6, 7: the restored model
    run.save()                 # the checkpoint of step 7, saved before any worker wrote the restore's START
    run.lease.holder = "b"
    run.steps("b", 2)          # 8, 9
    assert run.curve() == [1, 2, 8, 9]  # before: [1, 2, 3, 4, 5, 8, 9] (the START at 8, after the newer checkpoint)


def test_a_worker_that_did_not_restore_hears_the_restored_checkpoint_not_the_newest(tmp_path: Path) -> None:
    """ClusterRecovery tells the session's hooks (the START, where it holds the duties) which checkpoint the cluster
    was restored from; a worker that did not restore it took the newest in the directory, a checkpoint its holder
    saved after the restore (before this worker saw the cluster settled) included."""
    run = _Run(tmp_path)
    run.steps("a", 2)
    run.save()
    restored = latest_checkpoint(run.ckpt)
    run.steps("a", 3)
    heard: list[tuple[str | None, int | None]] = []
    other = ClusterRecovery(run.client, SGD, checkpoint_dir=run.ckpt, leader=lambda: None, timeout=30.0,
                            generation=run.client.ps_stats().generation,
                            on_restored=lambda checkpoint, step: heard.append((checkpoint, step)))
    run.restore("a")
    run.steps("a", 2)          # 6, 7 by A
    run.save()                 # the checkpoint of step 7
    assert other.wait()[0]
    assert heard == [(restored, 2)]  # before: the checkpoint of step 7


def test_a_start_written_while_ps_task_0_could_not_be_read_names_its_restore(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """ps task 0's Stats unreadable as the holder wrote the restore's START: it named no generation, and the next
    holder, not finding the restore's START, wrote a second one at the restored step, which dropped every point the
    first holder wrote since the restore. The generation is every ready task's after a restore: ps task 1 says it."""
    run = _Run(tmp_path)
    run.steps("a", 2)
    run.save()
    run.steps("a", 3)          # 3..5: lost
    blocked: set[int] = set()
    real_stats = run.client.ps_stats

    def ps_stats(task: int | None = None, **kwargs: Any) -> Any:
        if (run.client.step_task if task is None else task) in blocked:
            raise TaskUnavailableError("/job:ps/task:0: unreachable (the test)")
        return real_stats(task, **kwargs)

    monkeypatch.setattr(run.client, "ps_stats", ps_stats)
    hook = run.hooks["a"]
    real_after_restore = hook.after_restore

    def after_restore(session: Any, checkpoint: str | None, step: int | None) -> None:
        blocked.add(0)
        try:
            real_after_restore(session, checkpoint, step)
        finally:
            blocked.clear()

    monkeypatch.setattr(hook, "after_restore", after_restore)
    run.restore("a")           # A leads: its START at 3, ps task 0 unreadable meanwhile
    run.steps("a", 2)          # 6, 7 by A: the restored model
    run.lease.holder = "b"
    run.steps("b", 2)          # 8, 9
    assert run.curve() == [1, 2, 6, 7, 8, 9]  # before: [1, 2, 8, 9] (B's second START dropped 6, 7)


def test_a_final_checkpoint_that_fails_does_not_skip_the_summary_s_end(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The saver goes first among the duties, and a session stops at the first end() that raises: a final checkpoint
    that fails (FinalCheckpointError: neither LeaderOnlyHook's guard nor _FailedSaveTolerant catches it) skipped the
    summary hook's end(): the START a worker first holding the duties at its end owes (the discarded model's points
    3..5 stayed, the restored model's last point was not written) and the final point. While the summary hook went
    first (5c1548f's DeferredEnd) they were written. They are, then the final checkpoint's error raised."""
    run = _Run(tmp_path)
    config = TrainConfig.flat(train=("unused",), num_features=8, checkpoint_dir=run.ckpt, summary_dir=str(run.logdir),
                              save_summaries_steps=1, save_checkpoints_steps=1000)
    leadership = run.lease.for_("d")
    leadership.confirmed_lease = leadership.lease
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
    made = make_session(config, cluster, run.client, SimpleNamespace(initial_values=None), "worker", 1,
                        leadership=leadership)
    session = worker_session(run.client, run.ckpt)
    for hook in made.hooks:
        hook.after_create_session(session)
    run.steps("a", 2)
    run.save()                 # the checkpoint of step 2
    run.steps("a", 3)          # 3..5 by A: lost with ps task 1
    run.lease.holder = None
    run.restore("a")           # A restores, then is lost: nobody leads as the cluster settles
    run.steps("b", 2)          # 6, 7: the restored model, by workers not holding the duties
    run.lease.holder = "d"     # taken by D as its session ends
    session.global_step = run.client.global_step()

    def unwritable(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error", run.ckpt)

    monkeypatch.setattr(CheckpointManager, "save", unwritable)
    with pytest.raises(FinalCheckpointError, match="Input/output error"):
        made.__exit__(None, None, None)  # every hook's end(), in order, as a session ends
    assert run.curve() == [1, 2, 7]  # before: [1, 2, 3, 4, 5] (neither the START at 2 nor the final point)


def test_a_final_checkpoint_and_a_summary_end_both_failing_raise_the_checkpoint_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Both duties' end() ran; the run fails with the final checkpoint's error (the saver's, first), the summary
    hook's is logged naming it, not lost."""
    run = _Run(tmp_path)
    config = TrainConfig.flat(train=("unused",), num_features=8, checkpoint_dir=run.ckpt, summary_dir=str(run.logdir),
                              save_summaries_steps=1000, save_checkpoints_steps=1000)
    run.lease.holder = "d"
    leadership = run.lease.for_("d")
    leadership.confirmed_lease = leadership.lease
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"], "worker": ["127.0.0.1:3", "127.0.0.1:4"]})
    made = make_session(config, cluster, run.client, SimpleNamespace(initial_values=None), "worker", 1,
                        leadership=leadership)
    session = worker_session(run.client, run.ckpt)
    for hook in made.hooks:
        hook.after_create_session(session)
    run.running = []
    run.steps("d", 3)

    def full(writer: SummaryWriter, event: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", writer.path)

    def unwritable(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EIO, "Input/output error", run.ckpt)

    monkeypatch.setattr(SummaryWriter, "_append", full)
    monkeypatch.setattr(CheckpointManager, "save", unwritable)
    with pytest.raises(FinalCheckpointError, match="Input/output error"):
        made.__exit__(None, None, None)
    assert "chief duty summaries: its end() failed too" in caplog.text and "No space left" in caplog.text
