"""A backup's sender thread sends what no call pumps, also when it became a backup while idle
(psflow/ps/replication/forwarder.py).

A sender starts unpumped (a joining member): its thread, with nothing queued, sleeps until notified. When the
member joined the view, ``Forwarder.set_waited`` marked it pumped without waking the thread, and a pumped
sender's ``enqueue`` does not notify either: the thread slept on, so an entry no call waited for (a push whose
wait timed out, the last entries of a run) stayed unsent, and a retry after a failed call was left to the next
waiting call's pump, up to 0.5 s after it was due.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from psflow.ps.replication.forwarder import Forwarder

pytestmark = pytest.mark.timeout(60)


class _Channel:
    """Answers every Replicate call as applied, and records the entries' seqs."""

    def __init__(self) -> None:
        self.sent: list[int] = []
        self.called = threading.Event()

    def call(self, method: str, meta: Any, arrays: Any, *, timeout: float | None = None) -> Any:
        return self


class _Request:
    """A Replicate request's frame: nothing crosses a wire here."""

    meta: dict[str, Any] = {}
    arrays: dict[str, Any] = {}

    def __init__(self, entries: list[Any]) -> None:
        self.entries = entries

    def to_frame(self) -> _Request:
        return self


def test_a_sender_that_became_a_backup_while_idle_sends_an_entry_no_call_waits_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from psflow.ps.replication import forwarder as module

    channel = _Channel()

    class _Reply:
        @staticmethod
        def from_frame(reply: Any) -> Any:
            seqs = [entry.seq for entry in channel.pending]
            channel.sent.extend(seqs)
            channel.called.set()
            return type("R", (), {"applied_seq": max(seqs, default=0)})()

    monkeypatch.setattr(module, "ReplicateReply", _Reply)
    forwarder = Forwarder(shard=0, replica_timeout=5.0)

    def request(member: str, entries: list[Any]) -> _Request:
        channel.pending = entries  # type: ignore[attr-defined]
        return _Request(entries)

    sender = module.BackupSender("/job:ps_backup/task:0", lambda: channel, request,  # type: ignore[arg-type]
                                 on_ack=forwarder.notify, on_deposed=lambda m, e: None, rpc_timeout=5.0)
    try:
        forwarder.senders[sender.member] = sender
        time.sleep(0.2)  # its thread idles: nothing queued, not a backup of the view yet
        forwarder.set_waited((sender.member,))  # the member joined the view
        entry = type("Entry", (), {"seq": 1, "arrays": {}})()
        monkeypatch.setattr(module, "entry_bytes", lambda e: 0)
        forwarder.record(lambda seq: entry)  # type: ignore[arg-type,return-value]
        # nobody waits for it: the sender's own thread sends it after _PUMP_GRACE (0.02 s)
        assert channel.called.wait(timeout=10.0), "the entry was never sent"
        assert channel.sent == [1] and sender.acked == 1
    finally:
        sender.stop()
