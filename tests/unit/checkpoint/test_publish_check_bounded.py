"""A save's check of the ps tasks at its pointer switch (psflow/checkpoint/publish_checks.py,
``check_no_restore_since``) runs under the directory's mutex, which another waiter goes past after ``MUTEX_TIMEOUT``
(30 s: a chief with a lease epoch publishes through its own pointer file then; in an object store a holder on another
host is taken over as stale). Every ps task is asked at once, each call with a deadline well under that, never one
after another at ``--rpc-timeout`` (60 s by default) each: a ps task stopped or gone silent between the fence check
and the switch held the mutex for as long (N tasks: N times).

Real in-process ps services; their channels record each ``Stats`` call of the check (its deadline, and whether every
task was asked before the first reply was read).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from two_ps_in_process import SGD, two_ps_cluster

from psflow.checkpoint import lock, save
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.ps.client import ParameterClient

pytestmark = pytest.mark.timeout(60)


class _Asked:
    """What the check's Stats calls did: (task, deadline) sent, and how many were sent when each reply was read."""

    def __init__(self) -> None:
        self.armed = False
        self.sent: list[tuple[int, float | None]] = []
        self.sent_when_read: list[int] = []


class _Read:
    def __init__(self, done: Any, asked: _Asked) -> None:
        self._done, self._asked = done, asked

    def result(self) -> Any:
        self._asked.sent_when_read.append(len(self._asked.sent))
        return self._done.result()


class _Recording:
    """ps task ``task``'s channel, recording the check's Stats calls."""

    def __init__(self, task: int, inner: Any, asked: _Asked) -> None:
        self.task, self._inner, self._asked = inner.task, inner, asked
        self._index = task

    def call_async(self, method: str, meta: Mapping[str, Any] | None = None, arrays: Any = None, *,
                   timeout: float | None = None) -> Any:
        done = self._inner.call_async(method, meta, arrays, timeout=timeout)
        if method != "Stats" or not self._asked.armed:
            return done
        self._asked.sent.append((self._index, timeout))
        return _Read(done, self._asked)

    def call(self, method: str, meta: Mapping[str, Any] | None = None, arrays: Any = None, *,
             timeout: float | None = None) -> Any:
        return self.call_async(method, meta, arrays, timeout=timeout).result()

    def close(self) -> None:
        self._inner.close()


def test_every_ps_task_is_asked_at_once_each_with_a_deadline_well_under_the_mutex_s(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True)
    asked = _Asked()
    client.channels.update({t: _Recording(t, ch, asked) for t, ch in client.channels.items()})
    real = save.check_no_restore_since

    def armed(c: ParameterClient, replies: Any, path: str) -> None:
        asked.armed = True
        try:
            real(c, replies, path)
        finally:
            asked.armed = False

    monkeypatch.setattr(save, "check_no_restore_since", armed)
    saved = CheckpointManager(str(tmp_path), transport="rpc").save(client)
    assert latest_checkpoint(str(tmp_path)) == saved.path
    assert sorted(t for t, _ in asked.sent) == [0, 1], asked.sent
    assert asked.sent_when_read and min(asked.sent_when_read) == 2, (
        f"a reply was read before every ps task was asked (tasks asked at each read: {asked.sent_when_read})")
    deadlines = [d for _, d in asked.sent]
    assert all(d is not None and d <= lock.MUTEX_TIMEOUT / 3 for d in deadlines), (
        f"Stats deadlines {deadlines}: not bounded well under the directory mutex's {lock.MUTEX_TIMEOUT} s")
