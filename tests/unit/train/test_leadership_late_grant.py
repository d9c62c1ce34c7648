"""Leadership (psflow.train.recovery) over the embedded backend when a campaign's grant comes back later than
the lease's ttl (a ps task 0 stalled on a loaded machine, or a replicated shard 0 waiting for its backups).

The worker's own view of such a lease has lapsed when the reply arrives, so it is not chief; but the backend
held it and renewed it, and the service kept it alive: nobody resigned it, so this worker's next campaign, as a
new holder, was refused for ever ('election 'chief' still led by '/job:worker/task:0''; a real --ps-replicas 1
run beside two CPU hogs: the last worker waited out its 60 s for the final checkpoint and failed). A lease the
worker gives up as lapsed is now resigned, so a later campaign wins.

The service is a real :class:`~psflow.coord.lease_table.LeaseTable` served through its handlers; its first
Campaign reply is held past the ttl.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from psflow.coord import CoordinationConfig
from psflow.coord.embedded import EmbeddedBackend
from psflow.coord.lease_table import LeaseTable
from psflow.rpc.framing import Frame
from psflow.train.recovery import Leadership

pytestmark = pytest.mark.timeout(60)

TTL = 0.5
PS0 = "/job:ps/task:0"


class _SlowFirstGrant:
    """ps task 0's coordination service whose first Campaign call is served ``hold`` seconds late: the grant
    lives its ttl from then on at the service, but the caller counts it from its call."""

    def __init__(self, table: LeaseTable, hold: float) -> None:
        self.task, self.address = PS0, "address-of-ps0"
        self.handlers, self.hold, self.held = table.handlers(), hold, threading.Event()
        self.renewals = threading.Event()  # Renew calls wait for it: the test looks at the lease first

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        if method == "Campaign" and not self.held.is_set():
            self.held.set()
            time.sleep(self.hold)  # the call waits at the stalled task, then is granted at once
        if method == "Renew":
            self.renewals.wait(timeout=30)
        reply = self.handlers[method](Frame(dict(meta or {}), dict(arrays or {})))
        out_meta, out_arrays = reply if isinstance(reply, tuple) else (reply.meta, reply.arrays)
        return Frame(dict(out_meta), dict(out_arrays or {}))

    def close(self) -> None:
        """Nothing to close."""


def test_a_lease_granted_after_its_ttl_is_given_up_so_the_next_campaign_wins() -> None:
    table = LeaseTable(PS0)
    service = _SlowFirstGrant(table, hold=1.5 * TTL)
    config = CoordinationConfig("embedded", service.address, lease_ttl=TTL)
    backend = EmbeddedBackend(config, connect=lambda task, address: service)
    leadership = Leadership(backend, "/job:worker/task:0")
    try:
        first = leadership.campaign(timeout=10.0)
        assert first is not None and first.remaining() <= 0  # lapsed in this worker's view when it came back
        assert leadership.lease() is None  # not chief
        service.renewals.set()  # the backend's keepalive renews what it holds
        # The next campaign (a new holder: the worker's data ended, or its background campaign) wins: the lapsed
        # lease is not kept alive by the backend's renewals. A generous wait (it wins within a ttl or two here): the
        # lease kept alive, no wait is long enough.
        second = leadership.campaign(timeout=30.0)
        assert second is not None and second.epoch > first.epoch, table.leader("chief")
        assert leadership.lease() is not None
    finally:
        leadership.close()
        backend.close()
