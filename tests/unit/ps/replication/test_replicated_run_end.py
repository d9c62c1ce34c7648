"""The run's end on a replicated shard (psflow.ps.run_end, psflow.ps.replication): the workers' ``Done`` are
part of the shard's replicated state, and the primary ends the run only once its backups hold the last one.

A backup promoted after a worker finished never heard that worker's ``Done`` (the ledger was not in the
replicated state): under ``psflow server`` the promoted primary served for ever, its ``Stats`` naming fewer
workers done than had finished. And the primary stopped its backups as soon as the last ``Done`` completed its
ledger, before that ``Done``'s entry reached them: a backup stopped first failed the call (a false warning at
the end of a run that succeeded). In-process members (tests/replica_shard.py), composed as psflow.server does.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup

from psflow.ps.protocol import DoneReply, DoneRequest, ReplicateRequest
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)


def _done(shard: InProcessShard, member: str, worker: str) -> bool:
    """``worker``'s Done to ``member``; whether the reply says the run is over."""
    return DoneReply.from_frame(shard.call(member, DoneRequest.METHOD, DoneRequest(worker, 1).to_frame())).run_over


def _run_end(shard: InProcessShard, member: str) -> dict[str, Any]:
    return dict(shard.call(member, "Stats", Frame({})).meta["run_end"])


@pytest.fixture
def shard() -> Any:
    shard = InProcessShard(backups=1, run_end=True)
    shard.start()
    shard.wait_view()
    yield shard
    shard.stop()


def test_the_primary_ends_the_run_once_its_backup_holds_the_last_done(shard: InProcessShard) -> None:
    assert _done(shard, PRIMARY, WORKERS[0]) is False
    release = shard.held_requests[(backup(0), ReplicateRequest.METHOD)] = threading.Event()
    replies: list[bool] = []
    last = threading.Thread(target=lambda: replies.append(_done(shard, PRIMARY, WORKERS[1])))
    last.start()
    try:
        shard.wait(lambda: shard.holding == 1, "the last Done's entry held on its way to the backup")
        assert shard.replicas[PRIMARY].service.run_ledger.over  # type: ignore[union-attr]  # complete here...
        assert shard.run_over == []  # ...but the backup does not hold it yet: nothing stops it
    finally:
        release.set()
        last.join(30)
    assert replies == [True]
    assert shard.run_over == [(PRIMARY, "workers 0-1 finished, no checkpoint directory")]
    assert _run_end(shard, backup(0)) == {"workers_done": list(WORKERS), "workers_expected": 2, "run_over": True}


def test_a_backup_promoted_after_a_worker_finished_counts_its_done(shard: InProcessShard) -> None:
    assert _done(shard, PRIMARY, WORKERS[0]) is False
    assert _run_end(shard, backup(0))["workers_done"] == [WORKERS[0]]
    shard.cut.add(PRIMARY)  # the primary died
    assert shard.promote(backup(0), 1).role == "primary"
    assert shard.run_over == []  # worker 1 still trains
    assert _done(shard, backup(0), WORKERS[1]) is True
    assert shard.run_over == [(backup(0), "workers 0-1 finished, no checkpoint directory")]


def test_a_backup_promoted_after_the_last_done_ends_the_run_its_primary_could_not(shard: InProcessShard) -> None:
    """The primary died between the last Done and stopping its shard: no worker sends Done again."""
    assert _done(shard, PRIMARY, WORKERS[0]) is False
    assert _done(shard, PRIMARY, WORKERS[1]) is True
    shard.run_over.clear()  # the primary's; it is gone now, before it could stop its backup
    shard.cut.add(PRIMARY)
    assert shard.promote(backup(0), 1).role == "primary"
    assert shard.run_over == [(backup(0), "workers 0-1 finished, no checkpoint directory")]
