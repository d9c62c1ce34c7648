"""A replicated shard after a failover, for unit tests of who answers for the shard (SaveShard, Stats): ps:0
served five pushes and was killed, ps_backup:0 was promoted (epoch 2), ps:0 restarted empty and its Join to the new
primary is held, so it is joining with none of the shard's values (tests/replica_shard.py's in-process members);
and a client whose route to shard 0 is still ps:0 (no call of it failed since the kill: a lingering worker, the
launcher, a chief between two saves)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
from replica_shard import PRIMARY, WORKERS, InProcessShard, Link, backup, layout

from psflow.ps.client import ParameterClient
from psflow.ps.protocol import JoinRequest, PushRequest, SetReadyRequest, WorkerTag
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import Channel

BACKUP = backup(0)


def numbered_push(i: int) -> PushRequest:
    """Worker 0's push number ``i`` (two rows of ``w``, all of ``b``), counted as a step of 8 examples."""
    rows = np.array([i % 20, (i * 7 + 1) % 20], np.int64)
    return PushRequest([("w/part_0", np.full((2, 4), 0.01 * i, np.float32), rows),
                        ("b/part_0", np.full(4, 0.01, np.float32), None)],
                       WorkerTag(WORKERS[0], 1, push_id=i, acked=i - 1), step=True, examples=8)


def trained(make_shard: Callable[..., InProcessShard], *, ready: bool) -> InProcessShard:
    """ps:0 primary with ps_backup:0, registered (``ready``: and made ready at generation 0), 5 pushes applied
    (global_step 5)."""
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(layout(SyncConfig()))
    if ready:
        shard.call(PRIMARY, SetReadyRequest.METHOD, SetReadyRequest(0).to_frame())
    for i in range(1, 6):
        shard.push(PRIMARY, numbered_push(i))
    return shard


def failed_over(make_shard: Callable[..., InProcessShard], *,
                ready: bool = False) -> tuple[InProcessShard, threading.Event]:
    """(Module docstring) :func:`trained`, then ps:0 killed, ps_backup:0 promoted and ps:0 restarted with its Join
    held; the returned event lets the Join go."""
    shard = trained(make_shard, ready=ready)
    shard.cut.add(PRIMARY)  # killed
    assert shard.promote(BACKUP, 1).epoch == 2
    joined = threading.Event()
    shard.held_requests[(BACKUP, JoinRequest.METHOD)] = joined
    shard.add(PRIMARY)  # restarted: a fresh, empty process
    shard.cut.discard(PRIMARY)
    shard.start(PRIMARY)
    shard.wait(lambda: shard.holding > 0, "the restarted ps:0's Join held at the new primary")
    return shard, joined


def routed_client(shard: InProcessShard) -> ParameterClient:
    """(Module docstring) A client of the replicated cluster, its members reached in process, routing shard 0 to
    ps:0."""
    class Client(ParameterClient):
        def _open_member(self, task: str, address: str) -> Channel:
            return Link(shard, task)

    client = Client(shard.cluster, layout(SyncConfig()).layout, client_name=WORKERS[0], failover_timeout=0.3)
    assert client.router is not None and client.channels[0].task == PRIMARY
    return client
