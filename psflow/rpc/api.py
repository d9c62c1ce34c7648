"""RPC surface: handlers, the one dispatch, service names, errors and the connection settings.

A service is a table of :data:`Handler` functions (method name -> handler).
Every carrier (gRPC, TCP, in-process) runs a call through :func:`dispatch`,
which maps what the handler raised to one :class:`Status` and the error text
sent back, in one place:

    * :class:`~psflow.rpc.framing.FrameError`, :class:`InvalidRequest`, an
      unknown method -> ``INVALID_ARGUMENT``
    * :class:`PreconditionFailed` -> ``FAILED_PRECONDITION``; its subclass
      :class:`FencedOff` (a fencing token refused) -> ``ABORTED``
    * any other ``Exception`` -> ``INTERNAL`` (logged with its traceback; the
      server keeps serving)

The text is ``"<task>: <method>: <message>"``. The caller gets one of the
:class:`RpcError` subclasses below, chosen by the status (:data:`STATUS_ERRORS`,
never by the message text). This module imports no carrier library (no grpc).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol, TypeVar

import numpy as np

from psflow.errors import PsflowError
from psflow.rpc.framing import Frame, FrameError, decode
from psflow.rpc.tls import TlsConfig

__all__ = [
    "Handler",
    "Reply",
    "Status",
    "Refusal",
    "dispatch",
    "refusal",
    "STATUS_ERRORS",
    "ServeConfig",
    "CarrierServer",
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
    "FencedOffError",
    "DeadlineExceededError",
    "UnauthenticatedError",
    "RemoteError",
    "ListenError",
    "InvalidRequest",
    "PreconditionFailed",
    "FencedOff",
    "Unavailable",
]

K = TypeVar("K")
R = TypeVar("R")

log = logging.getLogger(__name__)

#: What a handler returns: reply meta (small JSON values) and named arrays.
Reply = tuple[Mapping[str, Any], Mapping[str, np.ndarray]]
#: One RPC method of a service: gets the decoded request, returns the reply; raises
#: :class:`InvalidRequest` or :class:`PreconditionFailed` to refuse it (see :func:`dispatch`).
Handler = Callable[[Frame], Reply]

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
        save_timeout: deadline of a call whose work grows with a ps task's whole shard, in seconds: a
            checkpoint's ``SaveShard`` and ``LoadShard``, and a non-chief's wait for the chief's restore or
            initial checkpoint (``--save-timeout``). A task that dies fails such a call at once (its connection
            breaks); only a task that hangs is waited for that long.
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
    save_timeout: float = 600.0
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
    """The calling surface of a connection to one task's service, whatever the carrier.

    Opened by :func:`psflow.rpc.registry.open_channel` (gRPC, TCP) or built
    directly (:class:`~psflow.rpc.inprocess.InProcessChannel`).
    """

    task: str
    address: str

    def wait_ready(self, timeout: float | None = None) -> None: ...

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> PendingReply: ...

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ServeConfig:
    """What a carrier's server serves, where and how (:func:`psflow.rpc.registry.serve`).

    Attributes:
        task_name: the serving task, e.g. ``/job:ps/task:0``: in every error text and log line.
        bind_address: ``host:port`` to listen on (port 0: a free one; see :attr:`CarrierServer.port`).
        services: service name -> method name -> handler. A carrier without
            service names on its wire (tcp) serves exactly one.
        token: the cluster token every call must carry (``None``: no check).
        tls: serve over TLS with this certificate (``None``: plain text; the
            tcp carrier has no TLS and refuses one).
        max_workers: handler threads of a carrier with a pool (grpc); calls run
            concurrently up to this many.
        limits: the carrier's own limits (:class:`~psflow.rpc.tcp_server.TcpLimits`
            for tcp; ``None``: its defaults; grpc has none).
    """

    task_name: str
    bind_address: str
    services: Mapping[str, Mapping[str, Handler]] = field(default_factory=dict)
    token: str | None = None
    tls: TlsConfig | None = None
    max_workers: int = 8
    limits: object | None = None


class CarrierServer(Protocol):
    """A carrier's server, built (bound to :attr:`port`) by :func:`psflow.rpc.registry.serve`."""

    #: The port it is bound to (the one picked when ``bind_address`` asked for port 0).
    port: int

    def start(self) -> None:
        """Starts serving calls; idempotent."""

    def stop(self, grace: float = 0.5) -> None:
        """Stops serving (calls in flight get ``grace`` seconds) and releases the port; idempotent."""

    def stats(self) -> dict[str, Any] | None:
        """The carrier's own counters (connections accepted, refused ...), a snapshot; ``None``: it keeps none."""


class RpcError(PsflowError):
    """Base of every error raised by a remote call."""


class TaskUnavailableError(RpcError):
    """A remote task could not be reached (not up yet, or dead)."""


class InvalidArgumentError(RpcError):
    """The remote task refused a malformed request (gRPC INVALID_ARGUMENT)."""


class FailedPreconditionError(RpcError):
    """The request conflicts with the remote state, e.g. a different layout."""


class FencedOffError(FailedPreconditionError):
    """The remote task refused a request whose fencing token it has seen superseded (gRPC ABORTED, the status of a
    failed sequencer check): a leader's lease epoch below a newer leader's, a restore's generation another restore
    replaced. A FailedPreconditionError too, as these refusals were before they had a status of their own; told
    from any other conflict with the task's state by its status, never by its text."""


class DeadlineExceededError(RpcError):
    """The call did not finish within its deadline."""


class UnauthenticatedError(RpcError):
    """The remote task refused the call's cluster token."""


class RemoteError(RpcError):
    """Any other failure reported by the remote task."""


