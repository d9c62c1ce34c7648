"""ZooKeeper coordination backend (through kazoo): for clusters that already run ZooKeeper.

Election recipe (ephemeral sequential nodes, as ZooKeeper's documentation
describes it): each candidate creates ``<root>/<election>/n_<seq>``, ephemeral
and sequential; the candidate whose node has the lowest sequence number leads;
every other candidate watches only the node just before its own (no herd
effect) and re-checks when it disappears.

* **Lease = session.** The node lives as long as the candidate's ZooKeeper
  session; kazoo pings the server in the background, so a dead or stopped
  process loses its session, hence its node and its leadership, once the
  session timeout (``lease_ttl``, as negotiated with the server) passes.
* **Epoch = sequence number + 1.** A successor's node was created after its
  predecessor's (it was queued behind it), so its sequence number is higher:
  epochs grow strictly with each leader.
* A session that is merely *suspended* (connection lost, session maybe still
  alive on the server) is treated as lost by :meth:`is_held`, because the
  server may expire it at any moment; a later :meth:`renew` that finds the
  node still there restores it.

kazoo (the extra ``psflow[zookeeper]``) is imported when this backend is
created, never at ``import psflow``.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
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
from psflow.extras import MissingExtraError, require

__all__ = ["ZooKeeperBackend"]

log = logging.getLogger(__name__)

_PREFIX = "n_"


def _setter(event: threading.Event) -> Any:
    return lambda _watched_event: event.set()


def _seq(node: str) -> int:
    return int(node.rsplit("_", 1)[1])


class ZooKeeperBackend(CoordinationBackend):
    """Leases as ZooKeeper sessions; one kazoo client (one session) per backend."""

    def __init__(self, config: CoordinationConfig) -> None:
        """Connects to ``config.address`` (blocks up to ``config.rpc_timeout``).

        Raises:
            BackendUnavailableError: kazoo is not installed (the message names the extra,
                ``psflow[zookeeper]``) or the ensemble is unreachable.
        """
        try:
            KazooClient = require("kazoo.client", "zookeeper", "--coordination zookeeper").KazooClient
            KazooState = require("kazoo.protocol.states", "zookeeper", "--coordination zookeeper").KazooState
        except MissingExtraError as e:
            raise BackendUnavailableError(str(e)) from e
        self._config = config
        self._states = KazooState
        self._client: Any = KazooClient(hosts=config.address, timeout=config.lease_ttl)
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[str, Lease]] = {}  # holder -> (node path, lease)
        self._suspended = threading.Event()
        self._closed = False
        self._client.add_listener(self._on_state)
        try:
            self._client.start(timeout=config.rpc_timeout)
        except Exception as e:  # kazoo raises its own timeout type
            self._client.close()
            raise BackendUnavailableError(f"ZooKeeper at {config.address}: cannot connect: {e}") from e

    def _on_state(self, state: Any) -> None:
        if state == self._states.CONNECTED:
            self._suspended.clear()
        else:  # SUSPENDED or LOST
            self._suspended.set()
            if state == self._states.LOST:
                with self._lock:
                    self._nodes.clear()

    def _path(self, election: str) -> str:
        return f"{self._config.root.rstrip('/')}/{check_name('election', election)}"

    # ---- API -----------------------------------------------------------------
    def campaign(self, candidate: str, *, election: str = DEFAULT_ELECTION, timeout: float | None = None) -> Lease:
        check_name("candidate", candidate)
        path = self._path(election)
        holder = f"{candidate}#{secrets.token_hex(6)}"
        deadline = None if timeout is None else time.monotonic() + timeout
        data = json.dumps({"candidate": candidate, "holder": holder}).encode()
        node = self._zk(self._client.create, f"{path}/{_PREFIX}", data, ephemeral=True, sequence=True, makepath=True)
        name = node.rsplit("/", 1)[1]
        try:
            while True:
                sent = time.monotonic()
                children = sorted(self._zk(self._client.get_children, path), key=_seq)
                if name not in children:
                    raise LeaseLostError(f"{candidate}: session expired while campaigning in {election!r}")
                index = children.index(name)
                if index == 0:
                    lease = Lease(election, candidate, holder, _seq(name) + 1, self._ttl(), sent + self._ttl())
                    with self._lock:
                        self._nodes[holder] = (node, lease)
                    log.info("%s leads election %r at epoch %d", candidate, election, lease.epoch)
                    return lease
                gone = threading.Event()
                if self._zk(self._client.exists, f"{path}/{children[index - 1]}", watch=_setter(gone)):
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0 or not gone.wait(remaining):
                        raise CampaignTimeoutError(
                            f"{candidate}: election {election!r} still led by someone else after {timeout:.1f} s")
        except BaseException:
            self._delete(node)
            raise

    def renew(self, lease: Lease) -> Lease:
        with self._lock:
            entry = self._nodes.get(lease.holder)
        if entry is None:
            raise LeaseLostError(f"{lease.candidate}: lease on election {lease.election!r} (epoch {lease.epoch}) is lost")
        sent = time.monotonic()
        if self._zk(self._client.exists, entry[0]) is None:
            with self._lock:
                self._nodes.pop(lease.holder, None)
            raise LeaseLostError(f"{lease.candidate}: lease on election {lease.election!r} (epoch {lease.epoch}) "
                                 "is lost (session expired)")
        self._suspended.clear()
        renewed = Lease(lease.election, lease.candidate, lease.holder, lease.epoch, lease.ttl, sent + self._ttl())
        with self._lock:
            if lease.holder in self._nodes:
                self._nodes[lease.holder] = (entry[0], renewed)
        return renewed

    def is_held(self, lease: Lease) -> bool:
        with self._lock:
            entry = self._nodes.get(lease.holder)
        return entry is not None and not self._suspended.is_set() and self._client.connected

    def resign(self, lease: Lease) -> None:
        with self._lock:
            entry = self._nodes.pop(lease.holder, None)
        if entry is not None:
            self._delete(entry[0])

    def leader(self, election: str = DEFAULT_ELECTION) -> LeaderInfo | None:
        path = self._path(election)
        from kazoo.exceptions import NoNodeError

        for _ in range(5):  # the lowest node may vanish between listing and reading it
            try:
                children = sorted(self._zk(self._client.get_children, path), key=_seq)
            except NoNodeError:
                return None
            if not children:
                return None
            try:
                data, _stat = self._zk(self._client.get, f"{path}/{children[0]}")
            except NoNodeError:
                continue
            return LeaderInfo(election, str(json.loads(data)["candidate"]), _seq(children[0]) + 1)
        return None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._client.stop()  # ends the session: every ephemeral node of ours goes at once
        finally:
            self._client.close()

    # ---- internals -----------------------------------------------------------
    def _ttl(self) -> float:
        # The requested session timeout; the server keeps it if it lies within
        # [2, 20] x tickTime (a larger one is cut, so keep lease_ttl inside).
        return self._config.lease_ttl

    def _zk(self, op: Any, *args: Any, **kwargs: Any) -> Any:
        from kazoo.exceptions import ConnectionLoss, NoNodeError, SessionExpiredError
        from kazoo.handlers.threading import KazooTimeoutError

        try:
            return op(*args, **kwargs)
        except NoNodeError:
            raise
        except SessionExpiredError as e:
            raise LeaseLostError(f"ZooKeeper session expired: {e}") from e
        except (ConnectionLoss, KazooTimeoutError) as e:
            raise BackendUnavailableError(f"ZooKeeper at {self._config.address}: {type(e).__name__}") from e

    def _delete(self, node: str) -> None:
        try:
            self._client.delete(node)
        except Exception as e:  # noqa: BLE001 - best effort: the node dies with the session anyway
            log.debug("could not delete %s: %s", node, e)
