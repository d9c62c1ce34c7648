"""A resumed chief's restore at start (generation 0: psflow/train/chief.py, ``_restore_at_join``) waits for a lease
holder's restore only when one began on the tasks: its loads refused by the restore fence (``RestoreRefusedError``),
or its ``SetReady`` (no generation) refused while some task's ``Stats`` show a ``BeginRestore``'s
generation (the refusing task's own may not: it restarted or died since, or refused for another reason).

Any other refusal of the ``SetReady`` (FAILED_PRECONDITION too: a replicated shard's member that is not the primary,
or was deposed, mid-failover, when the router found no other route) was logged as "waiting for that restore", a
restore nobody had begun. It is logged as what it is (the task, the checkpoint, no restore begun), and the chief
waits likewise: it campaigns and, once it holds the chief lease, restores the cluster at a new generation itself (a
refusal that passes heals without a restart of the chief). Real in-process ps services behind in-process channels
(the same dispatch as over a network); one task's ``SetReady`` answers as the test says.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from dead_task import DyingChannel
from two_ps_in_process import SGD, restart_ps, train_a_step, two_ps_cluster

from psflow.checkpoint.save import CheckpointManager
from psflow.coord.api import Lease
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import BeginRestoreRequest
from psflow.ps.replication.deposed import Deposal
from psflow.ps.replication.view import View
from psflow.ps.service import ParameterService
from psflow.rpc.api import Handler, PreconditionFailed, Reply
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel
from psflow.train.chief import JoinResult, join_cluster
from psflow.train.recovery import ClusterRecovery

pytestmark = pytest.mark.timeout(60)


def _not_the_primary(shard: int) -> PreconditionFailed:
    """A replicated shard's backup's refusal of a state call (member.py ``_check_primary``'s words)."""
    view = View(2, f"/job:ps_backup/task:{shard}", (), "backup")
    return PreconditionFailed(f"/job:ps/task:{shard}: not the primary of shard {shard} ({view.role}); "
                              f"{view.describe()}")


def _deposed(shard: int) -> PreconditionFailed:
    """A replicated shard's deposed member's refusal (member.py, deposed.py)."""
    deposal = Deposal(f"/job:ps/task:{shard}", shard)
    deposal.depose(f"/job:ps_backup/task:{shard}", 2)
    return PreconditionFailed(deposal.message())


def _resumed(tmp_path: Path, task: int, set_ready: Callable[[list[ParameterService], Handler], Handler]
             ) -> tuple[ParameterClient, list[ParameterService]]:
    """Trained a step past a checkpoint, then every ps task restarted empty (a new run resuming it: generation 0);
    ps task ``task``'s ``SetReady`` is ``set_ready(services, its real handler)``."""
    client, services = two_ps_cluster()
    join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path))
    train_a_step(client)
    CheckpointManager(str(tmp_path)).save(client)
    restart_ps(client, services, 0)
    restart_ps(client, services, 1)
    handlers = services[task].handlers()
    table: dict[str, Handler] = {**handlers, "SetReady": set_ready(services, handlers["SetReady"])}
    client.channels[task] = InProcessChannel(f"/job:ps/task:{task}", table)
    return client, services


def _refused_by(refusal: Callable[[int], Exception], task: int) -> Callable[[list[ParameterService], Handler], Handler]:
    def set_ready(services: list[ParameterService], real: Handler) -> Handler:
        def refused(frame: Frame) -> Reply:
            raise refusal(task)
        return refused
    return set_ready


class _HeldLease:
    """The chief lease, held by the resumed chief once it campaigns (the only candidate)."""

    def __call__(self) -> Lease:
        return Lease("chief", "/job:worker/task:0", "/job:worker/task:0#1", 1, 60.0, time.monotonic() + 60.0)


def _refused_while(refusing: threading.Event, refusal: Callable[[int], Exception], task: int
                   ) -> Callable[[list[ParameterService], Handler], Handler]:
    """ps task ``task``'s ``SetReady`` answers ``refusal`` while ``refusing`` is set (a failover under way), then
    as its real handler does."""
    def set_ready(services: list[ParameterService], real: Handler) -> Handler:
        def maybe_refused(frame: Frame) -> Reply:
            if refusing.is_set():
                raise refusal(task)
            return real(frame)
        return maybe_refused
    return set_ready


