"""A call to a ps task that died, as a channel returns it: the shared stand-in of the unit tests whose channel
wrappers make a task unreachable for some calls (tests/unit/ps/test_register_unreachable.py,
tests/unit/train/test_chief_register.py, test_restore_within_timeout.py)."""

from __future__ import annotations

from psflow.rpc.api import TaskUnavailableError
from psflow.rpc.framing import Frame


class UnreachableCall:
    """A call to ``task`` (its name) that fails at ``result()`` with what gRPC says of a dead process's address."""

    def __init__(self, task: str, method: str) -> None:
        self.task, self.method = task, method

    def result(self) -> Frame:
        raise TaskUnavailableError(f"{self.task}: {self.method}: UNAVAILABLE: failed to connect to all addresses; "
                                   "last error: UNKNOWN: Connection refused")
