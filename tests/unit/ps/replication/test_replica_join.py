"""A member rebuilding from the primary (Join) enters the view within a bounded time even while two
threads push without pause (issue 28): once it is a few entries behind, new entries wait until it acked the
newest (psflow/ps/replication/forwarder.py's hold); it then holds the primary's state bit for bit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.ps.protocol import PushRequest, WorkerTag
from psflow.ps.sync import SyncConfig

pytestmark = pytest.mark.timeout(60)


def _push(worker: str, push_id: int) -> PushRequest:
    rows = np.array([push_id % 20], np.int64)
    return PushRequest([("w/part_0", np.full((1, 4), 0.01, np.float32), rows),
                        ("b/part_0", np.full(4, 0.01, np.float32), None)],
                       WorkerTag(worker, 1, push_id=push_id, acked=push_id - 1), step=True, examples=1)


def test_a_joining_member_enters_the_view_under_continuous_pushes(make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard(backups=2)
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    # Round trips: the joining member's are longer (another host, a busier one): entries queue up while each
    # of its calls is out, so it is always some entries behind the newest
    shard.latency.update({backup(0): 0.002, backup(1): 0.02})
    stop, pushed, errors = threading.Event(), [0, 0], []

    def pusher(n: int) -> None:
        push_id = 0
        while not stop.is_set():
            push_id += 1
            try:
                shard.push(PRIMARY, _push(WORKERS[n], push_id))
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return
            pushed[n] += 1
    threads = [threading.Thread(target=pusher, args=(n,), daemon=True) for n in (0, 1)]
    for t in threads:
        t.start()
    try:
        shard.wait(lambda: min(pushed) > 50, "pushes under way")
        joining = backup(1)
        shard.add(joining)  # a restarted process of the backup: empty, it rebuilds by Join
        shard.start(joining)
        began = time.monotonic()
        shard.wait(lambda: joining in shard.replicas[PRIMARY].view.view.backups and shard.replicas[joining].has_state,
                   f"{joining} back in the view", limit=10.0)
        entered = time.monotonic() - began
        before = list(pushed)
        shard.wait(lambda: min(p - b for p, b in zip(pushed, before, strict=True)) > 20, "pushes go on after it entered")
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert not errors, errors
    assert entered < 5.0, entered
    print(f"entered the view {entered:.2f} s after its restart")
    primary, rebuilt = shard.services[PRIMARY], shard.services[joining]
    for part in primary.store.partitions():
        assert part.value.tobytes() == rebuilt.store.get(part.key).value.tobytes(), part.key
        for name, slot in part.slots.items():
            assert slot.tobytes() == rebuilt.store.get(part.key).slots[name].tobytes(), (part.key, name)
    assert primary.global_step is not None and rebuilt.global_step is not None
    assert primary.global_step.value == rebuilt.global_step.value == sum(pushed)
