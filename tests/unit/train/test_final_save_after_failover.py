"""The final checkpoint of a replicated cluster survives a primary gone silent at its pointer switch
(psflow/train/hooks.py ``CheckpointSaverHook.end``, psflow/checkpoint/publish_checks.py).

A save asks every ps task's ``Stats`` under the directory's mutex just before its pointer switch
(``check_no_restore_since``), each within ``STATS_TIMEOUT`` (5 s), and follows a failed shard to its primary once,
without waiting (a backup is promoted there only where the primary is provably gone). With ``--ps-replicas 1`` a
primary that goes silent exactly then (SIGSTOP, a host cut off, a process dying) is not gone yet: the save fails
as unreachable. A periodic save waits for the next period; the final one has none, and before this the run failed
with ``FinalCheckpointError`` although the shard's state survived on the backup promoted moments later and
nothing was restored. Now the final save, where its check could not ask a replicated shard, waits (within its own
``--save-timeout``) for that shard's routing to settle and saves once more; it fails only where that fails too.

In-process members (tests/replica_shard.py: each a real ParameterService with its ShardReplication); the primary
is cut off (every call to it fails UNAVAILABLE, as to a host gone) as the check begins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from failed_over_shard import BACKUP, routed_client, trained
from replica_shard import PRIMARY, InProcessShard
from two_ps_in_process import SGD, two_ps_cluster

from psflow.checkpoint import bounded_save, save
from psflow.checkpoint.manifest import read_manifest
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager, FinalCheckpointError
from psflow.checkpoint.variables import read_variables
from psflow.ps.client import ParameterClient
from psflow.rpc.api import TaskUnavailableError
from psflow.train.hooks import CheckpointSaverHook

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def client(make_shard: Callable[..., InProcessShard], monkeypatch: pytest.MonkeyPatch) -> Iterator[ParameterClient]:
    """A chief's client of shard 0 (ps:0 primary, ps_backup:0 its backup, 5 pushes applied, ready), failover
    after 0.3 s of silence; the save's calls on it (its members are reached in process)."""
    shard = trained(make_shard, ready=True)
    made = routed_client(shard)
    made.shard = shard  # type: ignore[attr-defined]
    monkeypatch.setattr(bounded_save, "save_client", lambda c: c)
    yield made
    made.close()


def _silent_at_the_check(monkeypatch: pytest.MonkeyPatch, shard: InProcessShard, members: set[str],
                         times: int = 1) -> list[int]:
    """The first ``times`` checks at a pointer switch find ``members`` cut off (cut as the check begins); returns
    the list the checks append to."""
    real = save.check_no_restore_since
    checks: list[int] = []

    def cut_first(c: Any, replies: Any, path: str) -> None:
        checks.append(len(checks))
        if len(checks) <= times:
            shard.cut.update(members)
        real(c, replies, path)

    monkeypatch.setattr(save, "check_no_restore_since", cut_first)
    return checks


def _hook(directory: Path) -> CheckpointSaverHook:
    return CheckpointSaverHook(CheckpointManager(str(directory), run_id="run-a"), save_steps=100)


