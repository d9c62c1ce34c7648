"""psflow.coord: chief election with leases, and fencing of deposed leaders.

Files:

* ``api.py``: :class:`CoordinationBackend` (campaign / renew / is_held /
  resign / leader / close), :class:`Lease` (with its epoch, the fencing
  token), :class:`LeaderInfo`, :class:`CoordinationConfig` and the errors
  :class:`CoordinationError`, :class:`BackendUnavailableError`,
  :class:`CampaignTimeoutError`, :class:`LeaseLostError`, :class:`FencedError`.
* ``registry.py``: :func:`create_backend` by name (``"embedded"``,
  ``"zookeeper"``), importing the chosen backend lazily.
* ``lease_table.py``: :class:`LeaseTable`, the embedded backend's state,
  served by ps task 0 as ``psflow.CoordinationService`` (with replicated ps
  shards, by shard 0's primary, which carries it to its backups:
  :mod:`psflow.ps.replication.leases`).
* ``embedded.py``: :class:`EmbeddedBackend` (default; no extra service).
* ``zookeeper.py``: :class:`ZooKeeperBackend` (kazoo; ephemeral sequential nodes).
* ``fence.py``: :class:`FenceGuard` (ps side, served as the ps task's ``Fence``
  call; the leader's side is :class:`psflow.ps.fencing.FencedWriter`).

Guarantees (every backend; tests/integration/coord/ runs one contract suite
against each):

* **Exclusivity**: at most one candidate holds an unexpired lease of an
  election at a time, as the service sees it; a holder's local view
  (:meth:`Lease.remaining`, :meth:`CoordinationBackend.is_held`) expires no
  later than the service's.
* **Fail-over bound**: a leader that dies or stops loses the lease within
  ``lease_ttl`` (embedded: plus up to ``lease_ttl / 3`` of renewal period);
  a waiting candidate is then elected within its polling or watch delay.
* **Fencing**: epochs grow strictly with each new leader of an election; a
  :class:`FenceGuard` that saw epoch ``e`` refuses every write with a lower one.

Non-guarantees: leadership is not a mutual exclusion of *actions* by itself:
a paused leader may still act on stale beliefs until it checks its lease;
only fenced writes are safe. Nothing here restarts or restores anything.
"""

from psflow.coord.api import (
    DEFAULT_ELECTION,
    BackendUnavailableError,
    CampaignTimeoutError,
    CoordinationBackend,
    CoordinationConfig,
    CoordinationError,
    FencedError,
    LeaderInfo,
    Lease,
    LeaseLostError,
)
from psflow.coord.registry import backend_names, create_backend, register_backend

__all__ = [
    "DEFAULT_ELECTION",
    "BackendUnavailableError",
    "CampaignTimeoutError",
    "CoordinationBackend",
    "CoordinationConfig",
    "CoordinationError",
    "FencedError",
    "LeaderInfo",
    "Lease",
    "LeaseLostError",
    "backend_names",
    "create_backend",
    "register_backend",
]
