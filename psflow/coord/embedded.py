"""Embedded coordination backend: leases kept by ps task 0, reached over psflow's gRPC.

The default backend: it needs nothing besides the cluster itself. ps task 0
serves a :class:`~psflow.coord.lease_table.LeaseTable`; candidates campaign by
polling it (non-blocking ``Campaign`` calls with backoff, at most every
``ttl / 4``) and, once elected, renew every ``ttl / 3`` from a daemon thread.

Trade-offs (why not a file lock): it works across machines, and it uses the
cluster token (and TLS) every other call uses. Unreplicated, its availability
is ps task 0's: while ps task 0 is down nobody can be elected or renew, so the
leader loses its lease after ``ttl`` and training pauses anyway (ps 0 holds
global_step), and a restarted ps task 0 starts with no lease. Epochs come from
ps task 0's wall clock (see :mod:`psflow.coord.lease_table`), so they keep
growing across its restarts.

With replicated ps shards (``CoordinationConfig.members``) every member of
shard 0 serves the table and its primary answers
(:mod:`psflow.ps.replication.leases`): a call goes to the member this client
last found primary; one that cannot be reached, or answers that it is not the
primary, sends the call on to the member it names (else the next in member
order), each member tried at most once per call (a member named again, e.g.
by two stale backups naming each other, is skipped for the next untried one).
When no member answers as primary while a live one named a primary this call
could not reach, and the client was given ``promote`` (a worker's, with a
router of its own: :class:`psflow.ps.control_routes.ControlRouter`), it gets
shard 0's primary found, a backup promoted as a data client's failover
promotes it (same statuses, same proof that the primary is gone, same
epochs), and sends the call there once more: so an election goes on when
shard 0's primary dies while no data call follows (the last worker's final
duties). Otherwise, or while the primary is not proven gone yet, the call
raises :class:`~psflow.coord.api.BackendUnavailableError`, which every caller
retries as it retries an unreachable ps task 0.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable, Collection
from typing import Any

from psflow.coord.api import (
    DEFAULT_ELECTION,
    BackendUnavailableError,
    CampaignTimeoutError,
    CoordinationBackend,
    CoordinationConfig,
    LeaderInfo,
    Lease,
    LeaseLostError,
    check_name,
)
from psflow.coord.lease_table import COORDINATION_SERVICE, NOT_PRIMARY
from psflow.rpc.api import (
    Channel,
    ConnectConfig,
    DeadlineExceededError,
    FailedPreconditionError,
    RpcError,
    TaskUnavailableError,
)
from psflow.rpc.grpc_client import TaskChannel

__all__ = ["EmbeddedBackend"]

log = logging.getLogger(__name__)


class _NotUpError(BackendUnavailableError):
    """ps task 0 cannot be reached now (not up, restarting, or too slow): worth retrying."""


class EmbeddedBackend(CoordinationBackend):
    """Client of the lease table served by ps task 0 (``config.address``), or by shard 0's primary
    (``config.members``)."""

    campaign_polls = True  # ``Campaign`` calls with backoff; ``timeout=0``: one call

    def __init__(self, config: CoordinationConfig, *, connect: Callable[[str, str], Channel] | None = None,
                 promote: Callable[[Collection[str]], str | None] | None = None) -> None:
        """Opens (lazily connected) channels to ``config.address`` and ``config.members``; starts no thread yet.

        Args:
            config: where the table is served, the lease ttl, timeouts, token.
            connect: (task, address) -> a channel to that task's coordination service (default: gRPC; an
                in-process test serves the members' handlers directly).
            promote: (replicated, ``config.members``) called when a call found no primary while a live
                member named one that could not be reached: finds shard 0's primary, promoting a backup as
                the data path would (:meth:`psflow.ps.control_routes.ControlRouter.primary`); given the
                members this client reached, returns the primary's task name or None. None: this client
                only follows promotions.
        """
        self._config = config
        self._members = list(config.members) or [("/job:ps/task:0", config.address)]
        self._names = tuple(task for task, _ in self._members)
        self._at = next((i for i, (_, address) in enumerate(self._members) if address == config.address), 0)
        connect_config = ConnectConfig(connect_timeout=config.rpc_timeout, rpc_timeout=config.rpc_timeout,
                                       token=config.token, tls=config.tls)
        self._connect = connect or (lambda task, address: TaskChannel(f"{task} (coordination)", address,
                                                                      COORDINATION_SERVICE, connect_config))
        self._channels: dict[str, Channel] = {}
        self._promote = promote if len(self._members) > 1 else None
        self._reached: set[str] = set()  # members that answered a call (their process was there)
        self._lock = threading.Lock()
        self._held: dict[str, Lease] = {}  # election -> latest lease
        self._lost: set[str] = set()        # holders whose lease was lost
        self._closed = threading.Event()
        self._keepalive: threading.Thread | None = None

    # ---- API -----------------------------------------------------------------
    def campaign(self, candidate: str, *, election: str = DEFAULT_ELECTION, timeout: float | None = None) -> Lease:
        check_name("election", election)
        check_name("candidate", candidate)
        holder = f"{candidate}#{secrets.token_hex(6)}"
        ttl = self._config.lease_ttl
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = min(0.05, ttl / 4)
        while True:
            sent = time.monotonic()
            try:
                reply = self._call("Campaign", {"election": election, "candidate": candidate, "holder": holder, "ttl": ttl})
            except _NotUpError as e:
                # ps task 0 not up yet (or restarting): keep campaigning until the deadline.
                if deadline is not None and time.monotonic() >= deadline:
                    raise CampaignTimeoutError(f"{candidate}: election {election!r}: {e}") from e
                log.info("%s: campaign in election %r: %s; retrying", candidate, election, e)
                reply = {"granted": False, "retry_after": ttl / 4}
            if reply.get("granted"):
                lease = Lease(election, candidate, holder, int(reply["epoch"]), ttl, sent + ttl)
                self._hold(lease)
                log.info("%s leads election %r at epoch %d", candidate, election, lease.epoch)
                return lease
            if deadline is not None and time.monotonic() >= deadline:
                raise CampaignTimeoutError(
                    f"{candidate}: election {election!r} still led by {reply.get('leader')!r} "
                    f"(epoch {reply.get('epoch')}) after {timeout:.1f} s")
            pause = min(wait, float(reply.get("retry_after", wait)) + 0.01, ttl / 4)
            if deadline is not None:
                pause = min(pause, max(0.0, deadline - time.monotonic()))
            time.sleep(max(pause, 0.005))
            wait = min(wait * 2, ttl / 4)

    def renew(self, lease: Lease) -> Lease:
        sent = time.monotonic()
        try:
            self._call("Renew", {"election": lease.election, "holder": lease.holder, "epoch": lease.epoch,
                                 "ttl": lease.ttl})
        except LeaseLostError:
            self._mark_lost(lease)
            raise
        renewed = Lease(lease.election, lease.candidate, lease.holder, lease.epoch, lease.ttl, sent + lease.ttl)
        with self._lock:
            current = self._held.get(lease.election)
            if current is not None and current.holder == lease.holder:
                self._held[lease.election] = renewed
        return renewed

    def is_held(self, lease: Lease) -> bool:
        with self._lock:
            if lease.holder in self._lost:
                return False
            current = self._held.get(lease.election)
        latest = current if current is not None and current.holder == lease.holder else lease
        return latest.remaining() > 0

    def resign(self, lease: Lease) -> None:
        with self._lock:
            current = self._held.get(lease.election)
            if current is not None and current.holder == lease.holder:
                del self._held[lease.election]
            self._lost.add(lease.holder)
        try:
            self._call("Resign", {"election": lease.election, "holder": lease.holder, "epoch": lease.epoch})
        except BackendUnavailableError as e:
            log.warning("%s: resign of election %r not delivered (%s); it expires in %.1f s",
                        lease.candidate, lease.election, e, lease.ttl)

    def leader(self, election: str = DEFAULT_ELECTION) -> LeaderInfo | None:
        check_name("election", election)
        info = self._call("Leader", {"election": election}).get("leader")
        if not isinstance(info, dict):
            return None
        return LeaderInfo(election, str(info["candidate"]), int(info["epoch"]))

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            held = list(self._held.values())
        for lease in held:
            self.resign(lease)
        if self._keepalive is not None:
            self._keepalive.join(timeout=self._config.rpc_timeout + 1)
        with self._lock:
            channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            channel.close()

    # ---- internals -----------------------------------------------------------
    def _call(self, method: str, meta: dict[str, Any]) -> dict[str, Any]:
        """``method`` on the member found primary (the only one, unreplicated); each member tried once. With
        ``promote``, a call that found a live member naming an unreachable primary gets shard 0's primary found
        (a backup promoted) and is sent there once more."""
        reply, error, stranded = self._call_members(method, meta)
        if reply is not None:
            return reply
        if stranded and self._promote is not None:
            with self._lock:
                reached = frozenset(self._reached)
            primary = self._promote(reached)
            if primary is not None and self._go_to(primary):
                reply, error, _ = self._call_members(method, meta, only_first=True)
                if reply is not None:
                    return reply
        raise error

    def _call_members(self, method: str, meta: dict[str, Any], *, only_first: bool = False,
                      ) -> tuple[dict[str, Any] | None, BackendUnavailableError, bool]:
        """Tries each member at most once (the one calls go to first, then whichever it names, else the next
        untried in member order) until one answers as primary: (its reply, None, False), or (None, the last
        error, whether a member that answered named as primary one this call could not reach)."""
        error: BackendUnavailableError = _NotUpError(f"coordination service: {method}: no member to call")
        tried: set[str] = set()
        unreachable: set[str] = set()
        named: set[object] = set()
        while len(tried) < (1 if only_first else len(self._members)):
            task, address, channel = self._route(tried)
            tried.add(task)
            where = f"coordination service at {address}" + (f" ({task})" if len(self._members) > 1 else "")
            try:
                reply = dict(channel.call(method, meta, timeout=self._config.rpc_timeout).meta)
            except FailedPreconditionError as e:
                raise LeaseLostError(str(e)) from e
            except (TaskUnavailableError, DeadlineExceededError) as e:
                error = _NotUpError(f"{where}: {method}: {e}")
                unreachable.add(task)
                self._move(task, None)
                continue
            except RpcError as e:
                raise BackendUnavailableError(f"{where}: {method}: {e}") from e
            if self._promote is not None and task not in self._reached:
                with self._lock:
                    self._reached.add(task)
            if NOT_PRIMARY not in reply:
                return reply, error, False
            error = _NotUpError(f"{where}: {method}: {reply[NOT_PRIMARY]}")
            named.add(reply.get("primary"))
            self._move(task, reply.get("primary"))
        return None, error, bool(named & unreachable)

    def _route(self, tried: Collection[str] = ()) -> tuple[str, str, Channel]:
        """The member calls go to now, or the first after it in member order not in ``tried`` (calls go to it
        from now on): (task, address, its channel)."""
        with self._lock:
            while tried and self._names[self._at] in tried and len(tried) < len(self._members):
                self._at = (self._at + 1) % len(self._members)
            task, address = self._members[self._at]
            channel = self._channels.get(task)
            if channel is None:
                channel = self._channels[task] = self._connect(task, address)
            return task, address, channel

    def _go_to(self, primary: str) -> bool:
        """Calls go to member ``primary`` from now on; False if it is no member."""
        with self._lock:
            if primary not in self._names:
                return False
            self._at = self._names.index(primary)
            return True

    def _move(self, task: str, primary: object) -> None:
        """``task`` did not answer as primary: the calls go to ``primary`` if it is another member, else to the
        next member (unless another thread moved them already)."""
        with self._lock:
            names = self._names
            if len(names) == 1 or names[self._at] != task:
                return
            self._at = names.index(primary) if primary in names and primary != task else (self._at + 1) % len(names)
            log.info("coordination calls go to %s now (%s did not answer as shard 0's primary)", names[self._at], task)

    def _hold(self, lease: Lease) -> None:
        with self._lock:
            self._held[lease.election] = lease
            if self._keepalive is None:
                self._keepalive = threading.Thread(target=self._renew_loop, name="psflow-lease-keepalive", daemon=True)
                self._keepalive.start()

    def _mark_lost(self, lease: Lease) -> None:
        with self._lock:
            self._lost.add(lease.holder)
            current = self._held.get(lease.election)
            if current is not None and current.holder == lease.holder:
                del self._held[lease.election]
        log.warning("%s lost its lease on election %r (epoch %d)", lease.candidate, lease.election, lease.epoch)

    def _renew_loop(self) -> None:
        period = self._config.lease_ttl / 3
        while not self._closed.wait(period):
            with self._lock:
                held = list(self._held.values())
            for lease in held:
                try:
                    self.renew(lease)
                except LeaseLostError:
                    pass  # already marked lost
                except BackendUnavailableError as e:
                    log.warning("%s: renewal of election %r failed: %s (%.1f s left)",
                                lease.candidate, lease.election, e, lease.remaining())
                    if lease.remaining() <= 0:
                        self._mark_lost(lease)