def test_the_final_save_follows_the_failover_of_a_primary_silent_at_its_check(
        client: ParameterClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shard: InProcessShard = client.shard  # type: ignore[attr-defined]
    checks = _silent_at_the_check(monkeypatch, shard, {PRIMARY})
    hook = _hook(tmp_path / "ckpt")
    hook.end(SimpleNamespace(client=client))  # type: ignore[arg-type]  # before: FinalCheckpointError
    latest = latest_checkpoint(str(tmp_path / "ckpt"))
    assert latest is not None and len(checks) == 2, (latest, checks)
    manifest = read_manifest(latest)
    assert manifest.final and manifest.global_step == 5, manifest
    assert client.channels[0].task == BACKUP  # the promoted backup saved it
    assert hook.manager.saves_failed == 1  # the first attempt, counted as any failed save
    saved = read_variables(latest)
    backup_store = shard.services[BACKUP].store
    for name in ("w", "b"):
        np.testing.assert_array_equal(saved[name], backup_store.get(f"{name}/part_0").value)


def test_the_final_save_fails_where_no_member_of_the_shard_can_serve_it(
        client: ParameterClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every replica silent: the routing never settles within the save's deadline; the run fails, naming the
    task that could not be asked."""
    shard: InProcessShard = client.shard  # type: ignore[attr-defined]
    client.config = replace(client.config, save_timeout=8.0)  # (the wait for the routing: within it)
    _silent_at_the_check(monkeypatch, shard, {PRIMARY, BACKUP})
    unsettled = (r"/job:ps/task:0 could not be asked.*routing did not settle within [0-9.]+ s \(half of what was "
                 r"left of the final save's --save-timeout\): .*no member of ps shard 0 can serve it")
    with pytest.raises(FinalCheckpointError, match=unsettled):
        _hook(tmp_path / "ckpt").end(SimpleNamespace(client=client))  # type: ignore[arg-type]
    assert latest_checkpoint(str(tmp_path / "ckpt")) is None


def test_the_final_save_fails_where_its_second_check_fails_too(
        client: ParameterClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One retry: the promoted backup silent at the second save's check too fails the run."""
    shard: InProcessShard = client.shard  # type: ignore[attr-defined]
    real = save.check_no_restore_since
    checks: list[str] = []

    def cut(c: Any, replies: Any, path: str) -> None:
        checks.append(c.channels[0].task)
        shard.cut.add(c.channels[0].task)  # whichever member is the primary now
        real(c, replies, path)

    monkeypatch.setattr(save, "check_no_restore_since", cut)
    with pytest.raises(FinalCheckpointError, match=r"could not be asked"):
        _hook(tmp_path / "ckpt").end(SimpleNamespace(client=client))  # type: ignore[arg-type]
    assert checks == [PRIMARY, BACKUP]
    assert latest_checkpoint(str(tmp_path / "ckpt")) is None


def test_a_periodic_save_is_not_retried(client: ParameterClient, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A periodic save whose check could not ask a task fails as before (the next period saves)."""
    shard: InProcessShard = client.shard  # type: ignore[attr-defined]
    checks = _silent_at_the_check(monkeypatch, shard, {PRIMARY})
    manager = CheckpointManager(str(tmp_path / "ckpt"), run_id="run-a")
    with pytest.raises(save.CheckpointError, match=r"/job:ps/task:0 could not be asked"):
        manager.save(client)
    assert len(checks) == 1 and latest_checkpoint(str(tmp_path / "ckpt")) is None


class _Gone:
    """A ps task's channel once its host is gone: every call fails UNAVAILABLE."""

    def __init__(self, task: str) -> None:
        self.task = task

    def call_async(self, method: str, meta: Any = None, arrays: Any = None, *, timeout: float | None = None) -> Any:
        task = self.task

        class _Failed:
            def result(self) -> Any:
                raise TaskUnavailableError(f"{task} is gone (test)")
        return _Failed()

    def call(self, method: str, meta: Any = None, arrays: Any = None, *, timeout: float | None = None) -> Any:
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def close(self) -> None:
        """Nothing to close."""


def test_without_replicas_the_final_save_whose_check_could_not_ask_a_task_fails_at_once(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No backup holds an unreplicated task's state: nothing to wait for (a restore is coming), one save only."""
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True)
    real = save.check_no_restore_since
    checks: list[int] = []

    def gone_at_the_check(c: Any, replies: Any, path: str) -> None:
        checks.append(1)
        c.channels[1] = _Gone("/job:ps/task:1")
        real(c, replies, path)

    monkeypatch.setattr(save, "check_no_restore_since", gone_at_the_check)
    with pytest.raises(FinalCheckpointError, match=r"/job:ps/task:1 could not be asked .*gone \(test\)"):
        _hook(tmp_path / "ckpt").end(SimpleNamespace(client=client))  # type: ignore[arg-type]
    assert checks == [1] and latest_checkpoint(str(tmp_path / "ckpt")) is None


@pytest.mark.parametrize("limit, failed_before", [(1, 0), (3, 2)])
def test_the_retry_comes_before_max_failed_saves(client: ParameterClient, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch, limit: int, failed_before: int) -> None:
    """The first attempt is the ``--max-failed-saves``-th failure in a row (``--max-failed-saves 1``, or periodic
    saves failed just before): the final save still waits for the routing and saves once more, rather than end the
    run (CheckpointSavesFailedError) with the final model lost although the backup holds it. Its directory is gone,
    counted once; the retry's success resets the count."""
    shard: InProcessShard = client.shard  # type: ignore[attr-defined]
    checks = _silent_at_the_check(monkeypatch, shard, {PRIMARY})
    directory = tmp_path / "ckpt"
    hook = CheckpointSaverHook(CheckpointManager(str(directory), run_id="run-a", max_failed_saves=limit),
                               save_steps=100)
    hook.manager.failed_in_a_row = failed_before
    hook.end(SimpleNamespace(client=client))  # type: ignore[arg-type]  # before: CheckpointSavesFailedError
    latest = latest_checkpoint(str(directory))
    assert latest is not None and len(checks) == 2, (latest, checks)
    assert read_manifest(latest).final and read_manifest(latest).global_step == 5
    assert hook.manager.saves_failed == 1 and hook.manager.failed_in_a_row == 0
    saves = sorted(p.name for p in directory.iterdir() if p.name.startswith("ckpt-"))
    assert saves == [Path(latest).name], saves  # the first attempt's directory removed, never reused


def test_a_retry_that_fails_too_is_the_max_failed_saves_th(client: ParameterClient, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """``--max-failed-saves 1``, both attempts unable to ask: the run stops as that limit says."""
    shard: InProcessShard = client.shard  # type: ignore[attr-defined]
    real = save.check_no_restore_since

    def cut(c: Any, replies: Any, path: str) -> None:
        shard.cut.add(c.channels[0].task)
        real(c, replies, path)

    monkeypatch.setattr(save, "check_no_restore_since", cut)
    hook = CheckpointSaverHook(CheckpointManager(str(tmp_path / "ckpt"), run_id="run-a", max_failed_saves=1),
                               save_steps=100)
    with pytest.raises(save.CheckpointSavesFailedError, match=r"2 checkpoint saves in a row .*could not be asked"):
        hook.end(SimpleNamespace(client=client))  # type: ignore[arg-type]
    assert hook.manager.saves_failed == 2 and latest_checkpoint(str(tmp_path / "ckpt")) is None


def test_at_max_failed_saves_routing_that_never_settles_stops_the_run_as_that_limit_says(
        client: ParameterClient, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--max-failed-saves 1``, every replica silent: CheckpointSavesFailedError (the limit's), naming the wait."""
    shard: InProcessShard = client.shard  # type: ignore[attr-defined]
    client.config = replace(client.config, save_timeout=8.0)
    _silent_at_the_check(monkeypatch, shard, {PRIMARY, BACKUP})
    hook = CheckpointSaverHook(CheckpointManager(str(tmp_path / "ckpt"), run_id="run-a", max_failed_saves=1),
                               save_steps=100)
    with pytest.raises(save.CheckpointSavesFailedError,
                       match=r"--max-failed-saves 1.*could not be asked.*routing did not settle within"):
        hook.end(SimpleNamespace(client=client))  # type: ignore[arg-type]
    assert hook.manager.saves_failed == 1 and latest_checkpoint(str(tmp_path / "ckpt")) is None
