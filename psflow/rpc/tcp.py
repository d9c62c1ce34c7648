"""A lean TCP carrier for the data path (``--transport tcp``).

gRPC's Python stack costs most of a millisecond of CPU per call; a pull or
push of 20,000 rows takes a tenth of that to frame. This transport carries
the same frames (:mod:`psflow.rpc.framing`) to the same handlers over one
plain TCP connection per (client, task), so a ParameterClient can use it
instead of gRPC for every call. The ps task still serves gRPC (control,
discovery, TLS); it advertises this carrier's port in its ``Transport`` reply.

Wire format (all integers little-endian):

    connection start   client: b"PSFT" | u16 n | token (n bytes, UTF-8)
                       server: u8 status (0 ok, 3 unauthenticated, then close)
    request            u32 length | u8 m | method (m bytes) | frame
    reply              u32 length | u8 status | frame (status 0) or UTF-8 error text

Status codes map to the same :class:`~psflow.rpc.api.RpcError` subclasses as
gRPC's: 1 INVALID_ARGUMENT, 2 FAILED_PRECONDITION, 3 UNAUTHENTICATED,
4 INTERNAL. Guarantees: as for gRPC — every call has a deadline, a refused
request changes nothing and the server keeps serving, no pickle; calls are
never retried. No TLS: use gRPC where the network is not trusted.
"""

from __future__ import annotations

import hmac
import logging
import socket
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from psflow.rpc.api import (
    MAX_MESSAGE_BYTES,
    ConnectConfig,
    DeadlineExceededError,
    FailedPreconditionError,
    InvalidArgumentError,
    InvalidRequest,
    PreconditionFailed,
    RemoteError,
    RpcError,
    TaskUnavailableError,
    UnauthenticatedError,
)
from psflow.rpc.framing import Frame, FrameError, decode, encode
from psflow.rpc.grpc_server import Handler

__all__ = ["TcpServer", "TcpChannel"]

log = logging.getLogger(__name__)

_MAGIC = b"PSFT"
_U32 = struct.Struct("<I")
_OK, _INVALID, _PRECONDITION, _UNAUTHENTICATED, _INTERNAL = 0, 1, 2, 3, 4
_ERRORS: dict[int, type[RpcError]] = {
    _INVALID: InvalidArgumentError,
    _PRECONDITION: FailedPreconditionError,
    _UNAUTHENTICATED: UnauthenticatedError,
    _INTERNAL: RemoteError,
}


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ConnectionError("connection closed")
        got += k
    return buf


def _send(sock: socket.socket, *parts: bytes | memoryview) -> None:
    """Sends ``parts`` back to back: gathered by the kernel (``sendmsg``), not joined into a copy first."""
    views = [memoryview(p).cast("B") for p in parts]
    while views:
        sent = sock.sendmsg(views)
        while sent and views:
            if sent >= len(views[0]):
                sent -= len(views.pop(0))
            else:
                views[0], sent = views[0][sent:], 0
        while views and not len(views[0]):
            views.pop(0)


