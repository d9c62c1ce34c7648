"""A replicated shard's push counts and dedup records across a failover (issue 28), in process: a push resent
to the promoted backup is acknowledged once and applied once, ``pushes_acknowledged`` is what the workers
report, and a sync step's entry holds the records of the pushes it applied (a member that got the entries
only up to the step's answers their resends as accepted, never as stale)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.ps.protocol import PushReply, PushRequest, ReplicateRequest, StepTag, WorkerTag
from psflow.ps.sync import SyncConfig
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)


def _async_push(i: int, acked: int, worker: str = WORKERS[0], incarnation: int = 1) -> PushRequest:
    rng = np.random.default_rng(i)
    rows = np.array(sorted(rng.choice(20, 5, replace=False)), np.int64)
    return PushRequest([("w/part_0", rng.normal(size=(5, 4)).astype(np.float32), rows),
                        ("b/part_0", rng.normal(size=4).astype(np.float32), None)],
                       WorkerTag(worker, incarnation, push_id=i, acked=acked), step=True, examples=8)


def _sync_push(worker: str, push_id: int, step: int) -> PushRequest:
    rng = np.random.default_rng([push_id, int(worker[-1])])
    return PushRequest([("w/part_0", rng.normal(size=(3, 4)).astype(np.float32), np.array([1, 5, 9], np.int64)),
                        ("b/part_0", rng.normal(size=4).astype(np.float32), None)],
                       WorkerTag(worker, 1, push_id=push_id, acked=push_id - 1),
                       StepTag(read_step=step, sync_tag=step), step=True, examples=8)


def test_a_push_resent_after_a_failover_is_acknowledged_and_applied_once(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard()
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    for i in range(1, 6):
        shard.push(PRIMARY, _async_push(i, acked=i - 1))
    first = shard.push(PRIMARY, _async_push(6, acked=5))  # applied and replicated; its reply never arrives
    shard.cut.add(PRIMARY)  # the primary dies
    new = backup(0)
    assert shard.promote(new, 1).role == "primary"
    again = shard.push(new, _async_push(6, acked=5))  # the client resends it, same push_id
    assert again == first
    assert shard.push(new, _async_push(7, acked=6)).step == 7  # applied once: the next step value is 7
    stats = shard.replicas[new].stats()
    assert (stats["pushes_applied"], stats["pushes_acknowledged"]) == (7, 6)  # push 7's own ack not reported yet
    shard.leave(new, WORKERS[0], 7)  # the worker's final count
    stats = shard.replicas[new].stats()
    assert stats["pushes_applied"] == stats["pushes_acknowledged"] == 7, stats


def test_an_unnumbered_push_is_neither_applied_nor_acknowledged_in_the_counts(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard()
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    shard.push(PRIMARY, PushRequest([], WorkerTag(WORKERS[0])))  # a PushPull's pull-only half: no push_id
    shard.push(PRIMARY, _async_push(1, acked=0))
    stats = shard.replicas[PRIMARY].stats()
    assert (stats["pushes_applied"], stats["pushes_acknowledged"]) == (1, 0)


def test_a_sync_steps_entry_holds_the_records_of_the_pushes_it_applied(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard()
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig("sync", 2, 2, timeout=20.0)))
    replies: dict[str, PushReply] = {}

    def push(worker: str) -> None:
        replies[worker] = shard.push(PRIMARY, _sync_push(worker, 1, 0))
    threads = [threading.Thread(target=push, args=(w,)) for w in WORKERS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(replies) == sorted(WORKERS) and all(r.accepted and r.step == 1 for r in replies.values()), replies
    entries = list(shard.received[backup(0)])

    # The primary dies right after the entry that applies step 1 reached the backup: a member holding the
    # entries up to that one only, promoted.
    survivor = backup(0)
    shard.add(survivor)
    service = shard.services[survivor]
    for entry in entries:
        request = ReplicateRequest(1, PRIMARY, survivor, (survivor,), (entry,))
        frame = request.to_frame()
        shard.handlers[survivor][ReplicateRequest.METHOD](Frame(frame.meta, frame.arrays))
        if service.global_step is not None and service.global_step.value == 1:
            break
    assert service.global_step is not None and service.global_step.value == 1
    assert service.workers.examples == 16  # both pushes' examples went with the step
    shard.cut.add(PRIMARY)
    assert shard.promote(survivor, 1).role == "primary"
    for worker in WORKERS:  # each client resends its push, same push_id: answered as the primary did
        again = shard.push(survivor, _sync_push(worker, 1, 0))
        assert (again.accepted, again.step, again.completed) == (True, 1, replies[worker].completed), again
    assert service.global_step.value == 1 and service.workers.examples == 16
    for worker in WORKERS:
        shard.leave(survivor, worker, 1)
    stats = shard.replicas[survivor].stats()
    assert stats["pushes_applied"] == stats["pushes_acknowledged"] == 2, stats


def test_a_leave_credits_its_count_to_the_process_that_sent_it_not_the_workers_newest(
        make_shard: Callable[..., InProcessShard]) -> None:
    # The Leave of a worker's process that a newer one of the same worker already replaced (it pushed) was
    # credited to the newer one: pushes_acknowledged counted the old process's pushes twice.
    shard = make_shard()
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    for i in range(1, 4):
        shard.push(PRIMARY, _async_push(i, acked=i - 1, incarnation=1))
    shard.push(PRIMARY, _async_push(1, acked=0, incarnation=2))  # the worker's next process
    shard.leave(PRIMARY, WORKERS[0], 3, incarnation=1)  # the first process's final count, late
    stats = shard.replicas[PRIMARY].stats()
    assert (stats["pushes_applied"], stats["pushes_acknowledged"]) == (4, 3), stats
