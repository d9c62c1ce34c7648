"""The gRPC carrier's client side: one channel per remote task, typed errors, bounded waits.

Registered as ``grpc`` in :mod:`psflow.rpc.registry` (:class:`TaskChannel` is its factory).

Guarantees:
    * :meth:`TaskChannel.wait_ready` retries with exponential backoff and gives
      up after ``connect_timeout`` with :class:`TaskUnavailableError` naming the
      task and its address: tasks may start in any order.
    * Every call has a deadline (``rpc_timeout`` unless given).
    * A call is never retried here: a push must not be applied twice. Callers
      that know a call is idempotent (pull, stats) may retry it themselves.
    * Channels are thread-safe; one channel may carry concurrent calls.
    * Each channel has a connection of its own (gRPC would share one between channels to the same
      address, and its reconnect backoff with it).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

import grpc
import numpy as np

from psflow.rpc.api import (
    MAX_MESSAGE_BYTES,
    STATUS_ERRORS,
    TOKEN_METADATA_KEY,
    ConnectConfig,
    FailedPreconditionError,
    FencedOffError,
    InvalidArgumentError,
    RemoteError,
    RpcError,
    Status,
    TaskUnavailableError,
    UnauthenticatedError,
)
from psflow.rpc.framing import Frame, decode, encode
from psflow.rpc.tls import channel_credentials

__all__ = ["TaskChannel", "PendingCall"]

log = logging.getLogger(__name__)

def _translate(task: str, address: str, method: str, e: grpc.RpcError) -> RpcError:
    """The RpcError of a failed call: chosen by its status code (psflow.rpc.api.STATUS_ERRORS, by name).

    UNIMPLEMENTED, which gRPC itself answers for a method the server does not have, names the address and
    says what it most likely means: another task (not ``task``) listens there, a slip in a cluster file."""
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    status = Status.__members__.get(code.name) if code is not None else None
    cls = STATUS_ERRORS.get(status, RemoteError) if status is not None else RemoteError
    if cls in (InvalidArgumentError, FailedPreconditionError, FencedOffError, UnauthenticatedError):
        return cls(details)  # the server already prefixed task and method
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return cls(f"{task}: {method}: UNIMPLEMENTED: {details} (the process at {address} serves no such call: "
                   f"is another task listening there? check the cluster's address for {task})")
    return cls(f"{task}: {method}: {code.name if code else 'error'}: {details}")


class PendingCall:
    """A call in flight; :meth:`result` blocks until the reply or its deadline."""

    def __init__(self, task: str, method: str, future: Any, address: str = "?") -> None:
        self._task, self._method, self._future, self._address = task, method, future, address

    def result(self) -> Frame:
        """Returns the decoded reply.

        Raises:
            RpcError: the subclass matching the remote status.
        """
        try:
            return decode(self._future.result())
        except grpc.RpcError as e:
            raise _translate(self._task, self._address, self._method, e) from e


#: The method :meth:`TaskChannel.wait_ready` calls: no psflow service has it, so gRPC answers UNIMPLEMENTED.
_READY_PROBE = "ReadyProbe"


def _ms(seconds: float) -> int:
    return max(100, int(seconds * 1000))  # gRPC's floor for a sane retry loop: 0.1 s


class TaskChannel:
    """The connection to one remote task's service."""

    def __init__(self, task: str, address: str, service: str, config: ConnectConfig) -> None:
        """Opens a channel (lazily connected).

        Args:
            task: the task name, e.g. ``/job:ps/task:1``, used in errors and logs.
            address: ``host:port``.
            service: the gRPC service name.
            config: timeouts, backoff and token.
        """
        self.task = task
        self.address = address
        self._service = service
        self._config = config
        self._open()

    def _open(self) -> None:
        config, address = self._config, self.address
        options: list[tuple[str, Any]] = [
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.enable_retries", 0),
            # gRPC backs a failing channel's reconnects off up to 120 s by default: a channel made before
            # its task listened (or while it was down) then saw it come up minutes late.
            ("grpc.initial_reconnect_backoff_ms", _ms(min(config.backoff_initial, config.backoff_max))),
            ("grpc.max_reconnect_backoff_ms", _ms(config.backoff_max)),
            # Its own connection: with gRPC's process-wide pool, channels to one address with the same options
            # share one, and its reconnect backoff; reconnect() then got no fresh try while another channel to
            # the task lived (the launcher's chaos thread saw a serving ps task refuse it for up to 2 s).
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if config.tls is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            if config.tls.server_name:
                options.append(("grpc.ssl_target_name_override", config.tls.server_name))
            self._channel = grpc.secure_channel(address, channel_credentials(config.tls), options=options)
        self._metadata = ((TOKEN_METADATA_KEY, config.token),) if config.token else None
        self._methods: dict[str, Any] = {}

    def wait_ready(self, timeout: float | None = None) -> None:
        """Blocks until the task accepts connections.

        Args:
            timeout: seconds; defaults to ``config.connect_timeout``.

        Raises:
            TaskUnavailableError: not reachable within the timeout, or the channel was closed.
        """
        limit = self._config.connect_timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        wait = self._config.backoff_initial
        attempt = 0
        while True:
            attempt += 1
            remaining = deadline - time.monotonic()
            if self._probe(max(0.01, min(wait, remaining))):
                return
            if time.monotonic() >= deadline:
                raise TaskUnavailableError(
                    f"timed out after {limit:.1f} s waiting for {self.task} at {self.address} ({attempt} attempts)"
                )
            if attempt % 10 == 0:
                log.info("still waiting for %s at %s (attempt %d)", self.task, self.address, attempt)
            wait = min(wait * 2, self._config.backoff_max)

    def _probe(self, timeout: float) -> bool:
        """True once the task's gRPC server answers a call (within ``timeout`` seconds).

        The call names a method no service has, with ``wait_for_ready``: it waits for the channel to connect
        (gRPC keeps trying within its reconnect backoff) and any reply but a timeout or UNAVAILABLE, here
        UNIMPLEMENTED from gRPC itself, proves the server serves; no handler runs. Not
        ``grpc.channel_ready_future``: its connectivity poller thread outlives the future and, when the
        channel is closed soon after (a short-lived client), raises ``ValueError: Channel closed!`` in that
        thread, a traceback in the task's log.

        Raises:
            TaskUnavailableError: the channel was closed.
        """
        try:
            self._method(_READY_PROBE)(b"", timeout=timeout, metadata=self._metadata, wait_for_ready=True)
        except ValueError as e:  # gRPC's "Cannot invoke RPC on closed channel!"
            raise TaskUnavailableError(f"{self.task}: the channel to {self.address} is closed") from e
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            return code not in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE)
        return True

    def _method(self, name: str) -> Any:
        stub = self._methods.get(name)
        if stub is None:
            stub = self._channel.unary_unary(f"/{self._service}/{name}")
            self._methods[name] = stub
        return stub

    def call_async(
        self,
        method: str,
        meta: Mapping[str, Any] | None = None,
        arrays: Mapping[str, np.ndarray] | None = None,
        *,
        timeout: float | None = None,
    ) -> PendingCall:
        """Starts a call and returns at once; see :class:`PendingCall`."""
        fut = self._method(method).future(
            encode(meta, arrays),
            timeout=self._config.rpc_timeout if timeout is None else timeout,
            metadata=self._metadata,
        )
        return PendingCall(self.task, method, fut, self.address)

    def call(
        self,
        method: str,
        meta: Mapping[str, Any] | None = None,
        arrays: Mapping[str, np.ndarray] | None = None,
        *,
        timeout: float | None = None,
    ) -> Frame:
        """Makes a blocking call; never retried.

        Raises:
            RpcError: the subclass matching the remote status.
        """
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def close(self) -> None:
        """Closes the channel; idempotent."""
        self._channel.close()

    def reconnect(self) -> None:
        """Replaces the gRPC channel by a fresh one (same task, address and settings), for pollers
        whose call failed: a failed gRPC channel backs its reconnects off (up to ``backoff_max``), so a
        task that came up meanwhile would stay unseen; a fresh channel, with a connection of its own
        whatever other channels to the task do, tries at the next call. Calls in flight on the old
        channel fail. Not thread-safe against calls on this object."""
        self._channel.close()
        self._open()
