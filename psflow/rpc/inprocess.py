"""In-process transport: a client calls a service's handlers directly.

:class:`InProcessChannel` has the calling surface of
:class:`~psflow.rpc.grpc_client.TaskChannel` (``call``, ``call_async``,
``wait_ready``, ``close``), so a :class:`~psflow.ps.client.ParameterClient`
runs unchanged on top of it, but nothing is encoded, copied or sent: the
handler gets the caller's arrays and the caller gets the handler's. This is
the fast path of a run in one process (``psflow train --in-process``).

Guarantees: every call goes through :func:`~psflow.rpc.api.dispatch`, so a
handler's error becomes the same :class:`~psflow.rpc.api.RpcError` subclass
as over gRPC, with the same message (its ``__cause__`` is what the handler
raised); no token is checked (there is no network). ``call_async`` runs the call at once, in the caller's thread,
so a call that blocks (a sync-mode push) blocks there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from psflow.rpc.api import Handler, Refusal, RpcError, dispatch
from psflow.rpc.framing import Frame

__all__ = ["InProcessChannel"]


class _Done:
    """A call that has already finished (the in-process PendingCall)."""

    def __init__(self, outcome: Frame | RpcError) -> None:
        self._outcome = outcome

    def result(self) -> Frame:
        if isinstance(self._outcome, RpcError):
            raise self._outcome
        return self._outcome


def _as_frame(meta: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> Frame:
    return Frame(dict(meta), dict(arrays))


class InProcessChannel:
    """Calls the handlers of one service living in this process."""

    def __init__(self, task: str, handlers: Mapping[str, Handler]) -> None:
        self.task = task
        self.address = "in-process"
        self._handlers = handlers

    def wait_ready(self, timeout: float | None = None) -> None:
        """Returns at once: the service is in this process."""

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None,
                   arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> _Done:
        out = dispatch(self.task, method, self._handlers.get(method), Frame(dict(meta or {}), dict(arrays or {})),
                       _as_frame)
        if isinstance(out, Refusal):
            error = out.error()
            error.__cause__ = out.cause
            return _Done(error)
        return _Done(out)

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def close(self) -> None:
        """Nothing to close."""
