"""How a shard member reaches the other members of its shard (issue 28).

Two channels per member, opened on first use and kept:

* control (ReplicaStatus, Promote, Join): gRPC, with the task's token and TLS;
* data (the primary's Replicate calls to a backup): the run's carrier -- psflow's TCP carrier where the task
  serves one (no TLS: :class:`psflow.server.Server` says so), else gRPC. One Replicate call is out at a time
  per backup (its sender), so the TCP carrier's one call per connection is no limit; a status call never
  waits behind a Replicate call on the same connection.

A test joins members in one process with ``connect`` (task name -> channel), used for both.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from psflow.cluster import ClusterSpec
from psflow.cluster.replicas import member_address
from psflow.ps.protocol import ReplicaStatusReply, ReplicaStatusRequest
from psflow.rpc.api import PARAMETER_SERVICE, Channel, ConnectConfig
from psflow.rpc.registry import open_channel
from psflow.rpc.tls import TlsConfig

__all__ = ["MemberChannels"]


class MemberChannels:
    """The channels of one member to the others. Thread-safe."""

    def __init__(self, cluster: ClusterSpec, *, token: str | None, tls: TlsConfig | None, transport: str,
                 status_timeout: float, replica_timeout: float,
                 connect: Callable[[str], Channel] | None = None) -> None:
        self._cluster, self._token, self._tls, self._transport = cluster, token, tls, transport
        self._status_timeout, self._replica_timeout = status_timeout, replica_timeout
        self._connect = connect
        self._lock = threading.Lock()
        self._open: dict[tuple[str, str], Channel] = {}

    def get(self, member: str, *, data: bool = False) -> Channel:
        """The channel to ``member``: the data channel (the run's carrier) if ``data``, else the control one."""
        carrier = self._transport if data and self._connect is None else "grpc"
        with self._lock:
            channel = self._open.get((member, carrier))
            if channel is None:
                if self._connect is not None:
                    channel = self._connect(member)
                else:
                    config = ConnectConfig(connect_timeout=self._status_timeout, rpc_timeout=self._replica_timeout,
                                           token=self._token, tls=self._tls, backoff_max=0.5, transport=carrier)
                    channel = open_channel(carrier, member, member_address(self._cluster, member), PARAMETER_SERVICE,
                                           config)
                self._open[(member, carrier)] = channel
            return channel

    def status_of(self, member: str) -> ReplicaStatusReply:
        """``member``'s ReplicaStatus (deadline: the status timeout)."""
        frame = self.get(member).call(ReplicaStatusRequest.METHOD, {}, timeout=self._status_timeout)
        return ReplicaStatusReply.from_frame(frame)
