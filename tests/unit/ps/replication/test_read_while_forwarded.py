"""An async PushPull on a replicated primary reads the rows it returns while its push's entry is out to the
backup, not after the backup's acknowledgement (issue 28's cost: the backup's receipt and the read overlap
instead of adding up; psflow/ps/replication/forwarder.py's ``meanwhile``). What must not move: the reply
comes only once the backup acknowledged the entry, it returns the rows as of the push, and an ssp PushPull
still reads after its wait (the wait for the slowest worker comes first)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import pytest
import replica_shard
from replica_shard import PRIMARY, WORKERS, InProcessShard, backup, layout

from psflow.ps.protocol import (
    PullRequest,
    PushPullReply,
    PushPullRequest,
    PushRequest,
    ReplicateRequest,
    StepTag,
    WorkerTag,
)
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import InvalidRequest
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)

BACKUP = backup(0)
_WAIT = 30.0  # seconds: generous, the machine is shared


class _HeldReply:
    """A Replicate call sent, whose reply is read (and the call served) once ``release`` is set."""

    def __init__(self, serve: Callable[[], Any], release: threading.Event) -> None:
        self._serve, self._release = serve, release

    def result(self) -> Frame:
        assert self._release.wait(_WAIT), "the test never released the backup's reply"
        return self._serve().result()  # type: ignore[no-any-return]


class _Gate:
    """While ``armed``: a Replicate call to the backup is sent at once and answered once ``release`` is set."""

    def __init__(self) -> None:
        self.armed = False
        self.sent, self.release = threading.Event(), threading.Event()


def _shard(make_shard: Callable[..., InProcessShard], monkeypatch: pytest.MonkeyPatch, gate: _Gate,
           sync: SyncConfig) -> InProcessShard:
    class HeldLink(replica_shard.Link):
        def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                       arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Any:
            if not (gate.armed and method == ReplicateRequest.METHOD and self.task == BACKUP):
                return super().call_async(method, meta, arrays, timeout=timeout)
            gate.sent.set()
            return _HeldReply(lambda: super(HeldLink, self).call_async(method, meta, arrays, timeout=timeout),
                              gate.release)

    monkeypatch.setattr(replica_shard, "Link", HeldLink)  # before the members open their channels
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.register(layout(sync))
    return shard


def _push_pull(push_id: int) -> PushPullRequest:
    rows = np.array([1, 3], np.int64)
    push = PushRequest([("w/part_0", np.full((2, 4), 0.5, np.float32), rows)],
                       WorkerTag(WORKERS[0], 1, push_id=push_id, acked=push_id - 1), StepTag(clock=push_id), step=True,
                       examples=1)
    return PushPullRequest(push, PullRequest([("w/part_0", rows)]))


def _before_reads(shard: InProcessShard, before: Callable[[], None]) -> None:
    """Calls ``before`` (which may raise, failing the read) each time the primary's service reads rows for a
    reply, before the read."""
    service = shard.services[PRIMARY]
    real = service._read

    def traced(*args: Any, **kwargs: Any) -> Any:
        before()
        return real(*args, **kwargs)
    service._read = traced  # type: ignore[method-assign]


def _traced_reads(shard: InProcessShard) -> threading.Event:
    """Set when the primary's service reads rows for a reply."""
    read = threading.Event()
    _before_reads(shard, read.set)
    return read


def _call(shard: InProcessShard,
          request: PushPullRequest) -> tuple[threading.Thread, list[PushPullReply], list[Exception]]:
    """``request`` sent to the primary from a thread of its own: its reply, or its error as a client gets it."""
    replies: list[PushPullReply] = []
    errors: list[Exception] = []

    def run() -> None:
        try:
            replies.append(PushPullReply.from_frame(shard.call(PRIMARY, PushPullRequest.METHOD, request.to_frame())))
        except Exception as e:
            errors.append(e)
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, replies, errors


