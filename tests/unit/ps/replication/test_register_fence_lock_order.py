"""A replicated shard primary's chief ``Register``, a fenced ``BeginRestore`` and an entry carrying the fence, all at
once, finish: no three-lock cycle (review of 019f757).

019f757 made a replicated primary's chief ``Register`` take the restore mutex (RestoreGate.creating) before the
forwarder's lock (psflow/ps/replication/register_call.py). A ``BeginRestore`` carrying the lease's epoch takes the
fence's lock (FenceGuard.hold) and then the restore mutex (RestoreGate.close). An entry carrying the fence (a
``Fence`` call's, a ``LoadShard``'s full entry, a joining member's snapshot: psflow/ps/replication/carried.py) reads
the fence (FenceGuard.export) while it holds the forwarder's lock. With the three at once: Register holds the mutex
and waits for the forwarder's lock, the entry holds that and waits for the fence's, BeginRestore holds that and
waits for the mutex: the shard's primary hung for good (every later entry, push and restore call with it).
The same reading of the fence closed a cycle before 019f757 too: a fenced ``SaveShard`` holds the fence's lock and
takes the lock an async push is applied and recorded under (CheckpointCount.holding), which a push holds while it
waits for the forwarder's lock.
In-process members (tests/replica_shard.py); the interleaving made exact by hooks, each thread waited for 10 s.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, layout

from psflow.ps.protocol import (
    BeginRestoreRequest,
    FenceRequest,
    PushRequest,
    SaveShardReply,
    SaveShardRequest,
    StatsReply,
    WorkerTag,
)
from psflow.ps.sync import SyncConfig
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(90)


def _thread(outcomes: dict[str, Any], name: str, call: Callable[[], object]) -> threading.Thread:
    def run() -> None:
        try:
            call()
            outcomes[name] = "ok"
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcomes[name] = e
    thread = threading.Thread(target=run, name=f"test-{name}", daemon=True)
    thread.start()
    return thread


def test_a_chief_register_a_fenced_begin_restore_and_an_entry_carrying_the_fence_all_finish(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    chief = dataclasses.replace(layout(SyncConfig()), defer_ready=True)
    shard.register(chief)  # the chief registered (the restarted chief's join registers again below)
    service = shard.services[PRIMARY]
    forwarder = shard.replicas[PRIMARY].forwarder
    assert forwarder is not None
    guard, gate = service.fence, service.gate
    real_export, real_close = guard.export, gate.close
    in_entry, go_on, closing = threading.Event(), threading.Event(), threading.Event()

    def export() -> dict[str, Any]:  # the Fence call's entry is being built: the forwarder's lock is held
        guard.export = real_export  # type: ignore[method-assign]
        in_entry.set()
        assert go_on.wait(30)
        return real_export()

    def close(generation: int) -> None:  # BeginRestore holds the fence's lock (FenceGuard.hold) here
        gate.close = real_close  # type: ignore[method-assign]
        closing.set()
        real_close(generation)

    outcomes: dict[str, Any] = {}
    guard.export = export  # type: ignore[method-assign]
    gate.close = close  # type: ignore[method-assign]
    threads = [_thread(outcomes, "fence", lambda: shard.call(PRIMARY, FenceRequest.METHOD,
                                                             FenceRequest(5, holder="/job:worker/task:1").to_frame()))]
    assert in_entry.wait(30)
    assert forwarder.lock.locked()
    threads.append(_thread(outcomes, "register", lambda: shard.register(chief)))
    shard.wait(gate._loads.locked, "the chief's Register holds the restore mutex")
    threads.append(_thread(outcomes, "begin_restore", lambda: shard.call(
        PRIMARY, BeginRestoreRequest.METHOD, BeginRestoreRequest(9, 5, "/job:worker/task:1").to_frame())))
    assert closing.wait(30)
    go_on.set()
    for thread in threads:
        thread.join(10)
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:  # the mutex let go from here (a plain lock), so the three go on and the shard's teardown ends
        gate._loads.release()
        for thread in threads:
            thread.join(10)
    assert not stuck, f"deadlocked: {stuck} (outcomes so far {outcomes})"
    assert outcomes == {"fence": "ok", "register": "ok", "begin_restore": "ok"}, outcomes
    stats = StatsReply.from_frame(shard.call(PRIMARY, "Stats", Frame({})))
    assert (stats.ready, stats.generation) == (False, 9)
    assert guard.highest() == 5


def test_a_fenced_save_a_push_and_an_entry_carrying_the_fence_all_finish(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))  # async: a push is applied and recorded under the apply lock
    service, member = shard.services[PRIMARY], shard.replicas[PRIMARY]
    forwarder, counter = member.forwarder, service._checkpoints.push_count
    assert forwarder is not None and counter is not None
    guard = service.fence
    real_export, real_holding = guard.export, counter.holding
    in_entry, go_on, saving = threading.Event(), threading.Event(), threading.Event()

    def export() -> dict[str, Any]:  # the Fence call's entry is being built: the forwarder's lock is held
        guard.export = real_export  # type: ignore[method-assign]
        in_entry.set()
        assert go_on.wait(30)
        return real_export()

    def holding() -> Any:  # the save holds the fence's lock (FenceGuard.hold) here
        counter.holding = real_holding  # type: ignore[method-assign]
        saving.set()
        return real_holding()

    outcomes: dict[str, Any] = {}
    guard.export = export  # type: ignore[method-assign]
    counter.holding = holding  # type: ignore[method-assign]
    push = PushRequest([("b/part_0", np.ones(4, np.float32), None)], WorkerTag(WORKERS[0], 1, push_id=1, acked=0),
                       step=True, examples=8)
    threads = [_thread(outcomes, "fence", lambda: shard.call(PRIMARY, FenceRequest.METHOD,
                                                             FenceRequest(5, holder=WORKERS[0]).to_frame()))]
    assert in_entry.wait(30)
    threads.append(_thread(outcomes, "push", lambda: shard.push(PRIMARY, push)))
    shard.wait(member.data.apply_lock.locked, "the push holds the apply lock")
    threads.append(_thread(outcomes, "save", lambda: SaveShardReply.from_frame(shard.call(
        PRIMARY, SaveShardRequest.METHOD, SaveShardRequest(None, 0, 1, 5, WORKERS[0]).to_frame()))))
    assert saving.wait(30)
    go_on.set()
    for thread in threads:
        thread.join(10)
    stuck = [t.name for t in threads if t.is_alive()]
    if stuck:  # the apply lock let go from here (a plain lock), so the three go on and the shard's teardown ends
        member.data.apply_lock.release()
        for thread in threads:
            thread.join(10)
    assert not stuck, f"deadlocked: {stuck} (outcomes so far {outcomes})"
    assert outcomes == {"fence": "ok", "push": "ok", "save": "ok"}, outcomes
