"""A lean TCP carrier for the data path (``--transport tcp``): the wire and the client side.

gRPC's Python stack costs most of a millisecond of CPU per call; a pull or
push of 20,000 rows takes a tenth of that to frame. This transport carries
the same frames (:mod:`psflow.rpc.framing`) to the same handlers over one
plain TCP connection per (client, task), so a ParameterClient can use it
instead of gRPC for every call. The ps task still serves gRPC (control,
discovery, TLS); it advertises this carrier's port in its ``Transport`` reply.
The server side (timeouts, connection limits, the accept loop) is
:mod:`psflow.rpc.tcp_server`; both are registered as ``tcp`` in
:mod:`psflow.rpc.registry` (:func:`open_channel`, ``tcp_server.serve``).

Wire format (all integers little-endian):

    connection start   client: b"PSFT" | u16 n | token (n bytes, UTF-8)
                       server: u8 status (0 ok; 3 unauthenticated or 5 unavailable
                               (connection limit reached), then close)
    request            u32 length | u8 m | method (m bytes) | frame
    reply              u32 length | u8 status | frame (status 0) or UTF-8 error text

The status byte is a :class:`~psflow.rpc.api.Status` (1 INVALID_ARGUMENT,
2 FAILED_PRECONDITION, 3 UNAUTHENTICATED, 4 INTERNAL, 5 UNAVAILABLE, 7 ABORTED: a fencing token refused), the error
text is :func:`~psflow.rpc.api.dispatch`'s, and the caller gets the same
:class:`~psflow.rpc.api.RpcError` subclass as over gRPC. Guarantees: as for gRPC — every call has a
deadline, a refused request changes nothing and the server keeps serving, no
pickle; calls are never retried. A connection the server closed while it was
idle (its idle timeout) is noticed before the next call is sent and opened
again, as a gRPC channel reconnects. No TLS: use gRPC where the network is not
trusted.

A call waits for no task to come up, as a gRPC call made without ``wait_for_ready`` does: a call on a channel
that has not connected yet asks the task's gRPC server for the carrier's port once, and a task that is not there
(its host refuses the connection) fails the call at once (TaskUnavailableError, "connection refused"), however
long its deadline. Only :meth:`TcpChannel.wait_ready` waits (``connect_timeout``). A replicated shard's client
then follows the shard's view at once (:mod:`psflow.ps.failover`): a client opened after the shard's primary
died (a chief's save client) once waited the call's whole deadline (``--rpc-timeout``, 60 s) for the dead
primary to come up before it could see the backup promoted.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from psflow.errors import ConfigError
from psflow.rpc.api import (
    Channel,
    ConnectConfig,
    DeadlineExceededError,
    FailedPreconditionError,
    Refusal,
    RpcError,
    Status,
    TaskUnavailableError,
    UnauthenticatedError,
)
from psflow.rpc.framing import Frame, decode, encode_parts

__all__ = ["TcpChannel", "DEFAULT_IDLE_TIMEOUT", "open_channel", "TRANSPORT_METHOD", "TCP_PORT_KEY"]

log = logging.getLogger(__name__)

# The wire, shared with psflow.rpc.tcp_server (public names, not part of __all__).
HANDSHAKE_MAGIC = b"PSFT"
U32 = struct.Struct("<I")
U16 = struct.Struct("<H")
STATUS_OK, STATUS_INVALID, STATUS_UNAUTHENTICATED = Status.OK, Status.INVALID_ARGUMENT, Status.UNAUTHENTICATED
STATUS_UNAVAILABLE = Status.UNAVAILABLE
_STATUS_BYTES = {int(s): s for s in Status}

#: The ps task's gRPC method that says where its TCP carrier listens: reply meta ``{TCP_PORT_KEY: port}``
#: (``None``: not offered, e.g. under TLS).
TRANSPORT_METHOD = "Transport"
TCP_PORT_KEY = "tcp_port"

#: Seconds a server keeps an authenticated connection that sends nothing (psflow.rpc.tcp_server.TcpLimits).
DEFAULT_IDLE_TIMEOUT = 600.0
#: A client opens a new connection rather than reuse one idle this long, well inside the server's default
#: idle timeout, so that a call never races the server's idle close (see TcpChannel.call_async).
_REUSE_IDLE_LIMIT = DEFAULT_IDLE_TIMEOUT / 2
#: Idle longer than this (seconds), a connection is checked (one non-blocking peek) before it is reused:
#: a server with a shorter idle timeout than the default may have closed it. Below MIN_IDLE_TIMEOUT, so
#: that a connection the server closed for idleness is always checked.
_CHECK_IDLE_AFTER = 0.25
#: The shortest idle timeout a server may have (seconds; see _CHECK_IDLE_AFTER).
MIN_IDLE_TIMEOUT = 1.0
#: Buffers one ``sendmsg`` takes at most (Linux's IOV_MAX; more fail with EMSGSIZE).
_IOV_MAX = 1024


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Reads exactly ``n`` bytes (blocking, under the socket's timeout); ConnectionError at EOF."""
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed")
        got += k
    return buf


