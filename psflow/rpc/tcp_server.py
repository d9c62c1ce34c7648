"""The server side of the TCP carrier (``--transport tcp``), built to survive hostile and broken peers.

How it holds its resources:

* One thread (``psflow-tcp-accept <task>``) runs a selector loop that accepts
  connections and reads their handshakes without blocking. A connection still
  in its handshake holds a file descriptor and a few bytes of buffer, never a
  thread.
* A connection that presented the cluster token gets a thread of its own,
  which serves its calls in order, up to ``max_connections`` such connections.
  What a handler leaves for after its reply (:mod:`psflow.rpc.after_reply`)
  runs in that thread once the reply is sent, before the next call is read;
  it can ask whether that call's request has arrived already
  (:func:`~psflow.rpc.after_reply.request_waiting`: a ``MSG_PEEK``).

Guarantees (limits from :class:`TcpLimits`):

* An unauthenticated peer never holds a thread, and holds its connection for
  at most ``handshake_timeout`` seconds; at most ``max_handshakes``
  connections are in their handshake at once (one more closes the oldest).
* At most ``max_connections`` authenticated connections are served at once;
  one more is refused with status 5 (UNAVAILABLE), which
  :class:`~psflow.rpc.tcp.TcpChannel` reports as TaskUnavailableError.
* An authenticated connection that sends nothing for ``idle_timeout`` seconds
  is closed; TcpChannel notices that before its next call and reconnects.
* The accept loop survives every error of ``accept()``: on EMFILE, ENFILE,
  ENOBUFS, ENOMEM (and any other unexpected OSError) it logs, stops
  accepting for a short backoff (50 ms doubling to 1 s) while it keeps
  reading the handshakes in progress, then accepts again. Only
  :meth:`TcpServer.close` ends it.
* Every refusal and drop is counted (:meth:`TcpServer.stats`) and logged, each
  kind at most once per 10 s (with the running count).
"""

from __future__ import annotations

import errno
import hmac
import logging
import selectors
import socket
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from psflow.errors import ConfigError
from psflow.rpc import after_reply
from psflow.rpc.api import MAX_MESSAGE_BYTES, Handler, Refusal, ServeConfig, dispatch, refusal
from psflow.rpc.framing import FrameError, encode_parts
from psflow.rpc.tcp import (
    DEFAULT_IDLE_TIMEOUT,
    HANDSHAKE_MAGIC,
    MIN_IDLE_TIMEOUT,
    STATUS_INVALID,
    STATUS_OK,
    STATUS_UNAUTHENTICATED,
    STATUS_UNAVAILABLE,
    U16,
    U32,
    readable,
    recv_exact,
    send_parts,
    tls_refused,
)

__all__ = ["TcpLimits", "TcpServer", "serve"]

log = logging.getLogger(__name__)

#: A token longer than this (bytes) is refused unread: cluster tokens are a few dozen bytes.
_MAX_TOKEN_BYTES = 4096
_HEADER = len(HANDSHAKE_MAGIC) + U16.size
#: Backoff of the accept loop after accept() failed (EMFILE ...): first wait and cap, seconds.
_BACKOFF_INITIAL, _BACKOFF_MAX = 0.05, 1.0
#: accept() errors that concern one connection only (retried at once, no backoff).
_PER_CONNECTION_ERRORS = {errno.ECONNABORTED, errno.EPROTO, errno.EPERM}
#: Seconds between two log lines of the same kind of refusal.
_LOG_EVERY = 10.0
#: struct timeval (SO_RCVTIMEO, SO_SNDTIMEO): seconds, microseconds.
_TIMEVAL = struct.Struct("@ll")
#: Connections accepted in one turn of the loop, before the handshakes in progress get their turn.
_ACCEPT_BATCH = 64


