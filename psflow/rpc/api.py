"""RPC surface: service names, errors and the connection settings.

Errors raised by a remote handler travel as a gRPC status and come back to the
caller as one of the :class:`RpcError` subclasses below, chosen by the status
code (never by the message text). Every message names the remote task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

from psflow.errors import PsflowError
from psflow.rpc.framing import Frame
from psflow.rpc.tls import TlsConfig

__all__ = [
    "Channel",
    "PendingReply",
    "gather",
    "PARAMETER_SERVICE",
    "WORKER_SERVICE",
    "TOKEN_METADATA_KEY",
    "ConnectConfig",
    "RpcError",
    "TaskUnavailableError",
    "InvalidArgumentError",
    "FailedPreconditionError",
    "DeadlineExceededError",
    "UnauthenticatedError",
    "RemoteError",
    "ListenError",
    "InvalidRequest",
    "PreconditionFailed",
]

K = TypeVar("K")

PARAMETER_SERVICE = "psflow.ParameterService"
WORKER_SERVICE = "psflow.WorkerService"
TOKEN_METADATA_KEY = "psflow-token"
#: gRPC's default message cap is 4 MiB; a pull of 10^6 rows is ~4 MB, so allow more.
MAX_MESSAGE_BYTES = 512 << 20


@dataclass(frozen=True)
class ConnectConfig:
    """How a client reaches remote tasks.

    Attributes:
        connect_timeout: seconds to wait for a task that is not up yet before
            :class:`TaskUnavailableError` (start order of tasks must not matter,
            so this covers a slow start of a whole cluster).
        rpc_timeout: deadline of one call, in seconds.
        backoff_initial: first wait between connection attempts, seconds.
        backoff_max: cap of the exponentially growing wait, seconds. Both also bound
            gRPC's own reconnect backoff of a channel (whose default grows to 120 s):
            a task that comes up, or comes back, is connected within ``backoff_max``
            of accepting connections, whenever its channel was made.
        token: cluster token sent with every call (``None``: no token).
        tls: encrypt calls and check the server's certificate (``None``: plain text).
        transport: ``grpc`` for every call, or ``tcp``: the ps data path over
            psflow's lean TCP carrier (:mod:`psflow.rpc.tcp`; not with ``tls``).
    """

    connect_timeout: float = 60.0
    rpc_timeout: float = 60.0
    backoff_initial: float = 0.05
    backoff_max: float = 2.0
    token: str | None = None
    tls: TlsConfig | None = None
    transport: str = "grpc"


class PendingReply(Protocol):
    """A call in flight; ``result()`` blocks until the reply (or raises RpcError)."""

    def result(self) -> Frame: ...


def gather(calls: Mapping[K, PendingReply]) -> dict[K, Frame]:
    """Waits for every call in ``calls``; raises the first RpcError only after all have finished.

    Collect concurrent calls this way rather than one by one: a call left
    uncollected after another one failed keeps its connection busy (the TCP
    carrier serves one call per connection at a time).
    """
    replies: dict[K, Frame] = {}
    error: RpcError | None = None
    for key, call in calls.items():
        try:
            replies[key] = call.result()
        except RpcError as e:
            error = error or e
    if error is not None:
        raise error
    return replies


class Channel(Protocol):
    """The calling surface of a connection to one task's service (gRPC or in-process)."""

    task: str
    address: str

    def wait_ready(self, timeout: float | None = None) -> None: ...

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> PendingReply: ...

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame: ...

    def close(self) -> None: ...


class RpcError(PsflowError):
    """Base of every error raised by a remote call."""


class TaskUnavailableError(RpcError):
    """A remote task could not be reached (not up yet, or dead)."""


class InvalidArgumentError(RpcError):
    """The remote task refused a malformed request (gRPC INVALID_ARGUMENT)."""


class FailedPreconditionError(RpcError):
    """The request conflicts with the remote state, e.g. a different layout."""


class DeadlineExceededError(RpcError):
    """The call did not finish within its deadline."""


class UnauthenticatedError(RpcError):
    """The remote task refused the call's cluster token."""


class RemoteError(RpcError):
    """Any other failure reported by the remote task."""


class ListenError(RpcError, RuntimeError):
    """A server cannot listen on its task's address (the port is in use, or the host is not this
    machine's); the message names the task, the address and why. A RuntimeError too, as it was."""


class InvalidRequest(PsflowError, ValueError):
    """Raised by a handler: the request is malformed (becomes INVALID_ARGUMENT)."""


class PreconditionFailed(PsflowError):
    """Raised by a handler: the request conflicts with state (FAILED_PRECONDITION)."""
