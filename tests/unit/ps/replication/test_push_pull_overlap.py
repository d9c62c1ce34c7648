"""An async PushPull on a replicated primary sends the push's entry to the backups first, reads the rows it
pulls while they receive it, and replies once they acknowledged (issue 28's cost: the read overlaps the
backups' round trip). What must not move: the reply waits for the acknowledgement, the values read hold the
push, and a call whose reply its sender left unread is read by the sender's own thread."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.ps.protocol import PullRequest, PushPullReply, PushPullRequest, PushRequest, StepTag, WorkerTag
from psflow.ps.sync import SyncConfig
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)

BACKUP = backup(0)
ROWS = np.array([1, 5, 7], np.int64)


def _push_pull(push_id: int) -> PushPullRequest:
    push = PushRequest([("w/part_0", np.full((len(ROWS), 4), 0.5, np.float32), ROWS),
                        ("b/part_0", np.full(4, 0.01, np.float32), None)],
                       WorkerTag(WORKERS[0], 1, push_id=push_id, acked=push_id - 1), StepTag(clock=push_id),
                       step=True, examples=1)
    return PushPullRequest(push, PullRequest([("w/part_0", ROWS)], create=True))


def _shard(make_shard: Callable[..., InProcessShard], sync: SyncConfig) -> InProcessShard:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(layout(sync))
    return shard


def _reads(shard: InProcessShard, seen: list[tuple[int, bool]], acked: threading.Event) -> None:
    """Records, at each read of the primary's rows, the Replicate calls the backup had received and whether
    their replies were let go."""
    service = shard.services[PRIMARY]
    read = service._read

    def spy(*args: object, **kwargs: object) -> object:
        seen.append((shard.calls.get(BACKUP, 0), acked.is_set()))
        return read(*args, **kwargs)  # type: ignore[arg-type]
    service._read = spy  # type: ignore[method-assign]


def test_an_async_push_pull_reads_while_its_entry_travels_and_replies_after_the_acknowledgement(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = _shard(make_shard, SyncConfig())
    calls_before = shard.calls.get(BACKUP, 0)
    acked = threading.Event()
    shard.slow_replies[BACKUP] = acked
    seen: list[tuple[int, bool]] = []
    _reads(shard, seen, acked)
    replies: list[PushPullReply] = []
    call = threading.Thread(target=lambda: replies.append(PushPullReply.from_frame(
        shard.call(PRIMARY, PushPullRequest.METHOD, _push_pull(1).to_frame()))), daemon=True)
    call.start()
    shard.wait(lambda: bool(seen), "the primary read the pulled rows before the backup's reply was read")
    assert seen[0] == (calls_before + 1, False)  # the entry reached the backup; its acknowledgement not read
    call.join(0.2)
    assert not replies  # the reply waits for the acknowledgement
    acked.set()
    call.join(10)
    assert replies and replies[0].push.step == 1
    primary = shard.services[PRIMARY].store.get("w/part_0")
    np.testing.assert_array_equal(replies[0].pull.values["w/part_0"], primary.value[ROWS])  # the push's rows
    assert shard.replicas[BACKUP].applier.settle(10)
    assert shard.services[BACKUP].store.get("w/part_0").value.tobytes() == primary.value.tobytes()


def test_an_ssp_push_pull_reads_after_the_acknowledgement(make_shard: Callable[..., InProcessShard]) -> None:
    shard = _shard(make_shard, SyncConfig(mode="ssp", staleness=3))
    acked = threading.Event()
    shard.slow_replies[BACKUP] = acked
    seen: list[tuple[int, bool]] = []
    _reads(shard, seen, acked)
    call = threading.Thread(target=lambda: shard.call(PRIMARY, PushPullRequest.METHOD, _push_pull(1).to_frame()),
                            daemon=True)
    call.start()
    call.join(0.3)
    assert not seen  # ssp reads after its wait for the slowest worker, which follows the acknowledgement
    acked.set()
    call.join(10)
    assert seen and seen[0][1]


def test_a_reply_its_sender_left_unread_is_read_by_the_senders_thread(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = _shard(make_shard, SyncConfig())
    member = shard.replicas[PRIMARY]
    forwarder = member.forwarder
    assert forwarder is not None
    seq = member._record(forwarder, lambda: [])
    forwarder.start(seq)  # sent; nobody waits for it
    sender = forwarder.senders[BACKUP]
    shard.wait(lambda: sender.acked >= seq, "the sender's thread read the acknowledgement")
    reply = shard.call(PRIMARY, PushPullRequest.METHOD, _push_pull(1).to_frame())  # the channel is free again
    assert PushPullReply.from_frame(Frame(reply.meta, reply.arrays)).push.step == 1
