"""The primary's ReplicaStatus and Stats read :meth:`Forwarder.lag` while a Join adds or replaces a sender and a
DropBackup or a let-go removes one (under the forwarder's lock). ``lag`` iterated the senders without that lock,
so a status read could fail ('dictionary keys changed during iteration', an internal error to the caller: seen
as a flake of test_replica_join, whose member's watch_view reads its primary's status every second) or leave
members out (a joining member's watch_view then takes 'no sender to it' and Joins again). ``lag``
and the wait's look at the backups' senders never fail for a sender added or removed meanwhile."""

from __future__ import annotations

import threading

import pytest

from psflow.ps.replication.forwarder import Forwarder

pytestmark = pytest.mark.timeout(60)


class _Sender:
    """A stand-in with the two things ``lag`` and ``wait`` read; ``pending`` lets other threads run."""

    acked = 0

    def pending(self) -> tuple[int, float]:
        threading.Event().wait(0.0001)
        return 0, 0.0


def test_lag_read_while_senders_change_never_fails() -> None:
    forwarder = Forwarder(0, 1.0)
    for i in range(8):
        forwarder.senders[f"m{i}"] = _Sender()  # type: ignore[assignment]
    done = threading.Event()

    def churn() -> None:
        n = 0
        while not done.is_set():
            with forwarder.lock:
                forwarder.senders.pop(f"m{n % 8}", None)
                forwarder.senders[f"m{n % 8}"] = _Sender()  # type: ignore[assignment]
            n += 1
            if n % 16 == 0:
                threading.Event().wait(0.0001)  # lets lag take the lock (a Lock is not fair)

    thread = threading.Thread(target=churn, daemon=True)
    thread.start()
    try:
        for _ in range(2000):
            assert sorted(forwarder.lag()) == [f"m{i}" for i in range(8)]
    finally:
        done.set()
        thread.join(10)
