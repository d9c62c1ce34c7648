"""Coordination API: leader election with leases and fencing tokens.

A *candidate* (e.g. a worker that may act as chief) calls
:meth:`CoordinationBackend.campaign` and, once it returns, holds a
:class:`Lease` on an *election* (default ``"chief"``). The lease carries an
*epoch*: an integer fencing token that grows strictly with every new leader
of the same election. Anything a leader writes on shared state (a checkpoint,
a manifest) is sent with its epoch; the receiver (see :mod:`psflow.coord.fence`)
records the highest epoch seen and refuses writes with a lower one, so a
deposed leader that wakes up after a pause cannot overwrite its successor.

Lease lifecycle (states and transitions)::

    campaign() ──granted──> HELD ──resign()/close()──> RELEASED
                              │
                              └─ not renewed within ttl (process dead, stopped,
                                 or cut off) ──> EXPIRED: another candidate may
                                 be granted a lease with a higher epoch

While held, the backend keeps the lease alive in a background thread
(embedded: a renewal every ``ttl / 3``; ZooKeeper: kazoo's session pings), so a
lease lives as long as its holder's process is alive and responsive. A
stopped (SIGSTOP) or dead process stops renewing and loses the lease within
``ttl`` (plus one renewal period).
"""

from __future__ import annotations

import abc
import time
from dataclasses import dataclass

from psflow.errors import PsflowError
from psflow.rpc.tls import TlsConfig

__all__ = [
    "DEFAULT_ELECTION",
    "CoordinationConfig",
    "Lease",
    "LeaderInfo",
    "CoordinationBackend",
    "CoordinationError",
    "BackendUnavailableError",
    "CampaignTimeoutError",
    "LeaseLostError",
    "FencedError",
]

#: The election every chief candidate joins unless told otherwise.
DEFAULT_ELECTION = "chief"


class CoordinationError(PsflowError):
    """Base of every coordination error."""


class BackendUnavailableError(CoordinationError):
    """The coordination service cannot be reached (or its client library is missing)."""


class CampaignTimeoutError(CoordinationError):
    """A campaign did not win the election within its timeout."""


class LeaseLostError(CoordinationError):
    """The lease expired or was taken over; its holder is no longer leader."""


class FencedError(CoordinationError):
    """A write carried an epoch lower than one already seen: its writer was deposed."""


@dataclass(frozen=True)
class CoordinationConfig:
    """Where and how to coordinate; parsed once at the edge (CLI).

    Attributes:
        backend: registry name, ``"embedded"`` or ``"zookeeper"``.
        address: ``host:port`` of ps task 0 (embedded) or the ZooKeeper
            connection string ``h1:2181,h2:2181`` (zookeeper).
        lease_ttl: seconds a lease survives without renewal: the bound on
            how long a dead or stopped leader blocks its successor. Shorter
            means faster fail-over but more renewals and more risk of losing
            the lease in a long pause. ZooKeeper clamps it to
            [2, 20] x its tickTime.
        token: cluster token for the embedded backend's RPCs.
        rpc_timeout: deadline of one coordination call, seconds.
        root: ZooKeeper path under which elections live.
        tls: the embedded backend's channel to ps task 0 uses it, as every other call of the
            cluster does (``None``: plain text); ZooKeeper's connection does not (kazoo's own).
        members: (embedded, replicated ps shards) every member of shard 0 as ``(task, address)``, in
            member order: each serves the lease table and the shard's primary answers, so the calls go to
            whichever member the replies name primary. Empty: ``address`` alone (unreplicated).
    """

    backend: str = "embedded"
    address: str = ""
    lease_ttl: float = 10.0
    token: str | None = None
    rpc_timeout: float = 5.0
    root: str = "/psflow/elections"
    tls: TlsConfig | None = None
    members: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.address:
            raise ValueError(f"coordination backend {self.backend!r}: address is required")
        if not 0.1 <= self.lease_ttl <= 3600:
            raise ValueError(f"lease_ttl must be within [0.1, 3600] s, got {self.lease_ttl}")
        if self.rpc_timeout <= 0:
            raise ValueError(f"rpc_timeout must be positive, got {self.rpc_timeout}")