class ListenError(RpcError, RuntimeError):
    """A server cannot listen on its task's address (the port is in use, or the host is not this
    machine's); the message names the task, the address and why. A RuntimeError too, as it was.

    ``port_taken``: the port, when another process held it at the time of the failure (a bind said
    EADDRINUSE); None for any other reason. The local launcher starts its cluster again on new ports
    then (:mod:`psflow.launch.port_retry`)."""

    def __init__(self, message: str, *, port_taken: int | None = None) -> None:
        super().__init__(message)
        self.port_taken = port_taken


class InvalidRequest(PsflowError, ValueError):
    """Raised by a handler: the request is malformed (becomes INVALID_ARGUMENT)."""


class PreconditionFailed(PsflowError):
    """Raised by a handler: the request conflicts with state (FAILED_PRECONDITION)."""


class FencedOff(PreconditionFailed):
    """Raised by a handler: the request's fencing token (a lease epoch, a restore generation) was superseded here
    (becomes ABORTED; the caller gets :class:`FencedOffError`)."""


class Unavailable(PsflowError):
    """Raised by a handler: a task this call depends on cannot be reached now (UNAVAILABLE; the caller may
    retry), e.g. a replicated shard's backup that did not acknowledge a push."""


# ---- the one dispatch ----------------------------------------------------------


class Status(IntEnum):
    """The outcome of a call, as every carrier reports it.

    The values are the status byte of the TCP wire (:mod:`psflow.rpc.tcp`) and
    must not change; the names are gRPC's status codes.
    """

    OK = 0
    INVALID_ARGUMENT = 1
    FAILED_PRECONDITION = 2
    UNAUTHENTICATED = 3
    INTERNAL = 4
    UNAVAILABLE = 5
    DEADLINE_EXCEEDED = 6
    ABORTED = 7


#: The error a caller gets for each status (any status not listed: :class:`RemoteError`).
STATUS_ERRORS: Mapping[Status, type[RpcError]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.FAILED_PRECONDITION: FailedPreconditionError,
    Status.UNAUTHENTICATED: UnauthenticatedError,
    Status.INTERNAL: RemoteError,
    Status.UNAVAILABLE: TaskUnavailableError,
    Status.DEADLINE_EXCEEDED: DeadlineExceededError,
    Status.ABORTED: FencedOffError,
}


@dataclass(frozen=True)
class Refusal:
    """A call that did not produce a reply: its status and the error text a carrier sends back.

    Attributes:
        status: never :attr:`Status.OK`.
        text: ``"<task>: <method>: <why>"``.
        cause: what the handler raised (kept in this process only; not compared).
    """

    status: Status
    text: str
    cause: BaseException | None = field(default=None, compare=False, repr=False)

    def error(self) -> RpcError:
        """The :class:`RpcError` a caller raises for this refusal (:data:`STATUS_ERRORS`)."""
        return STATUS_ERRORS.get(self.status, RemoteError)(self.text)


def refusal(task: str, method: str, error: Exception) -> Refusal:
    """The status and error text of ``error`` raised while serving ``method`` on ``task``: the one mapping.

    ``FrameError`` and ``InvalidRequest`` -> INVALID_ARGUMENT, ``FencedOff`` -> ABORTED, ``PreconditionFailed``
    -> FAILED_PRECONDITION, ``Unavailable`` -> UNAVAILABLE, anything else -> INTERNAL (logged here with its traceback).
    """
    if isinstance(error, FrameError | InvalidRequest):
        return Refusal(Status.INVALID_ARGUMENT, f"{task}: {method}: {error}", error)
    if isinstance(error, FencedOff):
        return Refusal(Status.ABORTED, f"{task}: {method}: {error}", error)
    if isinstance(error, PreconditionFailed):
        return Refusal(Status.FAILED_PRECONDITION, f"{task}: {method}: {error}", error)
    if isinstance(error, Unavailable):
        return Refusal(Status.UNAVAILABLE, f"{task}: {method}: {error}", error)
    log.error("%s: %s failed", task, method, exc_info=error)
    return Refusal(Status.INTERNAL, f"{task}: {method}: internal error: {type(error).__name__}: {error}", error)


def dispatch(task: str, method: str, handler: Handler | None, request: Frame | bytes | memoryview,
             reply: Callable[[Mapping[str, Any], Mapping[str, np.ndarray]], R]) -> R | Refusal:
    """Serves one call: runs ``handler`` on ``request`` and returns ``reply(meta, arrays)``, or the refusal.

    Every carrier serves every call through this function, so a handler's
    error becomes the same status and text over each of them (see the module
    docstring). It blocks as long as the handler does, in the caller's thread;
    it never raises an ``Exception`` (a ``KeyboardInterrupt`` or ``SystemExit``
    goes through).

    Args:
        task: the serving task, first in every error text.
        method: the method called (in every error text).
        handler: the method's handler; ``None``: no such method (INVALID_ARGUMENT).
        request: the decoded frame, or its bytes (decoded here: a malformed
            frame is INVALID_ARGUMENT). Arrays are passed on, never copied.
        reply: turns the handler's reply into what the carrier sends
            (:func:`~psflow.rpc.framing.encode` for a wire; its errors are
            mapped like the handler's).

    Returns:
        What ``reply`` returned, or a :class:`Refusal`.
    """
    try:
        if handler is None:
            raise InvalidRequest(f"unknown method {method!r}")
        meta, arrays = handler(request if isinstance(request, Frame) else decode(request))
        return reply(meta, arrays)
    except Exception as e:  # noqa: BLE001 - a bad request (or a bug) must never kill the server
        return refusal(task, method, e)
