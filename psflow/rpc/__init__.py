"""psflow.rpc: calls between tasks: handlers, one dispatch, carriers chosen by name.

Files:

* ``api.py``: the interface. :data:`Handler` and :data:`Reply` (a service is a
  table of handlers), :func:`dispatch` (the one mapping of a handler's
  error to a :class:`Status` and the error text), :class:`Channel` and
  :class:`PendingReply` (the calling surface), :class:`CarrierServer` and
  :class:`ServeConfig` (the serving side), :class:`ConnectConfig`, service
  names, and the errors: :class:`RpcError` and its subclasses for callers,
  :class:`InvalidRequest` and :class:`PreconditionFailed` for handlers.
  Imports no carrier library.
* ``registry.py``: :func:`open_channel` and :func:`serve` by carrier name
  (``"grpc"``, ``"tcp"``), importing the chosen carrier lazily.
* ``framing.py``: :class:`Frame` and its bytes (JSON meta plus raw arrays; no pickle).
* ``after_reply.py``: work a handler leaves for after its reply is sent (the tcp carrier runs it in the
  connection's thread; elsewhere the handler does it before replying).
* ``grpc_client.py``, ``grpc_server.py``: the ``grpc`` carrier (every
  service, TLS; :class:`TaskChannel` also serves the control plane).
* ``tcp.py``, ``tcp_server.py``: the ``tcp`` carrier, the lean ps data path
  (its wire, :class:`TcpChannel`; the hardened server and :class:`TcpLimits`).
* ``inprocess.py``: :class:`InProcessChannel`, handlers called directly in
  one process (no address, so not chosen by name).
* ``tls.py``: :class:`TlsConfig` and gRPC credentials from it.

Guarantees (every carrier; tests/unit/rpc/test_carrier_contract.py runs one
contract suite against each):

* A handler's error reaches the caller as the same :class:`RpcError`
  subclass with the same text ``"<task>: <method>: <why>"``, chosen by status,
  never by message text; an unexpected error is INTERNAL
  (:class:`RemoteError`), logged with its traceback, and the server serves on.
* No call is retried here (a push must not be applied twice); every call
  over a network carrier has a deadline (``ConnectConfig.rpc_timeout``).
* With a cluster token, a network carrier runs no handler for a caller
  without it (:class:`UnauthenticatedError`).

Non-guarantees: ordering between calls on different channels; the tcp
carrier serves one call at a time per channel (collect a call before the
next, see :func:`gather`); the in-process carrier checks no token.
"""

from psflow.rpc.api import (
    MAX_MESSAGE_BYTES,
    PARAMETER_SERVICE,
    STATUS_ERRORS,
    WORKER_SERVICE,
    CarrierServer,
    Channel,
    ConnectConfig,
    DeadlineExceededError,
    FailedPreconditionError,
    FencedOff,
    FencedOffError,
    Handler,
    InvalidArgumentError,
    InvalidRequest,
    ListenError,
    PendingReply,
    PreconditionFailed,
    Refusal,
    RemoteError,
    Reply,
    RpcError,
    ServeConfig,
    Status,
    TaskUnavailableError,
    UnauthenticatedError,
    dispatch,
    gather,
)
from psflow.rpc.framing import Frame, FrameError
from psflow.rpc.registry import carrier_names, open_channel, register_carrier, serve

__all__ = [
    "MAX_MESSAGE_BYTES",
    "PARAMETER_SERVICE",
    "STATUS_ERRORS",
    "WORKER_SERVICE",
    "CarrierServer",
    "Channel",
    "ConnectConfig",
    "DeadlineExceededError",
    "FailedPreconditionError",
    "FencedOff",
    "FencedOffError",
    "Frame",
    "FrameError",
    "Handler",
    "InvalidArgumentError",
    "InvalidRequest",
    "ListenError",
    "PendingReply",
    "PreconditionFailed",
    "Refusal",
    "RemoteError",
    "Reply",
    "RpcError",
    "ServeConfig",
    "Status",
    "TaskUnavailableError",
    "UnauthenticatedError",
    "carrier_names",
    "dispatch",
    "gather",
    "open_channel",
    "register_carrier",
    "serve",
]