@pytest.mark.parametrize("task", [1, 0], ids=["ps1", "ps0-last"])
@pytest.mark.parametrize("refusal", [_not_the_primary, _deposed], ids=["not-primary", "deposed"])
def test_a_set_ready_refused_with_no_restore_begun_is_said_as_such_and_the_chief_restores_the_cluster_itself(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, refusal: Callable[[int], Exception], task: int) -> None:
    refusing = threading.Event()
    refusing.set()
    client, services = _resumed(tmp_path, task, _refused_while(refusing, refusal, task))
    joined = join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path), run="another run")
    assert joined.restore_pending and joined.restored is None
    assert not services[task].ready and not services[0].ready  # ps task 0 (made ready last) tells workers to wait
    said = [r.getMessage() for r in caplog.records if "refused to become ready" in r.getMessage()]
    assert len(said) == 1 and f"/job:ps/task:{task}" in said[0] and str(tmp_path) in said[0], said
    assert "no restore has begun" in said[0] and "waiting for that restore" not in caplog.text
    refusing.clear()  # the failover settled: the chief, holding the lease, restores at a new generation itself
    chief = ClusterRecovery(client, SGD, checkpoint_dir=str(tmp_path), leader=_HeldLease(), timeout=30.0,
                            generation=joined.generation)
    chief.await_restore(None)
    assert chief.generation is not None and chief.generation > 0 and all(s.ready for s in services)


def test_a_set_ready_refused_because_a_holders_restore_began_waits_for_that_restore(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The contrast: a lease holder's BeginRestore reached every task after the chief's loads, so ps task 1's own
    restore gate refuses the SetReady (FAILED_PRECONDITION, no fencing token): the chief waits for that restore."""
    def holder_begins_first(services: list[ParameterService], real: Handler) -> Handler:
        def set_ready(frame: Frame) -> Reply:
            begin = BeginRestoreRequest(5).to_frame()
            for service in services:
                service.handlers()["BeginRestore"](begin)
            return real(frame)
        return set_ready
    client, services = _resumed(tmp_path, 1, holder_begins_first)
    joined = join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path), run="another run")
    assert joined.restore_pending and joined.restored is None and not any(s.ready for s in services)
    assert "waiting for that restore" in caplog.text


class _StatsDead(DyingChannel):
    """ps task 1 died right after it refused the SetReady: its Stats fail as to a dead process's address."""

    def dies(self, method: str) -> bool:
        return method == "Stats"


def _holders_restore_began(on: tuple[int, ...], then: Callable[[list[ParameterService]], None] | None = None,
                           refusal: Callable[[int], Exception] | None = None
                           ) -> Callable[[list[ParameterService], Handler], Handler]:
    """ps task 1's SetReady: a lease holder's real BeginRestore reaches the tasks ``on`` first; then ps task 1
    answers with ``refusal`` (None: its own restore gate's), and ``then(services)`` runs before the chief reads
    anything more."""
    def set_ready(services: list[ParameterService], real: Handler) -> Handler:
        def refused(frame: Frame) -> Reply:
            begin = BeginRestoreRequest(5).to_frame()
            for task in on:
                services[task].handlers()["BeginRestore"](begin)
            try:
                if refusal is not None:
                    raise refusal(1)
                return real(frame)
            finally:
                if then is not None:
                    then(services)
        return refused
    return set_ready


def _waits(joined: JoinResult, caplog: pytest.LogCaptureFixture) -> None:
    assert joined.restore_pending and joined.restored is None
    assert "waiting for that restore" in caplog.text


def test_a_set_ready_refused_by_a_restore_whose_task_restarted_before_its_stats_waits_for_that_restore(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The holder's BeginRestore reached both tasks; ps task 1's real gate refused the chief's SetReady, then ps task
    1 restarted (empty, generation 0) before the chief read its Stats. A restore did begin (ps task 0 shows its
    generation; the holder restores the restarted task too): the chief waits, it does not fail saying no restore
    began there."""
    client: ParameterClient | None = None

    def restarted(services: list[ParameterService]) -> None:
        assert client is not None
        restart_ps(client, services, 1)
    client, services = _resumed(tmp_path, 1, _holders_restore_began((0, 1), restarted))
    _waits(join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path), run="another run"), caplog)
    assert services[0].gate.restoring and not services[0].ready


def test_a_set_ready_refused_by_a_restore_whose_task_died_before_its_stats_waits_for_that_restore(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """As above, ps task 1 unreachable after its refusal (its Stats fail): ps task 0's Stats show the restore."""
    client: ParameterClient | None = None

    def died(services: list[ParameterService]) -> None:
        assert client is not None
        client.channels[1] = _StatsDead(client.channels[1])
    client, services = _resumed(tmp_path, 1, _holders_restore_began((0, 1), died))
    _waits(join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path), run="another run"), caplog)


@pytest.mark.parametrize("refusal", [_not_the_primary, _deposed], ids=["not-primary", "deposed"])
def test_another_refusal_while_a_holders_restore_began_on_another_task_waits_for_that_restore(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, refusal: Callable[[int], Exception]) -> None:
    """ps task 1 refused for another reason (a replicated shard's member), its generation 0, while the holder's
    BeginRestore had reached ps task 0 (sent to every task at once, it reaches them in any order): that restore
    makes the tasks ready (it waits for ps task 1's shard as the chief cannot): the chief waits for it."""
    client, services = _resumed(tmp_path, 1, _holders_restore_began((0,), refusal=refusal))
    _waits(join_cluster(client, SGD, chief=True, checkpoint_dir=str(tmp_path), run="another run"), caplog)
    assert not services[1].ready and not services[0].ready
