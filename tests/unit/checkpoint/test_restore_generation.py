"""restore(..., generation=G) (psflow/checkpoint/restore.py): every LoadShard carries the restore's generation, and a
ps task holding another (a newer restore's BeginRestore came since: this restorer was deposed) refuses it, nothing
changed; the restore fails naming each task, as :class:`RestoreRefusedError` when every task that failed refused by
that fence (a plain CheckpointError when another failure is among them). ps services in this process (tests/two_ps_in_process.py); the same
refusal over real ps processes: tests/integration/test_late_load_and_save_during_restore.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from two_ps_in_process import SGD, train_a_step, two_ps_cluster

from psflow.checkpoint.restore import RestoreRefusedError, restore
from psflow.checkpoint.save import CheckpointManager
from psflow.errors import CheckpointError
from psflow.ps.protocol import BeginRestoreRequest, SetReadyRequest
from psflow.rpc.inprocess import InProcessChannel

pytestmark = pytest.mark.timeout(60)


def test_a_restore_of_a_generation_a_newer_one_replaced_loads_nothing(tmp_path: Path) -> None:
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True)
    saved = CheckpointManager(str(tmp_path), transport="rpc").save(client).path
    train_a_step(client)
    trained = client.pull({"weights": None, "bias": None})
    for task in client.channels:
        client.call(task, BeginRestoreRequest(10))  # restorer A
    for task in client.channels:
        client.call(task, BeginRestoreRequest(20))  # restorer B, the newer lease's holder
    with pytest.raises(RestoreRefusedError, match=rf"^restoring {saved} failed: /job:ps/task:0: LoadShard: LoadShard of "
                                              r"generation 10 refused: /job:ps/task:0 is at generation 20 \(another "
                                              r"restore began here since\); nothing loaded; /job:ps/task:1: "):
        restore(client, saved, generation=10)
    for task in client.channels:
        client.call(task, SetReadyRequest(client.client_name, 20, 1))
    after = client.pull({"weights": None, "bias": None})
    assert all(np.array_equal(after[name], trained[name]) for name in trained)  # A's load changed nothing
    assert client.global_step() == 1


def test_a_first_restore_at_generation_0_and_one_within_the_run_at_its_own_are_loaded(tmp_path: Path) -> None:
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True)
    saved = CheckpointManager(str(tmp_path), transport="rpc").save(client).path
    initial = client.pull({"weights": None, "bias": None})
    train_a_step(client)
    for task in client.channels:
        client.call(task, BeginRestoreRequest(7))
    restore(client, saved, global_step=1, generation=7)
    for task in client.channels:
        client.call(task, SetReadyRequest(client.client_name, 7, 1))
    after = client.pull({"weights": None, "bias": None})
    assert all(np.array_equal(after[name], initial[name]) for name in initial)
    fresh, _ = two_ps_cluster()  # a resumed run's chief: its first restore sends no BeginRestore
    fresh.register(SGD, chief=True, defer_ready=True)
    restore(fresh, saved, generation=0)
    assert np.array_equal(fresh.pull({"weights": None})["weights"], initial["weights"])


def test_a_restore_refused_by_one_task_and_failed_on_another_is_a_plain_checkpoint_error(tmp_path: Path) -> None:
    """Only a refusal by the restore fence on every task that failed says "another restorer took over": a task that
    failed otherwise (here one serving no LoadShard) makes it an ordinary failure, naming both tasks."""
    client, _ = two_ps_cluster()
    client.register(SGD, chief=True)
    saved = CheckpointManager(str(tmp_path), transport="rpc").save(client).path
    for task in client.channels:
        client.call(task, BeginRestoreRequest(20))
    client.channels[1] = InProcessChannel("/job:ps/task:1", {})  # serves no call at all
    with pytest.raises(CheckpointError, match=r"/job:ps/task:0: LoadShard: LoadShard of generation 10 refused.*; "
                                              r"/job:ps/task:1: LoadShard: unknown method") as failed:
        restore(client, saved, generation=10)
    assert not isinstance(failed.value, RestoreRefusedError)
