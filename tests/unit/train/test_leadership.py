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
