"""The embedded backend's client with replicated ps shards (psflow/coord/embedded.py, issue 28): a call goes to
the member found primary and follows not_primary answers, each member tried at most once per call, even when
two stale members name each other (--ps-replicas 2). Fake members answer from a script; no sockets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest

from psflow.coord import BackendUnavailableError, CoordinationConfig
from psflow.coord.embedded import EmbeddedBackend
from psflow.coord.lease_table import NOT_PRIMARY
from psflow.rpc.api import TaskUnavailableError
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(30)

P, B0, B1 = "/job:ps/task:0", "/job:ps_backup/task:0", "/job:ps_backup/task:1"


class Member:
    """A member's coordination service: ``names`` is None (it is the primary), a member it names as primary,
    or ``"down"`` (unreachable). Counts the calls it received."""

    def __init__(self, task: str, names: str | None, calls: list[str]) -> None:
        self.task, self.address, self.names, self.calls = task, f"address-of-{task}", names, calls

    def call(self, method: str, meta: Mapping[str, Any] | None = None,
             arrays: Mapping[str, np.ndarray] | None = None, *, timeout: float | None = None) -> Frame:
        self.calls.append(self.task)
        if self.names == "down":
            raise TaskUnavailableError(f"{self.task}: down (test)")
        if self.names is None:
            return Frame({"leader": {"candidate": "w0", "epoch": 7}})
        return Frame({NOT_PRIMARY: f"{self.task}: not the primary (test)", "primary": self.names})

    def close(self) -> None:
        """Nothing to close."""


def client(answers: dict[str, str | None], first: str, calls: list[str]) -> EmbeddedBackend:
    members = tuple((m, f"address-of-{m}") for m in (P, B0, B1))
    config = CoordinationConfig("embedded", f"address-of-{first}", members=members)
    return EmbeddedBackend(config, connect=lambda task, address: Member(task, answers[task], calls))


def test_two_stale_members_naming_each_other_do_not_keep_the_call_from_the_primary() -> None:
    calls: list[str] = []
    backend = client({P: None, B0: B1, B1: B0}, B0, calls)
    leader = backend.leader()
    assert leader is not None and leader.epoch == 7
    assert calls == [B0, B1, P]  # before: B0, B1, B0 and no primary found
    calls.clear()
    assert backend.leader() is not None and calls == [P]  # the next call goes to the primary found


def test_each_member_is_tried_once_when_none_answers_as_primary() -> None:
    calls: list[str] = []
    backend = client({P: "down", B0: B1, B1: B0}, B1, calls)
    with pytest.raises(BackendUnavailableError):
        backend.leader()
    assert sorted(calls) == sorted([P, B0, B1]), calls