def readable(sock: socket.socket) -> bool:
    """Whether bytes wait unread on ``sock`` (never blocks; False at EOF or on an error)."""
    try:
        return bool(sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:  # BlockingIOError: nothing waits
        return False


def send_parts(sock: socket.socket, *parts: bytes | memoryview) -> None:
    """Sends ``parts`` back to back: gathered by the kernel (``sendmsg``), not joined into a copy first,
    at most ``_IOV_MAX`` of them per ``sendmsg`` (a frame of many arrays has more pieces than the kernel
    takes in one call)."""
    views = [v for v in (memoryview(p).cast("B") for p in parts) if len(v)]
    first = 0
    while first < len(views):
        sent = sock.sendmsg(views[first:first + _IOV_MAX])
        while sent and first < len(views):
            if sent >= len(views[first]):
                sent -= len(views[first])
                first += 1
            else:
                views[first], sent = views[first][sent:], 0


class _Pending:
    """A sent call (its reply is read by ``result()``) or one that failed to send."""

    def __init__(self, channel: TcpChannel, method: str, error: RpcError | None = None) -> None:
        self._channel, self._method, self._error = channel, method, error

    def result(self) -> Frame:
        if self._error is not None:
            raise self._error
        return self._channel._finish(self._method)


class _OverLimitError(TaskUnavailableError):
    """The task refused the connection: it serves as many as its limit allows (not asked again at once)."""


class TcpChannel:
    """A client's connection to one task's TCP carrier (same surface as TaskChannel).

    A call is sent by :meth:`call_async` and its reply read by ``result()``;
    the channel is held from one to the other, so calls on one channel are
    serialized while calls on different channels overlap. The connection is
    opened on first use and again after it failed or the server closed it
    while idle (checked before a call is sent, so no call is lost to it).
    Thread-safe; :meth:`close` never blocks.
    """

    def __init__(self, task: str, host: str, port: int | None, config: ConnectConfig,
                 discovery: Channel | None = None) -> None:
        """Args:
            task: the task's name, for errors.
            host: where its TCP carrier listens.
            port: the carrier's port (``None``: asked of ``discovery`` when it first connects).
            config: deadlines and token.
            discovery: the task's gRPC channel, owned (and closed) by this one:
                asked where the carrier listens (:data:`TRANSPORT_METHOD`) when
                the port is not known yet, and once more when a connection
                attempt fails, so a task restarted on the same gRPC address but
                a new carrier port is found again.

        Raises:
            ValueError: neither a port nor a discovery channel.
        """
        if port is None and discovery is None:
            raise ValueError(f"{task}: a tcp channel needs the carrier's port or a channel to ask it of")
        self.task = task
        #: ``host:port`` of the carrier (the port is ``?`` until asked of the discovery channel).
        self.address = f"{host}:{'?' if port is None else port}"
        self._host, self._port, self._config = host, port, config
        self._discovery = discovery
        self._sock: socket.socket | None = None
        self._busy = threading.Lock()
        self._closed = False
        self._last_reply = 0.0  # time.monotonic() when the connection last finished a call

    def _closed_error(self, what: str) -> TaskUnavailableError:
        return TaskUnavailableError(f"{self.task}: {what}: the channel to {self.address} is closed")

    def wait_ready(self, timeout: float | None = None) -> None:
        """Blocks until the task accepts a connection and authenticates it (``timeout`` s; None:
        ``connect_timeout``), as the gRPC channel's ``wait_ready`` does: a failed attempt (nothing listens yet,
        the task died in the middle of the handshake) is tried again with exponential backoff
        (``backoff_initial`` .. ``backoff_max``) until the timeout. A task that refuses the connection
        because it serves as many as ``--tcp-max-connections`` allows is not asked again.

        Raises:
            TaskUnavailableError: not reachable within the timeout (the last attempt's error), or the channel
                is closed.
            UnauthenticatedError: the task refused the cluster token (not tried again).
        """
        limit = self._config.connect_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        wait = self._config.backoff_initial
        while True:
            if self._closed:
                raise self._closed_error("connect")
            try:
                with self._busy:
                    self._connect(max(0.01, deadline - time.monotonic()), wait=True)
                return
            except TaskUnavailableError as e:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._closed or isinstance(e, _OverLimitError):
                    raise
                time.sleep(min(wait, remaining))
                wait = min(wait * 2, self._config.backoff_max)

    def _connect(self, timeout: float, *, wait: bool = False) -> socket.socket:
        """The connection, opened if there is none (``timeout`` s at most). ``wait``
        (:meth:`wait_ready`): a port not known yet is asked once the task's gRPC server is up; else (a call)
        it is asked at once, and a task not there fails the call now, never after its whole deadline."""
        if self._sock is not None:
            return self._sock
        discovery = self._discovery
        if self._port is None and discovery is not None:
            if wait:
                discovery.wait_ready(timeout)
            self._moved_to(self._ask_port(discovery, timeout))
        try:
            return self._open(timeout)
        except TaskUnavailableError as unreached:
            if discovery is None:
                raise
            try:
                port = self._ask_port(discovery, timeout)
            except RpcError:
                # The socket's own words (e.g. "Connection refused": nothing listens there) are kept: a replicated
                # shard's client takes a refused connection as its member's process gone (psflow.ps.failover).
                raise TaskUnavailableError(f"{self.task}: its tcp transport at {self.address} is gone and the task "
                                           f"does not answer over gRPC ({unreached})") from None
            if port == self._port:
                raise
            self._moved_to(port)
            return self._open(timeout)

    def _ask_port(self, discovery: Channel, timeout: float) -> int:
        """The carrier's port, asked of the task over gRPC."""
        port = discovery.call(TRANSPORT_METHOD, timeout=min(5.0, timeout)).meta.get(TCP_PORT_KEY)
        if isinstance(port, bool) or not isinstance(port, int):
            raise FailedPreconditionError(f"{self.task}: offers no tcp transport (it serves TLS, or is no ps "
                                          "task): use the grpc transport")
        return port

    def _moved_to(self, port: int) -> None:
        if self._port is not None:
            log.info("%s: tcp transport moved from port %d to %d", self.task, self._port, port)
        self._port, self.address = port, f"{self._host}:{port}"

    def _open(self, timeout: float) -> socket.socket:
        try:
            sock = socket.create_connection((self._host, self._port), timeout=timeout)
        except OSError as e:
            raise TaskUnavailableError(f"{self.task}: cannot reach its tcp transport at {self.address}: {e}") from e
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            token = (self._config.token or "").encode()
            sock.sendall(HANDSHAKE_MAGIC + U16.pack(len(token)) + token)
            status = recv_exact(sock, 1)[0]
        except (OSError, ConnectionError) as e:
            sock.close()
            raise TaskUnavailableError(f"{self.task}: cannot reach its tcp transport at {self.address}: {e}") from e
        if status == STATUS_UNAVAILABLE:
            sock.close()
            raise _OverLimitError(f"{self.task}: its tcp transport at {self.address} refused the connection: "
                                       "it serves as many connections as its limit allows (--tcp-max-connections)")
        if status != STATUS_OK:
            sock.close()
            raise UnauthenticatedError(f"{self.task}: missing or wrong cluster token")
        self._sock, self._last_reply = sock, time.monotonic()
        return sock

    def _reusable(self, sock: socket.socket) -> bool:
        """Whether an open connection may carry the next call (False: the server closed it, or it idled too long).

        A request/reply stream has nothing to read between calls, so anything
        readable then (end of stream, a reset, stray bytes) means the server
        let go of it; one non-blocking peek, only after a quarter second of idleness.
        """
        idle = time.monotonic() - self._last_reply
        if idle < _CHECK_IDLE_AFTER:
            return True
        if idle > _REUSE_IDLE_LIMIT:
            return False
        try:
            sock.settimeout(0.0)
            sock.recv(1, socket.MSG_PEEK)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> _Pending:
        limit = self._config.rpc_timeout if timeout is None else timeout
        # The frame in pieces (its arrays' own memory), gathered by sendmsg: no joined copy of the arrays
        frame, size = encode_parts(meta, arrays)
        name = method.encode()
        # Bounded like every call: a caller that never collected its previous call (a bug) or
        # another thread's long call fails this one after its deadline instead of hanging it.
        if self._closed:
            return _Pending(self, method, self._closed_error(method))
        if not self._busy.acquire(timeout=limit):
            return _Pending(self, method, DeadlineExceededError(
                f"{self.task}: {method}: the connection stayed busy with an earlier call for {limit:.1f} s"))
        try:
            if self._closed:
                raise self._closed_error(method)
            if self._sock is not None and not self._reusable(self._sock):
                self._drop()
            sock = self._connect(limit)
            sock.settimeout(limit)
            send_parts(sock, U32.pack(1 + len(name) + size), bytes([len(name)]) + name, *frame)
        except (RpcError, OSError, ConnectionError) as e:
            # Like a gRPC future, a call that cannot be sent fails at result(), never here:
            # a caller may have other calls in flight that it still has to collect.
            self._drop()
            self._busy.release()
            return _Pending(self, method, e if isinstance(e, RpcError) else self._error(method, e))
        except BaseException:
            self._drop()
            self._busy.release()
            raise
        return _Pending(self, method)

    def _finish(self, method: str) -> Frame:
        try:
            sock = self._sock
            if sock is None:
                raise ConnectionError("connection closed")
            length = U32.unpack(recv_exact(sock, 4))[0]
            body = recv_exact(sock, length)
            self._last_reply = time.monotonic()
        except (OSError, ConnectionError) as e:
            self._drop()
            raise self._error(method, e) from e
        finally:
            self._busy.release()
        if body[0] != STATUS_OK:
            status = _STATUS_BYTES.get(body[0], Status.INTERNAL)
            raise Refusal(status, bytes(body[1:]).decode("utf-8", errors="replace")).error()
        # The reply's buffer is this call's alone: its arrays may be the caller's own (a pull's rows, uncopied).
        return decode(memoryview(body)[1:], writable=True)

    def _error(self, method: str, e: BaseException) -> RpcError:
        if isinstance(e, TimeoutError | socket.timeout):
            return DeadlineExceededError(f"{self.task}: {method}: no reply within the deadline")
        return TaskUnavailableError(f"{self.task}: {method}: connection to {self.address} failed: {e}")

    def _drop(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def close(self) -> None:
        """Closes the channel; idempotent; never blocks, never waits for the busy lock.

        Safe from a shutdown path or a signal handler, even while a call holds
        the channel (in another thread, or in this one, interrupted between
        :meth:`call_async` and ``result()``): that call's connection is shut
        down, so its ``result()`` fails promptly, and its file descriptor is
        closed by that call's error path (or with the channel's socket object
        when the call is never collected). Every later call fails with
        TaskUnavailableError. The discovery channel is closed too.
        """
        self._closed = True
        if self._discovery is not None:
            self._discovery.close()
        if self._busy.acquire(blocking=False):
            try:
                self._drop()
            finally:
                self._busy.release()
            return
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # already closed by the call holding the channel
                pass


def tls_refused(task: str) -> ConfigError:
    """The error of asking the tcp carrier for TLS (it has none), naming ``task``."""
    return ConfigError(f"{task}: the tcp transport has no TLS; use the grpc transport with TLS")


def open_channel(task: str, address: str, service: str, config: ConnectConfig) -> TcpChannel:
    """The tcp carrier's client side (the registry's ``tcp`` entry): a channel to ``task``'s TCP carrier.

    Opens nothing yet: the first call (or :meth:`TcpChannel.wait_ready`) waits
    for the task's gRPC server at ``address``, asks it where the carrier
    listens (:data:`TRANSPORT_METHOD` of ``service``) and connects there.

    Raises:
        ConfigError: ``config`` asks for TLS (the tcp carrier is clear text).
    """
    if config.tls is not None:
        raise tls_refused(task)
    from psflow.rpc.grpc_client import TaskChannel  # grpc only when a tcp channel is opened

    host = address.rsplit(":", 1)[0].strip("[]")
    return TcpChannel(task, host, None, config, TaskChannel(task, address, service, config))