@dataclass(frozen=True)
class TcpLimits:
    """Limits of a :class:`TcpServer` (``psflow server --tcp-*`` flags).

    Attributes:
        handshake_timeout: seconds a new connection has to present the magic
            and the token before it is closed (10: a handshake takes well
            under a millisecond on a working network).
        idle_timeout: seconds an authenticated connection may send nothing
            before it is closed (600; at least 1). Harmless to a client: a call in
            progress is never idle (the server is busy with it, a sync wait
            included), and TcpChannel reopens a connection the server closed
            (and does not reuse one idle for more than 300 s).
        max_connections: authenticated connections served at once, one thread
            each (1024; a client holds one per ps task).
        max_handshakes: connections in their handshake at once (128).
    """

    handshake_timeout: float = 10.0
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    max_connections: int = 1024
    max_handshakes: int = 128

    def __post_init__(self) -> None:
        for name, least in (("handshake_timeout", 1e-3), ("idle_timeout", MIN_IDLE_TIMEOUT)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= least:
                raise ValueError(f"TcpLimits.{name} must be a number of seconds >= {least:g}, got {value!r}")
        for name in ("max_connections", "max_handshakes"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"TcpLimits.{name} must be an integer >= 1, got {value!r}")


class _Events:
    """Counts what happened to connections and logs each kind at most once per ``_LOG_EVERY`` seconds."""

    KINDS = ("accepted", "authenticated", "refused_unauthenticated", "refused_bad_handshake", "handshake_timeouts",
             "handshakes_dropped", "refused_over_limit", "idle_closed", "accept_errors")

    def __init__(self, task: str) -> None:
        self._task = task
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.KINDS, 0)
        self._logged: dict[str, float] = {}

    def add(self, kind: str, level: int | None = None, message: str = "") -> None:
        """Counts one event of ``kind``; logs ``message`` at ``level`` unless that kind was logged recently."""
        now = time.monotonic()
        with self._lock:
            self._counts[kind] += 1
            total = self._counts[kind]
            if level is None or now - self._logged.get(kind, -_LOG_EVERY) < _LOG_EVERY:
                return
            self._logged[kind] = now
        log.log(level, "%s: tcp transport: %s (%s: %d so far)", self._task, message, kind, total)

    def counts(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


class _Handshake:
    """A connection in its handshake: what it sent so far and until when it may send the rest."""

    __slots__ = ("peer", "deadline", "buf", "need")

    def __init__(self, peer: str, deadline: float) -> None:
        self.peer, self.deadline = peer, deadline
        self.buf = bytearray()
        self.need = _HEADER


def _peer(address: Any) -> str:
    return f"{address[0]}:{address[1]}" if isinstance(address, tuple) and len(address) >= 2 else str(address)


def _send_status(conn: socket.socket, status: int) -> None:
    """Best effort: one byte into a fresh connection's empty send buffer, then close."""
    try:
        conn.send(bytes([status]))
    except OSError:
        pass
    conn.close()


class TcpServer:
    """Serves ``handlers`` over TCP: handshakes on one selector thread, a thread per authenticated connection.

    See the module docstring for the limits and guarantees.
    """

    def __init__(self, host: str, handlers: Mapping[str, Handler], *, task_name: str, token: str | None,
                 limits: TcpLimits | None = None, port: int = 0, start: bool = True) -> None:
        """Binds ``host:port`` and (with ``start``) starts accepting; see :attr:`port`.

        Args:
            host: the address to listen on.
            handlers: method name -> handler (the ps task's ParameterService).
            task_name: e.g. ``/job:ps/task:0``, in every error and log line.
            token: the cluster token a connection must present (``None``: any).
            limits: timeouts and connection limits (default :class:`TcpLimits`).
            port: the port to bind (0: a free one).
            start: start accepting now (False: at :meth:`start`; the port is bound either way).
        """
        self._handlers, self._task, self._token = handlers, task_name, token
        self.limits = limits or TcpLimits()
        self._listener = socket.create_server((host, port))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._closed = threading.Event()
        self._serving: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._events = _Events(task_name)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._pending: dict[socket.socket, _Handshake] = {}  # oldest first; only the loop thread touches it
        self._selector = selectors.DefaultSelector()
        self._backoff = 0.0
        self._resume_at: float | None = None  # accepting paused until then (after an accept() error)
        self._loop = threading.Thread(target=self._run, name=f"psflow-tcp-accept {task_name}", daemon=True)
        if start:
            self.start()

    def start(self) -> None:
        """Starts accepting connections (the accept loop's thread); idempotent, a no-op once closed."""
        with self._lock:
            if self._loop.ident is None and not self._closed.is_set():
                self._loop.start()

    # ---- accept loop (one thread) -------------------------------------------
    def _run(self) -> None:
        sel = self._selector
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        sel.register(self._listener, selectors.EVENT_READ, None)
        try:
            while not self._closed.is_set():
                try:
                    self._turn()
                except Exception as e:  # noqa: BLE001 - a bug must not end the loop: log it and go on
                    self._events.add("accept_errors", logging.ERROR,
                                     f"the accept loop failed ({type(e).__name__}: {e}); going on")
                    time.sleep(_BACKOFF_MAX)
        finally:
            for conn in list(self._pending):
                self._forget(conn)
                conn.close()
            sel.close()
            self._listener.close()
            self._wake_r.close()

    def _turn(self) -> None:
        """One turn of the loop: wait for readiness or the next deadline, then accept, read, expire."""
        for key, _ in self._selector.select(self._wait()):
            if key.fileobj is self._listener:
                self._accept()
            elif isinstance(key.data, _Handshake):
                self._read_handshake(key.fileobj, key.data)  # type: ignore[arg-type]
        now = time.monotonic()
        self._expire(now)
        if self._resume_at is not None and now >= self._resume_at and not self._closed.is_set():
            self._resume_at = None
            self._selector.register(self._listener, selectors.EVENT_READ, None)

    def _wait(self) -> float | None:
        """Seconds until the next handshake deadline or the end of an accept backoff (None: no such event)."""
        times = [self._resume_at] if self._resume_at is not None else []
        if self._pending:
            times.append(next(iter(self._pending.values())).deadline)  # oldest first: the earliest deadline
        return max(0.0, min(times) - time.monotonic()) if times else None

    def _accept(self) -> None:
        for _ in range(_ACCEPT_BATCH):
            try:
                conn, address = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if self._closed.is_set():
                    return
                if e.errno in _PER_CONNECTION_ERRORS:
                    self._events.add("accept_errors", logging.INFO, f"accept() failed for one connection: {e}")
                    continue
                self._pause_accepting(e)
                return
            self._backoff = 0.0
            self._events.add("accepted")
            self._start_handshake(conn, _peer(address))

    def _pause_accepting(self, error: OSError) -> None:
        """After accept() failed (EMFILE ...): stop accepting for a backoff, keep serving handshakes."""
        self._backoff = min(max(2 * self._backoff, _BACKOFF_INITIAL), _BACKOFF_MAX)
        self._resume_at = time.monotonic() + self._backoff
        self._selector.unregister(self._listener)
        self._events.add("accept_errors", logging.WARNING,
                         f"accept() failed: {error}; accepting again in {self._backoff:.2f} s "
                         f"({len(self._pending)} connections in their handshake, {len(self._serving)} served)")

    def _start_handshake(self, conn: socket.socket, peer: str) -> None:
        try:
            conn.setblocking(False)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            conn.close()
            return
        if len(self._pending) >= self.limits.max_handshakes:
            oldest = next(iter(self._pending))
            dropped = self._forget(oldest)
            self._events.add("handshakes_dropped", logging.WARNING,
                             f"closed the oldest connection in its handshake ({dropped.peer}) to admit {peer}: "
                             f"{self.limits.max_handshakes} handshakes in progress (max_handshakes)")
            oldest.close()
        hs = _Handshake(peer, time.monotonic() + self.limits.handshake_timeout)
        self._pending[conn] = hs
        self._selector.register(conn, selectors.EVENT_READ, hs)

    def _forget(self, conn: socket.socket) -> _Handshake:
        self._selector.unregister(conn)
        return self._pending.pop(conn)

    def _expire(self, now: float) -> None:
        while self._pending:
            conn, hs = next(iter(self._pending.items()))
            if hs.deadline > now:
                return
            self._forget(conn)
            self._events.add("handshake_timeouts", logging.WARNING,
                             f"closed a connection from {hs.peer} that did not finish its handshake within "
                             f"{self.limits.handshake_timeout:g} s")
            conn.close()

    def _read_handshake(self, conn: socket.socket, hs: _Handshake) -> None:
        try:
            data = conn.recv(hs.need - len(hs.buf))
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:  # the peer gave up (or reset): nothing to answer
            self._forget(conn)
            conn.close()
            return
        hs.buf += data
        if len(hs.buf) == _HEADER:
            size = U16.unpack_from(hs.buf, len(HANDSHAKE_MAGIC))[0]
            if bytes(hs.buf[: len(HANDSHAKE_MAGIC)]) != HANDSHAKE_MAGIC or size > _MAX_TOKEN_BYTES:
                self._forget(conn)
                self._events.add("refused_bad_handshake", logging.WARNING,
                                 f"closed a connection from {hs.peer} that did not start with a psflow handshake")
                conn.close()
                return
            hs.need = _HEADER + size
        if len(hs.buf) == hs.need:
            self._forget(conn)
            self._authenticate(conn, hs.peer, bytes(hs.buf[_HEADER:]))

    def _authenticate(self, conn: socket.socket, peer: str, token: bytes) -> None:
        if self._token is not None and not hmac.compare_digest(token, self._token.encode()):
            # Counted and logged before the refusal is sent: a peer that sees the refusal sees it counted.
            self._events.add("refused_unauthenticated", logging.WARNING,
                             f"refused a connection from {peer}: missing or wrong cluster token")
            _send_status(conn, STATUS_UNAUTHENTICATED)
            return
        with self._lock:
            full = len(self._serving) >= self.limits.max_connections
            if not full:
                self._serving.add(conn)
        if full:
            self._events.add("refused_over_limit", logging.WARNING,
                             f"refused a connection from {peer}: {self.limits.max_connections} connections are "
                             "served already (max_connections)")
            _send_status(conn, STATUS_UNAVAILABLE)
            return
        self._events.add("authenticated")
        try:
            conn.setblocking(True)
            # The idle timeout as the kernel's own receive/send timeouts (EAGAIN when they pass): a Python
            # socket timeout would add a poll() before every recv and send of the data path.
            timeval = _TIMEVAL.pack(int(self.limits.idle_timeout), int(self.limits.idle_timeout % 1 * 1e6))
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
            conn.sendall(bytes([STATUS_OK]))
            threading.Thread(target=self._serve, args=(conn, peer), name=f"psflow-tcp {self._task} {peer}",
                             daemon=True).start()
        except (OSError, RuntimeError) as e:  # RuntimeError: no thread could be started
            log.warning("%s: tcp transport: could not serve %s: %s", self._task, peer, e)
            self._release(conn)

    # ---- one authenticated connection (its own thread) ----------------------
    def _serve(self, conn: socket.socket, peer: str) -> None:
        # Collected for the whole connection, not per call: a call that defers nothing (every call of an
        # unreplicated task) pays one empty-list test.
        try:
            with after_reply.collecting(lambda: readable(conn)) as work:
                while True:
                    length = U32.unpack(recv_exact(conn, 4))[0]
                    if length > MAX_MESSAGE_BYTES:
                        self._reply_error(conn, STATUS_INVALID,
                                          f"request of {length} bytes exceeds {MAX_MESSAGE_BYTES}")
                        return
                    body = memoryview(recv_exact(conn, length))
                    status, payload, size = self._dispatch(body)
                    try:
                        send_parts(conn, U32.pack(size + 1), bytes([status]), *payload)
                    finally:  # what the handler left for after its reply, before this connection's next call
                        if work:
                            after_reply.run(work, self._task,
                                            bytes(body[1 : 1 + body[0]]).decode("utf-8", "replace"))
                            work.clear()
        except BlockingIOError:  # SO_RCVTIMEO / SO_SNDTIMEO passed
            self._events.add("idle_closed", logging.DEBUG,
                             f"closed the connection from {peer}: it sent (or read) nothing for "
                             f"{self.limits.idle_timeout:g} s")
        except (ConnectionError, OSError):
            pass
        finally:
            self._release(conn)

    def _release(self, conn: socket.socket) -> None:
        with self._lock:
            self._serving.discard(conn)
        conn.close()

    def _dispatch(self, body: memoryview) -> tuple[int, list[bytes | memoryview], int]:
        """One request (``u8 m | method | frame``) -> the reply's status byte, its payload in pieces (the
        reply's arrays are sent from their own memory: :func:`~psflow.rpc.framing.encode_parts`) and its length."""
        if len(body) < 1 or len(body) < 1 + body[0]:
            out: tuple[list[bytes | memoryview], int] | Refusal = refusal(self._task, "?",
                                                                         FrameError("request too short"))
        else:
            method = bytes(body[1 : 1 + body[0]]).decode("utf-8", errors="replace")
            out = dispatch(self._task, method, self._handlers.get(method), body[1 + body[0] :], encode_parts)
        if isinstance(out, Refusal):
            text = out.text.encode()
            return out.status, [text], len(text)
        return STATUS_OK, *out

    @staticmethod
    def _reply_error(conn: socket.socket, status: int, text: str) -> None:
        data = text.encode()
        send_parts(conn, U32.pack(len(data) + 1), bytes([status]), data)

    # ---- public ---------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters of accepted, refused and dropped connections, the open ones and the limits (a snapshot)."""
        with self._lock:
            serving = len(self._serving)
        return {**self._events.counts(), "connections": serving, "handshakes_in_progress": len(self._pending),
                "max_connections": self.limits.max_connections, "max_handshakes": self.limits.max_handshakes,
                "handshake_timeout": self.limits.handshake_timeout, "idle_timeout": self.limits.idle_timeout}

    def close(self) -> None:
        """Stops accepting, closes every connection and waits (at most 5 s) for the accept loop; idempotent.

        Calls in progress fail on their clients' side (their connections are
        shut down); may be called from any thread, a signal handler included.
        """
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass
        with self._lock:  # after this, start() starts nothing
            started = self._loop.ident is not None
            for conn in list(self._serving):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        if not started:  # the loop would have closed these
            self._selector.close()
            self._listener.close()
            self._wake_r.close()
        elif threading.current_thread() is not self._loop:
            self._loop.join(timeout=5.0)
        self._wake_w.close()

    def stop(self, grace: float = 0.5) -> None:
        """:meth:`close` (the :class:`~psflow.rpc.api.CarrierServer` surface; calls in flight fail at once,
        ``grace`` is not waited)."""
        self.close()


def serve(config: ServeConfig) -> TcpServer:
    """Binds (does not start) a TCP carrier for the one service in ``config`` (the registry's ``tcp`` entry).

    Raises:
        ConfigError: ``config`` asks for TLS, serves other than one service, or
            its ``limits`` are not :class:`TcpLimits`.
        OSError: the address could not be bound.
    """
    if config.tls is not None:
        raise tls_refused(config.task_name)
    if len(config.services) != 1:
        raise ConfigError(f"{config.task_name}: the tcp transport serves one service (its wire names none), "
                         f"got {len(config.services)}: {', '.join(sorted(config.services))}")
    if config.limits is not None and not isinstance(config.limits, TcpLimits):
        raise ConfigError(f"{config.task_name}: the tcp transport's limits must be TcpLimits, got "
                         f"{type(config.limits).__name__}")
    host, _, port = config.bind_address.rpartition(":")
    (handlers,) = config.services.values()
    return TcpServer(host.strip("[]"), handlers, task_name=config.task_name, token=config.token,
                     limits=config.limits, port=int(port), start=False)
