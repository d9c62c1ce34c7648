"""The chief lease's campaign (:class:`Leadership`): see :mod:`psflow.train.recovery` for the election. Moved from
there verbatim (layout limit); :mod:`psflow.train.recovery` still exports it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from psflow.coord.api import (
    BackendUnavailableError,
    CampaignTimeoutError,
    CoordinationBackend,
    CoordinationError,
    Lease,
    LeaseLostError,
)
from psflow.rpc.api import RpcError

__all__ = ["Leadership"]

#: The election's logger (psflow.train.recovery's): these lines read as they did.
log = logging.getLogger("psflow.recovery")


#: Pauses of the background campaign between two asks of a polling backend (CoordinationBackend.campaign_polls).
_FIRST_PAUSE, _MAX_PAUSE = 0.05, 0.4


class Leadership:
    """Campaigns for a lease in the background and keeps campaigning after losing it.

    Thread-safe. :meth:`lease` is the held lease or ``None``; it turns ``None``
    as soon as the backend's local view of the lease expires (never later
    than the service's).
    """

    def __init__(self, backend: CoordinationBackend, candidate: str, *, poll: float = 0.2,
                 on_elected: Callable[[Lease], None] | None = None) -> None:
        """Args:
            backend: the coordination backend (closed by :meth:`close`).
            candidate: this worker's task name.
            poll: seconds between two checks that the lease is still held.
            on_elected: called with each new lease, on the electing thread, before :meth:`lease`
                returns it: the worker fences every ps task at the new epoch there, so a deposed
                chief's writes are refused from the take-over on, even if the new chief never
                writes. A :class:`CoordinationError` or :class:`RpcError` it raises is logged.
        """
        self.backend = backend
        self.candidate = candidate
        self._poll = poll
        self._on_elected = on_elected
        self._lease: Lease | None = None
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread: threading.Thread | None = None
        #: Set by :meth:`resign`, cleared by :meth:`start` and :meth:`rewound`.
        self.resigned = False

    def campaign(self, timeout: float) -> Lease | None:
        """Campaigns now, in the caller's thread, for at most ``timeout`` s; the lease or None."""
        try:
            lease = self.backend.campaign(self.candidate, timeout=timeout)
        except (CampaignTimeoutError, BackendUnavailableError) as e:
            log.info("%s: not elected chief now: %s", self.candidate, e)
            return None
        self._elected(lease)
        with self._lock:
            self._lease = lease
        log.info("%s: elected chief (epoch %d)", self.candidate, lease.epoch)
        return lease

    def _elected(self, lease: Lease) -> None:
        if self._on_elected is None:
            return
        try:
            self._on_elected(lease)
        except (CoordinationError, RpcError) as e:  # the first fenced write fences them instead
            log.warning("%s: fencing the ps tasks at epoch %d on election: %s", self.candidate, lease.epoch, e)

    def start(self) -> None:
        """Starts the background campaign (again, after :meth:`resign`); idempotent."""
        if self._thread is None or not self._thread.is_alive():
            self._closed.clear()
            self.resigned = False
            self._thread = threading.Thread(target=self._run, name="psflow-leadership", daemon=True)
            self._thread.start()

    def stop_campaigning(self) -> None:
        """Stops the background campaign, keeping a lease held (the backend goes on renewing it):
        once it returns, this worker takes no new lease until :meth:`start`; idempotent. Blocks until
        the campaign thread ends (at most one campaign call: one RPC with a polling backend such as the
        embedded one, about a second with one the service wakes); that call may still be granted, and
        the lease is then held (and logged) like any other."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def campaigning(self) -> bool:
        """Whether the background campaign runs."""
        return self._thread is not None and self._thread.is_alive() and not self._closed.is_set()

    def resign(self) -> None:
        """Stops campaigning and gives up the lease if held, keeping the backend open
        (:meth:`start` campaigns again); idempotent. Blocks for at most one poll and one RPC."""
        self.resigned = True
        self.stop_campaigning()
        with self._lock:
            lease, self._lease = self._lease, None
        if lease is not None:
            try:
                self.backend.resign(lease)
                log.info("%s: resigned as chief (epoch %d)", self.candidate, lease.epoch)
            except CoordinationError as e:
                log.warning("%s: resigning the chief lease (epoch %d): %s", self.candidate, lease.epoch, e)

    def rewound(self) -> None:
        """(A restore rewound this worker to a checkpoint) voids an earlier :meth:`resign`: that handed the duties on
        when this worker's data had ended, which it no longer has, so whether it finishes last is decided again when
        its data ends next (:func:`~psflow.train.final_duties.end_duties`). A stale ``resigned`` let a worker rewound
        to the end of its data (it runs no step, so it never campaigns again) skip the final checkpoint while the
        other worker, which saw it training, had resigned too: nobody wrote it (CI, test_final_snapshot)."""
        self.resigned = False

    def lease(self) -> Lease | None:
        """The lease if this worker leads now, else None. A held lease found lost here is resigned (best effort,
        one call to the service): the backend renews it no more, so this worker's next campaign can win."""
        with self._lock:
            lease = self._lease
        if lease is not None and not self.backend.is_held(lease):
            with self._lock:
                if self._lease is lease:
                    self._lease = None
            log.warning("%s: no longer chief (lease epoch %d lost)", self.candidate, lease.epoch)
            # Given up for good: a lease lapsed only in this worker's view (its grant came back after its ttl)
            # is still renewed by the backend and held at the service, refusing this worker's next campaign.
            try:
                self.backend.resign(lease)
            except CoordinationError as e:
                log.info("%s: resigning the lost lease epoch %d: %s", self.candidate, lease.epoch, e)
            return None
        return lease

    def confirmed_lease(self) -> Lease | None:
        """Like :meth:`lease`, confirmed by a round trip to the service (a renewal).

        Use it before acting on the lease after a failure: a restarted ps task 0 forgets every
        embedded lease (replicated shards: only if every replica of shard 0 was lost), so a chief's
        local view can outlive its lease while a successor is already elected. Blocks for one RPC
        at most (replicated shards: one per member of shard 0); not confirmed, two (the lease is resigned).

        A lease not confirmed because the service did not answer (ps task 0 restarting; with replicated
        shards, no member of shard 0 primary yet) is resigned: the backend stops renewing it, so it lapses
        within its ttl and this worker's next campaign can win. Else the backend's renewals kept it alive at a
        service that kept its table (a promoted backup of shard 0), refusing this worker's own campaign.
        """
        lease = self.lease()
        if lease is None:
            return None
        try:
            self.backend.renew(lease)
        except CoordinationError as e:
            with self._lock:
                if self._lease is lease:
                    self._lease = None
            log.warning("%s: not acting as chief: lease epoch %d not confirmed: %s", self.candidate, lease.epoch, e)
            if not isinstance(e, LeaseLostError):  # lost: the backend renews it no more already
                try:
                    self.backend.resign(lease)
                except CoordinationError as resign_error:
                    log.info("%s: resigning the unconfirmed lease epoch %d: %s", self.candidate, lease.epoch,
                             resign_error)
            return None
        return lease

    def _run(self) -> None:
        # A polling backend is asked once per call and the pauses are waits on _closed: stop_campaigning then
        # returns within one Campaign call (a call of a second's polling held the last worker's end until the
        # lease was granted, up to 0.4 s after the other worker resigned). The pauses grow as that call's did
        # (0.05 s, doubling up to 0.4 s), without its restart every second: fewer calls, not more.
        polls = self.backend.campaign_polls
        pause = _FIRST_PAUSE
        while not self._closed.is_set():
            if self.lease() is None:
                try:
                    lease = self.backend.campaign(self.candidate, timeout=0.0 if polls else 1.0)
                except CampaignTimeoutError:
                    if polls:
                        self._closed.wait(pause)
                        pause = min(pause * 2, _MAX_PAUSE)
                    continue
                except CoordinationError as e:
                    log.info("%s: campaign failed: %s; retrying", self.candidate, e)
                    self._closed.wait(0.5)
                    continue
                self._elected(lease)
                with self._lock:
                    self._lease = lease
                # Said even when the campaign was stopped meanwhile (its data ended): the lease is held all the same.
                log.info("%s: elected chief (epoch %d)", self.candidate, lease.epoch)
                pause = _FIRST_PAUSE
                if self._closed.is_set():
                    break
            self._closed.wait(self._poll)

    def close(self) -> None:
        """Stops campaigning and resigns (another worker may then be elected); idempotent."""
        self._closed.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        with self._lock:
            self._lease = None
        try:
            self.backend.close()
        except CoordinationError as e:
            log.warning("%s: closing the coordination backend: %s", self.candidate, e)
