"""The gRPC carrier's server side: plain Python handlers served as a generic gRPC service.

Registered as ``grpc`` in :mod:`psflow.rpc.registry` (:func:`serve`). The
framing and the token check happen here; each call then goes through
:func:`psflow.rpc.api.dispatch`, which maps a handler's errors to a status and
its text, and the status becomes the gRPC status code of the same name:

    * a missing or wrong cluster token -> UNAUTHENTICATED (checked here, before dispatch)
    * an unknown method -> UNIMPLEMENTED (answered by gRPC itself)
    * everything else as :func:`~psflow.rpc.api.dispatch` says; the server never dies of a bad request
"""

from __future__ import annotations

import errno
import hmac
import socket
from collections.abc import Callable, Mapping
from concurrent import futures

import grpc

from psflow.rpc.api import (
    MAX_MESSAGE_BYTES,
    TOKEN_METADATA_KEY,
    Handler,
    ListenError,
    Refusal,
    ServeConfig,
    dispatch,
)
from psflow.rpc.framing import encode
from psflow.rpc.tls import TlsConfig, server_credentials

__all__ = ["GrpcServer", "build_grpc_server", "serve"]

GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


def _wrap(task_name: str, method: str, handler: Handler, token: str | None) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    def unary(request: bytes, context: grpc.ServicerContext) -> bytes:
        if token is not None:
            sent = dict(context.invocation_metadata()).get(TOKEN_METADATA_KEY)
            if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), token.encode()):
                context.abort(grpc.StatusCode.UNAUTHENTICATED, f"{task_name}: {method}: missing or wrong cluster token")
        out = dispatch(task_name, method, handler, request, encode)
        if isinstance(out, Refusal):
            context.abort(grpc.StatusCode[out.status.name], out.text)
            raise AssertionError("unreachable")  # context.abort raises
        return out

    return unary


class GrpcServer:
    """A built gRPC server (the ``grpc`` carrier's :class:`~psflow.rpc.api.CarrierServer`)."""

    def __init__(self, server: grpc.Server, port: int) -> None:
        self.server, self.port = server, port
        self._started = self._stopped = False

    def start(self) -> None:
        """Starts serving; idempotent."""
        if not self._started:
            self._started = True
            self.server.start()

    def stop(self, grace: float = 0.5) -> None:
        """Stops serving (calls in flight get ``grace`` seconds) and waits until it has; idempotent."""
        if not self._stopped:
            self._stopped = True
            self.server.stop(grace).wait()

    def stats(self) -> None:
        """None: gRPC keeps its counters to itself."""
        return None


def serve(config: ServeConfig) -> GrpcServer:
    """Builds (does not start) a gRPC server for ``config.services`` (the registry's ``grpc`` entry).

    Raises:
        ListenError: the address could not be bound (names the task, the address and why).
    """
    server, port = build_grpc_server(config.bind_address, config.services, task_name=config.task_name,
                                     token=config.token, max_workers=config.max_workers, tls=config.tls)
    return GrpcServer(server, port)


def build_grpc_server(
    bind_address: str,
    services: Mapping[str, Mapping[str, Handler]],
    *,
    task_name: str,
    token: str | None = None,
    max_workers: int = 8,
    tls: TlsConfig | None = None,
) -> tuple[grpc.Server, int]:
    """Builds (does not start) a gRPC server for ``services``.

    Args:
        bind_address: ``host:port`` to listen on (port 0 picks a free port).
        services: service name -> method name -> handler.
        task_name: e.g. ``/job:ps/task:0``, put in every error message.
        token: cluster token required on every call (``None``: no check).
        max_workers: handler threads; calls run concurrently up to this many.
        tls: serve over TLS with this certificate (``None``: plain text).

    Returns:
        The server and the port it is bound to.

    Raises:
        ListenError: the address could not be bound (names the task, the address and why).
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="psflow-rpc"), options=GRPC_OPTIONS)
    for service, methods in services.items():
        handlers = {
            name: grpc.unary_unary_rpc_method_handler(_wrap(task_name, name, fn, token))
            for name, fn in methods.items()
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    try:
        if tls is None:
            port = server.add_insecure_port(bind_address)
        else:
            port = server.add_secure_port(bind_address, server_credentials(tls))
    except RuntimeError as e:
        raise _listen_error(task_name, bind_address) from e
    if port == 0:
        raise _listen_error(task_name, bind_address)
    return server, port


def _listen_error(task_name: str, address: str) -> ListenError:
    why, taken = _why_not_bound(address)
    return ListenError(f"{task_name}: cannot listen on {address}: {why}", port_taken=taken)


def _why_not_bound(address: str) -> tuple[str, int | None]:
    """Why gRPC could not bind ``host:port`` (its own message only says to set GRPC_VERBOSITY): a plain
    socket's bind says (without SO_REUSEPORT, as gRPC here). Also the port when another process holds it."""
    host, _, port_text = address.rpartition(":")
    host = host.strip("[]")
    try:
        port = int(port_text)
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.bind((host, port))
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            return f"port {port} is already in use (another process listens on it)", port
        if e.errno == errno.EADDRNOTAVAIL:
            return f"{host} is not an address of this machine", None
        return e.strerror or str(e), None
    except ValueError:
        return f"{port_text!r} is not a port", None
    return "gRPC refused it", None
