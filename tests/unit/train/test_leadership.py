"""Leadership (psflow.train.recovery): every lease this worker is granted is said in its log.

A campaign call in flight when the worker's data ends (stop_campaigning) can still be granted: the worker
then holds the lease (it hands it on while it waits for the others, or, the last to finish, writes the final
checkpoint), but its "elected chief (epoch E)" line was skipped. test_recovery.py's chief kill then found no
new chief in any log although the restarted chief held the lease and wrote the final checkpoint (4 runs in 6
beside two CPU hogs).
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
from support import HeldLeases

from psflow.coord.api import DEFAULT_ELECTION, CampaignTimeoutError, Lease
from psflow.train.recovery import Leadership

pytestmark = pytest.mark.timeout(60)


class _GrantWhenTold(HeldLeases):
    """A backend whose one campaign call waits until the test grants it (epoch 7)."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.grant = threading.Event()

    def campaign(self, candidate: str, *, election: str = DEFAULT_ELECTION, timeout: float | None = None) -> Lease:
        self.asked.set()
        if not self.grant.wait(timeout=30):
            raise CampaignTimeoutError(f"{candidate}: not granted by the test")
        return Lease(election, candidate, f"{candidate}#1", 7, 10.0, time.monotonic() + 10.0)


def test_a_lease_granted_while_the_campaign_stops_is_held_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    backend = _GrantWhenTold()
    leadership = Leadership(backend, "/job:worker/task:0")
    caplog.set_level(logging.INFO, logger="psflow.recovery")
    leadership.start()
    assert backend.asked.wait(timeout=30)            # the campaign call is in flight
    stopper = threading.Thread(target=leadership.stop_campaigning)  # the worker's data ended
    stopper.start()
    deadline = time.monotonic() + 30
    while leadership.campaigning():                 # stop_campaigning has begun (it now waits for the call)
        assert time.monotonic() < deadline
        time.sleep(0.01)
    backend.grant.set()                              # ... which is granted all the same
    stopper.join(timeout=30)
    assert not stopper.is_alive()
    lease = leadership.lease()
    assert lease is not None and lease.epoch == 7    # held: handed on by linger, or kept for the final checkpoint
    assert "/job:worker/task:0: elected chief (epoch 7)" in caplog.text


class _PollingService(HeldLeases):
    """A backend that polls its service (as :class:`~psflow.coord.embedded.EmbeddedBackend` does): a campaign
    call asks until its ``timeout``, and the service grants nobody until the test ends; counts the calls in flight."""

    campaign_polls = True

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.released = threading.Event()
        self.in_flight = 0
        self.timeouts: list[float | None] = []

    def campaign(self, candidate: str, *, election: str = DEFAULT_ELECTION, timeout: float | None = None) -> Lease:
        self.in_flight += 1
        self.timeouts.append(timeout)
        self.asked.set()
        try:
            self.released.wait(timeout=timeout)  # the other holder keeps the lease meanwhile
            raise CampaignTimeoutError(f"{candidate}: election {election!r} still led by another")
        finally:
            self.in_flight -= 1


def test_stopping_the_campaign_on_a_polling_backend_waits_for_no_campaign_call() -> None:
    # The last worker's data ends while its background campaign waits for the lease another worker still holds:
    # it stops campaigning, then campaigns in its own thread for the final duties (take_final_duties). A campaign
    # call of a second's polling left running until the call's end delayed every run's end (issue 29).
    backend = _PollingService()
    leadership = Leadership(backend, "/job:worker/task:1")
    leadership.start()
    assert backend.asked.wait(timeout=30)
    try:
        leadership.stop_campaigning()
        assert not leadership.campaigning()
        assert backend.in_flight == 0           # nothing of the campaign left running: no lease can come later
        assert backend.timeouts and set(backend.timeouts) == {0.0}  # one ask per call; the pauses are Leadership's
    finally:
        backend.released.set()
        leadership.close()
