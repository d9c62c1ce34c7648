"""A ps task that stops answering (SIGSTOP: a host gone silent) between a save's fence check and its pointer switch
fails the save at the switch without holding the checkpoint directory's mutex past ``MUTEX_TIMEOUT``.

The switch asks every ps task's ``Stats`` under the mutex (psflow/checkpoint/publish_checks.py,
``check_no_restore_since``). Asked one after another at ``--rpc-timeout`` (60 s by default) each, a silent task held
the mutex 60 s: a waiter with a lease epoch (another chief's save, its restore's adopt) went past it after 30 s as
past a process stopped inside it, and in an object store a holder on another host is taken over as stale then, so
two writers were inside at once. Now every task is asked at once with a short deadline: the save fails naming the
task (unreachable: the saver hook waits for the next period), and the waiter gets the mutex.

Real ps processes (``local_cluster``), the chief's client in this process (default ``--rpc-timeout``); the waiter
is a thread of this process (``flock`` on its own descriptor), started while the save holds the mutex.
"""

from __future__ import annotations

import os
import signal
import threading
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
from stopped_process import wait_stopped
from two_ps_client import emb_bias_client

from psflow.checkpoint import save
from psflow.checkpoint.lock import directory_mutex
from psflow.checkpoint.pointer import latest_checkpoint
from psflow.checkpoint.save import CheckpointManager
from psflow.errors import CheckpointError
from psflow.optim import OptimizerSpec

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

OPTIMIZER = OptimizerSpec("sgd", {"learning_rate": 1.0})
#: Generous bound of every wait on another thread (a passing run never meets it).
LIMIT = 200.0


@pytest.mark.parametrize("transport", ["grpc", "tcp"])
def test_a_ps_task_silent_at_the_pointer_switch_fails_the_save_and_never_lets_a_waiter_past_the_mutex(
        local_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, transport: str) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(2)
    client = emb_bias_client(handle, "/job:worker/task:0", transport)
    client.register(OPTIMIZER, chief=True)
    directory = str(tmp_path / "ckpt")
    older = CheckpointManager(directory).save(client)
    pid = handle.procs[("ps", 1)].pid
    real = save.check_no_restore_since
    waited: list[bool] = []
    waiting = threading.Thread(target=lambda: waited.append(_held(directory)), daemon=True)
    stopped = threading.Event()

    def silent_task_1(c: Any, replies: Any, path: str) -> None:  # (under the save's mutex)
        os.kill(pid, signal.SIGSTOP)
        wait_stopped(pid)  # (kill returns before the stop lands: on a busy machine ps:1 answered the check first)
        waiting.start()
        stopped.set()
        real(c, replies, path)

    monkeypatch.setattr(save, "check_no_restore_since", silent_task_1)
    outcome: list[Any] = []

    def saving() -> None:
        try:
            outcome.append(CheckpointManager(directory).save(client))
        except CheckpointError as e:
            outcome.append(e)

    saver = threading.Thread(target=saving, daemon=True)
    try:
        saver.start()
        assert stopped.wait(LIMIT), "the save never reached its pointer switch"
        waiting.join(LIMIT)
        assert not waiting.is_alive() and waited, "the waiter never got past the mutex's wait"
    finally:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    saver.join(LIMIT)
    assert not saver.is_alive() and len(outcome) == 1
    assert waited == [True], "a waiter went past the mutex: the save held it past MUTEX_TIMEOUT asking a silent task"
    assert isinstance(outcome[0], CheckpointError), outcome[0]
    assert "/job:ps/task:1 could not be asked" in str(outcome[0]), outcome[0]
    assert latest_checkpoint(directory) == older.path
    monkeypatch.setattr(save, "check_no_restore_since", real)
    again = CheckpointManager(directory).save(client)  # the task answers again: the next save is made current
    assert latest_checkpoint(directory) == again.path
    client.close()


def _held(directory: str) -> bool:
    """Whether a waiter with a lease epoch got the mutex (False: it went past it, as past a stopped holder)."""
    with directory_mutex(directory, may_pass=True) as held:
        return held