@dataclass(frozen=True)
class LeaderInfo:
    """Who leads an election, as the coordination service sees it now.

    Attributes:
        election: the election's name.
        candidate: the name the leader campaigned with.
        epoch: the leader's fencing token.
    """

    election: str
    candidate: str
    epoch: int


@dataclass(frozen=True)
class Lease:
    """Leadership of one election, granted to one candidate.

    Attributes:
        election: the election's name.
        candidate: the name given to :meth:`CoordinationBackend.campaign`.
        holder: unique id of this grant (candidate plus a nonce), so a
            restarted process with the same candidate name is a new holder.
        epoch: fencing token, strictly greater than every earlier leader's
            epoch of this election.
        ttl: lease time in seconds.
        expires_at: ``time.monotonic()`` by which, at the latest, the holder
            must consider the lease lost unless it is renewed. It is computed
            from the moment the granting or renewing request was *sent*, so
            the holder's view expires no later than the service's.
    """

    election: str
    candidate: str
    holder: str
    epoch: int
    ttl: float
    expires_at: float

    def remaining(self) -> float:
        """Seconds left before this (local view of the) lease expires; may be negative."""
        return self.expires_at - time.monotonic()


class CoordinationBackend(abc.ABC):
    """Leader election with leases and fencing tokens.

    Implementations are thread-safe. Every blocking call has a bound (its
    ``timeout`` or the config's ``rpc_timeout``).
    """

    #: Whether :meth:`campaign` asks the service again and again until its ``timeout`` (its pauses are its
    #: latency), rather than being woken by the service when the lease is free. A caller that must be able to
    #: stop a campaign at once (:class:`psflow.train.recovery.Leadership`) makes such a campaign one ask at a
    #: time (``timeout=0``) and pauses between asks itself.
    campaign_polls: bool = False

    @abc.abstractmethod
    def campaign(self, candidate: str, *, election: str = DEFAULT_ELECTION, timeout: float | None = None) -> Lease:
        """Blocks until ``candidate`` leads ``election``.

        The lease is then kept alive in the background until :meth:`resign`,
        :meth:`close` or its loss.

        Args:
            candidate: a human-readable name, e.g. ``/job:worker/task:0``.
            election: which election to join.
            timeout: seconds to wait for leadership (``None``: forever).

        Returns:
            The granted lease.

        Raises:
            CampaignTimeoutError: another candidate still leads at the timeout.
            BackendUnavailableError: the service cannot be reached.
        """

    @abc.abstractmethod
    def renew(self, lease: Lease) -> Lease:
        """Renews ``lease`` now (a round trip to the service).

        Returns:
            The lease with a later ``expires_at``.

        Raises:
            LeaseLostError: the lease expired, was resigned or taken over.
            BackendUnavailableError: the service cannot be reached.
        """

    @abc.abstractmethod
    def is_held(self, lease: Lease) -> bool:
        """Whether ``lease`` is still held as far as this process knows; no round trip."""

    @abc.abstractmethod
    def resign(self, lease: Lease) -> None:
        """Gives the lease up so another candidate may be elected; idempotent."""

    @abc.abstractmethod
    def leader(self, election: str = DEFAULT_ELECTION) -> LeaderInfo | None:
        """The current leader of ``election`` (``None``: nobody).

        Raises:
            BackendUnavailableError: the service cannot be reached.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Resigns every lease this backend holds and releases its resources; idempotent."""

    def __enter__(self) -> CoordinationBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_name(kind: str, name: str) -> str:
    """Returns ``name`` if usable as an election or candidate name, else raises ``ValueError``."""
    if not isinstance(name, str) or not name or len(name) > 200 or "/" in name and kind == "election":
        raise ValueError(f"bad {kind} name {name!r:.60}: a non-empty string of at most 200 characters"
                         + (" without '/'" if kind == "election" else ""))
    return name