def test_an_async_push_pull_reads_while_its_entry_is_out_and_replies_after_the_ack(
        make_shard: Callable[..., InProcessShard], monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _Gate()
    shard = _shard(make_shard, monkeypatch, gate, SyncConfig())
    read = _traced_reads(shard)
    gate.armed = True
    thread, replies, _ = _call(shard, _push_pull(1))
    assert gate.sent.wait(_WAIT), "the push's entry was never sent to the backup"
    assert read.wait(_WAIT), "the rows were not read while the backup's acknowledgement was out"
    assert thread.is_alive() and not replies  # no reply before the acknowledgement
    gate.release.set()
    thread.join(_WAIT)
    assert replies, "no reply after the backup acknowledged"
    reply = replies[0]
    assert reply.push.step == 1 and shard.replicas[BACKUP].applier.received_seq >= 1
    value = shard.services[PRIMARY].store.get("w/part_0").value
    np.testing.assert_array_equal(reply.pull.values["w/part_0"], value[[1, 3]])  # the rows as of the push
    assert shard.replicas[BACKUP].applier.settle(_WAIT)
    replica_shard.assert_same_state(shard.services[PRIMARY], shard.services[BACKUP])


def test_an_ssp_push_pull_reads_only_after_the_ack(make_shard: Callable[..., InProcessShard],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _Gate()
    shard = _shard(make_shard, monkeypatch, gate, SyncConfig(mode="ssp", staleness=3))
    read = _traced_reads(shard)
    gate.armed = True
    thread, replies, _ = _call(shard, _push_pull(1))
    assert gate.sent.wait(_WAIT), "the push's entry was never sent to the backup"
    assert thread.is_alive() and not read.is_set()  # its wait for the slowest worker comes before the read
    gate.release.set()
    thread.join(_WAIT)
    assert replies and read.is_set()


def test_an_async_push_pulls_read_error_comes_after_the_ack_with_the_push_applied_once(
        make_shard: Callable[..., InProcessShard], monkeypatch: pytest.MonkeyPatch) -> None:
    """The read run while the entry is out fails: the error is the call's reply, but only once the backup
    acknowledged the push's entry (the push is applied and replicated, as before the overlap: a resend is
    answered from its dedup record, not applied again), and primary and backup hold the same state."""
    gate = _Gate()
    shard = _shard(make_shard, monkeypatch, gate, SyncConfig())
    read = threading.Event()

    def fail_the_first() -> None:
        if not read.is_set():
            read.set()
            raise InvalidRequest("the read failed (test)")
    _before_reads(shard, fail_the_first)
    gate.armed = True
    request = _push_pull(1)
    thread, _, errors = _call(shard, request)
    assert gate.sent.wait(_WAIT), "the push's entry was never sent to the backup"
    assert read.wait(_WAIT), "the rows were not read while the backup's acknowledgement was out"
    thread.join(0.5)
    assert thread.is_alive() and not errors  # the read's error waits for the acknowledgement
    gate.release.set()
    thread.join(_WAIT)
    assert not thread.is_alive() and len(errors) == 1, errors
    assert "the read failed (test)" in str(errors[0]), errors[0]
    assert shard.replicas[BACKUP].applier.settle(_WAIT)
    replica_shard.assert_same_state(shard.services[PRIMARY], shard.services[BACKUP])
    applied = shard.services[PRIMARY].store.get("w/part_0").value.copy()
    gate.armed = False
    thread, replies, _ = _call(shard, request)  # the same push again (its id): answered, not applied twice
    thread.join(_WAIT)
    assert replies and replies[0].push.step == 1, replies
    np.testing.assert_array_equal(shard.services[PRIMARY].store.get("w/part_0").value, applied)


def test_a_failed_replicate_call_during_the_read_leaves_one_read_and_the_reply_after_the_ack(
        make_shard: Callable[..., InProcessShard], monkeypatch: pytest.MonkeyPatch) -> None:
    """The Replicate call out during the read fails (the backup served it, its reply lost: a deadline): the
    read is not done again, the entry is sent again and acknowledged, and the reply returns the rows as of the
    push, the push applied once on either member."""
    shard = _shard(make_shard, monkeypatch, _Gate(), SyncConfig())
    reads: list[int] = []
    _before_reads(shard, lambda: reads.append(1))
    shard.lost_replies[(BACKUP, ReplicateRequest.METHOD)] = 1
    thread, replies, _ = _call(shard, _push_pull(1))
    thread.join(_WAIT)
    assert replies, "no reply after the backup's lost reply"
    assert reads == [1], reads  # one read
    assert shard.lost_replies[(BACKUP, ReplicateRequest.METHOD)] == 0  # the lost reply was this push's entry's
    np.testing.assert_array_equal(replies[0].pull.values["w/part_0"],
                                  shard.services[PRIMARY].store.get("w/part_0").value[[1, 3]])
    assert shard.replicas[BACKUP].applier.settle(_WAIT)
    replica_shard.assert_same_state(shard.services[PRIMARY], shard.services[BACKUP])
