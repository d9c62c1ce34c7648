"""A shard's save (``SaveShard``) and load (``LoadShard``) have the save's deadline, ``--save-timeout``, not the
deadline of one small call, ``--rpc-timeout``.

Seen on a loaded 2-core machine: W&D with 26 x 2^20-row tables (about 1.9 GB of shard) took its ps tasks more
than the 60 s of ``--rpc-timeout`` to write, so the initial, the periodic and the final save all failed and the
run exited 1, its trained model not saved.

Real ps task processes (``local_cluster``), the chief's client in this process. A ps task stopped with SIGSTOP
just before the shards are asked for is a save that lasts as long as the test holds it, whatever the machine's
speed: it cannot answer before the test's SIGCONT.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
from support import A9A, TOKEN

from psflow.checkpoint import restore as restore_module
from psflow.checkpoint.save import CheckpointManager
from psflow.errors import CheckpointError
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SaveShardReply
from psflow.rpc.api import ConnectConfig, TaskUnavailableError
from psflow.train.build import build_model
from psflow.train.chief import join_cluster
from psflow.train.config import TrainConfig

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

CONFIG = TrainConfig.flat(train=(str(A9A),), num_features=124, optimizer="adagrad", batch_size=256, num_ps=2,
                          num_workers=1)
RPC_TIMEOUT = 1.0
#: Generous bound of every wait on the other thread (a passing run never meets it).
LIMIT = 120.0


def _chief(handle: Any, save_timeout: float, transport: str = "grpc") -> ParameterClient:
    _, variables = build_model(CONFIG, handle.cluster)
    client = ParameterClient(handle.cluster, variables.placements(), client_name="/job:worker/task:0",
                             config=ConnectConfig(connect_timeout=30, rpc_timeout=RPC_TIMEOUT,
                                                  save_timeout=save_timeout, token=TOKEN, transport=transport))
    client.connect()
    join_cluster(client, CONFIG.optimizer_spec(), chief=True)
    return client


class _HungShards(CheckpointManager):
    """A manager that stops ps task ``pid`` (SIGSTOP) right before it asks the ps tasks for their shards."""

    def __init__(self, directory: str, pid: int) -> None:
        super().__init__(directory)
        self.pid, self.asking = pid, threading.Event()

    def _write_shards(self, client: ParameterClient, path: str,
                      base: Any = None) -> dict[int, tuple[str, SaveShardReply]]:
        os.kill(self.pid, signal.SIGSTOP)
        self.asking.set()
        return super()._write_shards(client, path, base)


@contextmanager
def _continued(pid: int) -> Iterator[None]:
    try:
        yield
    finally:
        with suppress(ProcessLookupError):  # (a task the test killed)
            os.kill(pid, signal.SIGCONT)


def test_a_save_longer_than_rpc_timeout_but_within_save_timeout_succeeds(local_cluster, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    handle = local_cluster(2)
    chief = _chief(handle, save_timeout=LIMIT)
    pid = handle.procs[("ps", 1)].pid
    manager = _HungShards(str(tmp_path / "ckpt"), pid)
    saved: list[Any] = []
    saving = threading.Thread(target=lambda: saved.append(manager.save(chief)), daemon=True)
    with _continued(pid):
        saving.start()
        assert manager.asking.wait(LIMIT), "the save never asked for the shards"
        # The fault's length: ps task 1 cannot answer its SaveShard before this SIGCONT, 3 x --rpc-timeout later.
        time.sleep(3 * RPC_TIMEOUT)
    saving.join(LIMIT)
    assert not saving.is_alive() and len(saved) == 1, manager.last_error
    assert Path(saved[0].path).name == "ckpt-000000000" and manager.saves_failed == 0
    chief.close()


def test_a_save_longer_than_save_timeout_fails_naming_the_task_the_shard_and_the_flag(local_cluster,  # type: ignore[no-untyped-def]
                                                                                       tmp_path: Path) -> None:
    handle = local_cluster(2)
    chief = _chief(handle, save_timeout=3 * RPC_TIMEOUT)
    pid = handle.procs[("ps", 1)].pid
    manager = _HungShards(str(tmp_path / "ckpt"), pid)
    with _continued(pid), pytest.raises(CheckpointError) as caught:
        manager.save(chief)  # ps task 1 stays stopped until the save gave up
    message = str(caught.value)
    assert "/job:ps/task:1" in message and "shard-00001-of-00002.safetensors" in message, message
    assert "--save-timeout" in message and "--save-timeout, 3 s" in message, message
    assert manager.saves_failed == 1
    chief.close()


@pytest.mark.parametrize("transport", ["grpc", "tcp"])
def test_a_dead_ps_task_fails_the_save_at_once_not_after_save_timeout(local_cluster, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                      transport: str) -> None:
    handle = local_cluster(2)
    chief = _chief(handle, save_timeout=3600.0, transport=transport)
    pid = handle.procs[("ps", 1)].pid
    manager = _HungShards(str(tmp_path / "ckpt"), pid)
    failed: list[BaseException] = []

    def save() -> None:
        try:
            manager.save(chief)
        except Exception as e:  # reported below
            failed.append(e)

    saving = threading.Thread(target=save, daemon=True)
    with _continued(pid):
        saving.start()
        assert manager.asking.wait(LIMIT), "the save never asked for the shards"
        handle.kill("ps", 1)  # SIGKILL ends a stopped process too: its connections break
    saving.join(LIMIT)  # a passing run ends long before: the save timeout is an hour
    assert not saving.is_alive(), "a save to a dead ps task waited for --save-timeout"
    assert len(failed) == 1 and isinstance(failed[0], CheckpointError), failed
    assert "/job:ps/task:1" in str(failed[0]) and "--save-timeout" not in str(failed[0]), failed[0]
    chief.close()


def test_a_restore_s_load_longer_than_rpc_timeout_but_within_save_timeout_succeeds(  # type: ignore[no-untyped-def]
        local_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handle = local_cluster(2)
    chief = _chief(handle, save_timeout=LIMIT)
    path = CheckpointManager(str(tmp_path / "ckpt")).save(chief).path
    pid = handle.procs[("ps", 1)].pid
    real, asking = restore_module.load_shards, threading.Event()

    def hung(client: ParameterClient, requests: Mapping[int, Any], what: str) -> None:
        os.kill(pid, signal.SIGSTOP)
        asking.set()
        real(client, requests, what)

    monkeypatch.setattr(restore_module, "load_shards", hung)
    restored: list[Any] = []
    loading = threading.Thread(target=lambda: restored.append(restore_module.restore(chief, path)), daemon=True)
    with _continued(pid):
        loading.start()
        assert asking.wait(LIMIT), "the restore never sent its LoadShard calls"
        time.sleep(3 * RPC_TIMEOUT)  # the fault's length, as above
    loading.join(LIMIT)
    assert not loading.is_alive() and len(restored) == 1
    assert restored[0].global_step == 0
    chief.close()


def test_a_restore_s_load_longer_than_save_timeout_fails_naming_the_task_once_and_the_flag(  # type: ignore[no-untyped-def]
        local_cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    handle = local_cluster(2)
    chief = _chief(handle, save_timeout=3 * RPC_TIMEOUT)
    path = CheckpointManager(str(tmp_path / "ckpt")).save(chief).path
    pid = handle.procs[("ps", 1)].pid
    real = restore_module.load_shards

    def hung(client: ParameterClient, requests: Mapping[int, Any], what: str) -> None:
        os.kill(pid, signal.SIGSTOP)  # until the load gave up
        real(client, requests, what)

    monkeypatch.setattr(restore_module, "load_shards", hung)
    with _continued(pid), pytest.raises(CheckpointError) as caught:
        restore_module.restore(chief, path)
    message = str(caught.value)
    assert message.count("/job:ps/task:1") == 1 and "LoadShard" in message, message  # it read 'task:1: /job:ps/task:1:'
    assert "(no reply within --save-timeout, 3 s)" in message, message
    chief.close()


def _waiting_worker(handle: Any, *, connect_timeout: float, save_timeout: float) -> ParameterClient:
    _, variables = build_model(CONFIG, handle.cluster)
    client = ParameterClient(handle.cluster, variables.placements(), client_name="/job:worker/task:1",
                             config=ConnectConfig(connect_timeout=connect_timeout, rpc_timeout=RPC_TIMEOUT,
                                                  save_timeout=save_timeout, token=TOKEN))
    client.connect()
    return client


def test_a_worker_that_waited_out_the_chief_s_restore_or_initial_checkpoint_names_save_timeout(  # type: ignore[no-untyped-def]
        local_cluster) -> None:
    """The chief created the variables and never made the tasks ready (its restore or initial checkpoint hung): the
    other worker's wait ends after --connect-timeout plus --save-timeout, and its line names both flags (it named
    neither, and --save-timeout is the one to raise for a bigger model). Before the chief created anything, the limit
    is --connect-timeout alone."""
    handle = local_cluster(2)
    worker = _waiting_worker(handle, connect_timeout=2.0, save_timeout=3.0)
    with pytest.raises(TaskUnavailableError) as before:
        worker.register(CONFIG.optimizer_spec())
    assert "not initialized by the chief" in str(before.value), before.value
    assert "--connect-timeout, 2 s" in str(before.value) and "--save-timeout" not in str(before.value), before.value
    _, variables = build_model(CONFIG, handle.cluster)
    chief = ParameterClient(handle.cluster, variables.placements(), client_name="/job:worker/task:0",
                            config=ConnectConfig(connect_timeout=30, rpc_timeout=RPC_TIMEOUT, token=TOKEN))
    chief.connect()
    chief.register(CONFIG.optimizer_spec(), chief=True, defer_ready=True)  # created; its restore never ends
    with pytest.raises(TaskUnavailableError) as after:
        worker.register(CONFIG.optimizer_spec())
    message = str(after.value)
    assert message.startswith("/job:worker/task:1: /job:ps/task:0, /job:ps/task:1 not made ready by the chief"), message
    assert "--connect-timeout, 2 s" in message and "--save-timeout, 3 s" in message, message
    worker.close()
    chief.close()