class TcpServer:
    """Serves ``handlers`` over plain TCP, one thread per connection."""

    def __init__(self, host: str, handlers: Mapping[str, Handler], *, task_name: str, token: str | None) -> None:
        """Binds ``host:0`` (a free port) and starts accepting; see :attr:`port`."""
        self._handlers, self._task, self._token = handlers, task_name, token
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, name=f"psflow-tcp-accept {task_name}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name=f"psflow-tcp {self._task}", daemon=True).start()

    def _handshake(self, conn: socket.socket) -> bool:
        head = _recv_exact(conn, 6)
        if bytes(head[:4]) != _MAGIC:
            return False
        token = bytes(_recv_exact(conn, struct.unpack_from("<H", head, 4)[0]))
        ok = self._token is None or hmac.compare_digest(token, self._token.encode())
        conn.sendall(bytes([_OK if ok else _UNAUTHENTICATED]))
        return ok

    def _serve(self, conn: socket.socket) -> None:
        try:
            if not self._handshake(conn):
                return
            while True:
                length = _U32.unpack(_recv_exact(conn, 4))[0]
                if length > MAX_MESSAGE_BYTES:
                    self._reply_error(conn, _INVALID, f"request of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
                    return
                body = memoryview(_recv_exact(conn, length))
                status, payload = self._dispatch(body)
                _send(conn, _U32.pack(len(payload) + 1), bytes([status]), payload)
        except (ConnectionError, OSError):
            pass
        finally:
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _dispatch(self, body: memoryview) -> tuple[int, bytes]:
        method = "?"
        try:
            if len(body) < 1 or len(body) < 1 + body[0]:
                raise FrameError("request too short")
            method = bytes(body[1 : 1 + body[0]]).decode("utf-8", errors="replace")
            handler = self._handlers.get(method)
            if handler is None:
                raise InvalidRequest(f"unknown method {method!r}")
            meta, arrays = handler(decode(body[1 + body[0] :]))
            return _OK, encode(meta, arrays)
        except (FrameError, InvalidRequest) as e:
            return _INVALID, f"{self._task}: {method}: {e}".encode()
        except PreconditionFailed as e:
            return _PRECONDITION, f"{self._task}: {method}: {e}".encode()
        except Exception as e:  # noqa: BLE001 - a bad request must never kill the server
            log.exception("%s: %s failed", self._task, method)
            return _INTERNAL, f"{self._task}: {method}: internal error: {type(e).__name__}: {e}".encode()

    @staticmethod
    def _reply_error(conn: socket.socket, status: int, text: str) -> None:
        data = text.encode()
        _send(conn, _U32.pack(len(data) + 1), bytes([status]), data)

    def close(self) -> None:
        """Stops accepting and closes every connection; idempotent."""
        self._closed.set()
        self._listener.close()
        with self._lock:
            for conn in list(self._conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class _Pending:
    """A sent call (its reply is read by ``result()``) or one that failed to send."""

    def __init__(self, channel: TcpChannel, method: str, error: RpcError | None = None) -> None:
        self._channel, self._method, self._error = channel, method, error

    def result(self) -> Frame:
        if self._error is not None:
            raise self._error
        return self._channel._finish(self._method)


class TcpChannel:
    """A client's connection to one task's :class:`TcpServer` (same surface as TaskChannel).

    A call is sent by :meth:`call_async` and its reply read by ``result()``;
    the channel is held from one to the other, so calls on one channel are
    serialized while calls on different channels overlap.
    """

    def __init__(self, task: str, host: str, port: int, config: ConnectConfig,
                 rediscover: Callable[[], int] | None = None) -> None:
        """Args:
            task: the task's name, for errors.
            host: where its TCP carrier listens.
            port: the carrier's port.
            config: deadlines and token.
            rediscover: asks the task (over gRPC) for its carrier's port again;
                used once when a connection attempt fails, so a task restarted
                on the same gRPC address but a new carrier port is found again.
        """
        self.task = task
        self.address = f"{host}:{port}"
        self._host, self._port, self._config = host, port, config
        self._rediscover = rediscover
        self._sock: socket.socket | None = None
        self._busy = threading.Lock()

    def wait_ready(self, timeout: float | None = None) -> None:
        """Connects (once) and authenticates; raises TaskUnavailableError or UnauthenticatedError."""
        with self._busy:
            self._connect(self._config.connect_timeout if timeout is None else timeout)

    def _connect(self, timeout: float) -> socket.socket:
        if self._sock is not None:
            return self._sock
        try:
            return self._open(timeout)
        except TaskUnavailableError:
            if self._rediscover is None:
                raise
            try:
                port = self._rediscover()
            except RpcError:
                raise TaskUnavailableError(f"{self.task}: its tcp transport at {self.address} is gone and the task "
                                           "does not answer over gRPC") from None
            if port == self._port:
                raise
            log.info("%s: tcp transport moved from port %d to %d", self.task, self._port, port)
            self._port, self.address = port, f"{self._host}:{port}"
            return self._open(timeout)

    def _open(self, timeout: float) -> socket.socket:
        try:
            sock = socket.create_connection((self._host, self._port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            token = (self._config.token or "").encode()
            sock.sendall(_MAGIC + struct.pack("<H", len(token)) + token)
            status = _recv_exact(sock, 1)[0]
        except (OSError, ConnectionError) as e:
            raise TaskUnavailableError(f"{self.task}: cannot reach its tcp transport at {self.address}: {e}") from e
        if status != _OK:
            sock.close()
            raise UnauthenticatedError(f"{self.task}: missing or wrong cluster token")
        self._sock = sock
        return sock

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> _Pending:
        limit = self._config.rpc_timeout if timeout is None else timeout
        frame = encode(meta, arrays)
        name = method.encode()
        # Bounded like every call: a caller that never collected its previous call (a bug) or
        # another thread's long call fails this one after its deadline instead of hanging it.
        if not self._busy.acquire(timeout=limit):
            return _Pending(self, method, DeadlineExceededError(
                f"{self.task}: {method}: the connection stayed busy with an earlier call for {limit:.1f} s"))
        try:
            sock = self._connect(limit)
            sock.settimeout(limit)
            _send(sock, _U32.pack(1 + len(name) + len(frame)), bytes([len(name)]), name, frame)
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
            length = _U32.unpack(_recv_exact(sock, 4))[0]
            body = _recv_exact(sock, length)
        except (OSError, ConnectionError) as e:
            self._drop()
            raise self._error(method, e) from e
        finally:
            self._busy.release()
        if body[0] != _OK:
            raise _ERRORS.get(body[0], RemoteError)(bytes(body[1:]).decode("utf-8", errors="replace"))
        return decode(memoryview(body)[1:])

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
        with self._busy:
            self._drop()
