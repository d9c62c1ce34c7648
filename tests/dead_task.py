"""A call to a ps task that died, as a channel returns it, and a channel whose task dies: the shared stand-ins
of the unit tests that make a task unreachable for some calls (tests/unit/ps/test_register_unreachable.py,
tests/unit/train/test_chief_register.py, test_restore_within_timeout.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from psflow.rpc.api import PendingReply, TaskUnavailableError
from psflow.rpc.framing import Frame


class UnreachableCall:
    """A call to ``task`` (its name) that fails at ``result()`` with what gRPC says of a dead process's address."""

    def __init__(self, task: str, method: str) -> None:
        self.task, self.method = task, method

    def result(self) -> Frame:
        raise TaskUnavailableError(f"{self.task}: {self.method}: UNAVAILABLE: failed to connect to all addresses; "
                                   "last error: UNKNOWN: Connection refused")


class DyingChannel:
    """A channel to a ps task whose calls fail as to a dead process (an :class:`UnreachableCall`) whenever
    :meth:`dies` says so for their method (subclasses decide when); every other call reaches the service."""

    def __init__(self, channel: Any) -> None:
        self.channel, self.task = channel, channel.task

    def dies(self, method: str) -> bool:
        raise NotImplementedError

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None, *args: Any,
                   **kwargs: Any) -> PendingReply:
        if self.dies(method):
            return UnreachableCall(self.task, method)
        return self.channel.call_async(method, meta, *args, **kwargs)

    def call(self, method: str, meta: Mapping[str, Any] | None = None, *args: Any, **kwargs: Any) -> Frame:
        return self.call_async(method, meta, *args, **kwargs).result()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.channel, name)
