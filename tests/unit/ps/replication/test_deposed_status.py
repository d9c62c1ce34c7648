"""A primary learns that it was deposed from its backup's refusal of its entries by that refusal's status (ABORTED:
its epoch, the shard's fencing token, superseded), never by its text (psflow/ps/replication/view.py check_entries,
forwarder.py BackupSender).

A member refuses a primary's ``Replicate`` for other reasons too, some of whose texts say "deposed": a member that
was itself deposed (a primary at a lower epoch, now rebuilding from the sender) answers ``<member>: deposed at epoch
1; rebuilding from <sender>``. Read by its text, the sender took that for its own deposition: it logged nothing and
asked the member who is primary instead of retrying with its one warning line.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from replica_shard import PRIMARY, InProcessShard, backup

from psflow.ps.protocol import ReplicateRequest
from psflow.ps.replication.forwarder import BackupSender
from psflow.rpc.api import FailedPreconditionError, FencedOffError, RpcError

pytestmark = pytest.mark.timeout(60)


def test_a_member_refuses_a_deposed_primarys_entries_with_the_fences_status(
        make_shard: Callable[..., InProcessShard]) -> None:
    shard = make_shard(backups=1)
    shard.start()
    shard.wait_view()
    shard.cut.add(PRIMARY)
    shard.promote(backup(0), 1)  # the backup is primary at epoch 2; the old one, cut off, still at epoch 1
    late = ReplicateRequest(1, PRIMARY, backup(0), (), [])
    with pytest.raises(FencedOffError, match=rf"deposed: shard 0's primary is {backup(0)} at epoch 2; entries of "
                                             rf"{PRIMARY} at epoch 1 refused"):
        shard.call(backup(0), ReplicateRequest.METHOD, late.to_frame())


class _Refusing:
    """A member's channel whose every Replicate call fails with ``error``."""

    def __init__(self, error: RpcError) -> None:
        self.error = error
        self.called = threading.Event()

    def call(self, method: str, meta: Any, arrays: Any, *, timeout: float | None = None) -> Any:
        self.called.set()
        raise self.error


class _Request:
    meta: dict[str, Any] = {}
    arrays: dict[str, Any] = {}

    def to_frame(self) -> _Request:
        return self


def _refused_once(error: RpcError, caplog: pytest.LogCaptureFixture) -> tuple[list[str], list[str]]:
    """One entry sent to a member that refuses with ``error``: (the members reported deposing this primary, the
    sender's warning lines)."""
    channel, deposed = _Refusing(error), []
    member = backup(0)
    sender = BackupSender(member, lambda: channel, lambda to, entries: _Request(),  # type: ignore[arg-type,return-value]
                          on_ack=lambda: None, on_deposed=lambda m, e: deposed.append(m), rpc_timeout=5.0)
    try:
        with caplog.at_level(logging.WARNING, logger="psflow.ps.replication"):
            sender.enqueue(type("Entry", (), {"seq": 1, "parts": [], "state": {}, "full": False})())  # type: ignore[arg-type]
            assert channel.called.wait(10.0)
            deadline = time.monotonic() + 10.0
            while sender.last_error is None:  # set once the refusal was read (its warning logged before)
                assert time.monotonic() < deadline, "the refusal was never read"
                time.sleep(0.005)
            sender.stop()
            sender._thread.join(10.0)  # its call done, on_deposed included (a retry may have come meanwhile)
    finally:
        sender.stop()
    return sorted(set(deposed)), [r.getMessage() for r in caplog.records if "replication to" in r.getMessage()]


def test_a_member_that_was_deposed_itself_is_retried_with_a_warning_not_taken_for_this_primarys_deposal(
        caplog: pytest.LogCaptureFixture) -> None:
    error = FailedPreconditionError(f"{backup(0)}: Replicate: {backup(0)}: deposed at epoch 1; rebuilding from "
                                    f"{PRIMARY}")
    deposed, warnings = _refused_once(error, caplog)
    assert deposed == []
    assert warnings == [f"replication to {backup(0)} failed (retrying): {error}"]


def test_the_fences_refusal_deposes_this_primary_whatever_its_text(caplog: pytest.LogCaptureFixture) -> None:
    deposed, warnings = _refused_once(FencedOffError(f"{backup(0)}: Replicate: entries of {PRIMARY} refused"), caplog)
    assert deposed == [backup(0)]
    assert warnings == []  # the one line is the deposed member's own (psflow/ps/replication/deposed.py)
