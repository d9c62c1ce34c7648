"""A process of another user that /proc hides (``hidepid=2``, common on shared machines) is alive, not gone.

``kill(pid, 0)`` answers EPERM (it exists, another user's) and ``/proc/<pid>`` is absent (hidden). Before,
:func:`~psflow.checkpoint.holder.holder_alive` read the missing ``/proc/<pid>/stat`` as "exited" and judged it dead:
another user's live run's lock was stale, and a live writer's ``.creating-*`` or incomplete ``ckpt-*`` was removed
as a leftover (:func:`~psflow.checkpoint.leftovers.writer_gone`). The hidden process is simulated: an ended child's
pid (no /proc entry) whose ``kill`` answers EPERM.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
from typing import Any

import pytest

from psflow.checkpoint import holder
from psflow.checkpoint.holder import boot_id, holder_alive, pid_namespace, pid_start
from psflow.checkpoint.leftovers import writer_gone

pytestmark = pytest.mark.timeout(60)


def _ended_child() -> dict[str, Any]:
    """The identity a writer file records of a child process that was started, recorded, and ended."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        identity = {"host": socket.gethostname(), "pid": child.pid, "pid_start": pid_start(child.pid),
                    "boot_id": boot_id(), "pid_ns": pid_namespace()}
    finally:
        child.kill()
        child.wait(30)
    return identity


@pytest.fixture
def hidden(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    identity = _ended_child()
    real = os.kill

    def kill(pid: int, sig: int) -> None:
        if pid == identity["pid"]:
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real(pid, sig)

    monkeypatch.setattr(holder.os, "kill", kill)
    assert not os.path.exists(f"/proc/{identity['pid']}")
    return identity


def test_a_hidden_process_of_another_user_is_alive(hidden: dict[str, Any]) -> None:
    assert holder_alive(hidden) is True
    assert writer_gone(hidden) is False


def test_an_ended_process_is_still_gone(monkeypatch: pytest.MonkeyPatch) -> None:
    identity = _ended_child()
    assert holder_alive(identity) is False
    assert writer_gone(identity) is True
