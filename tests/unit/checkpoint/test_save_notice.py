"""The chief's save notices (psflow.checkpoint.save_notice) on in-process ps services: every ps task hears a sync
save begin and end, also a save that fails, and the notice thread is gone when the save is; async and ssp send
nothing and start no thread."""

from __future__ import annotations

import logging
import threading

import pytest

from psflow.checkpoint.save_notice import notify_save
from psflow.cluster import ClusterSpec
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.inprocess import InProcessChannel

CKPT = "/tmp/ckpt-of-the-test"


def _client(sync: SyncConfig) -> ParameterClient:
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
    vs = VariableSet(replica_device_setter(cluster=cluster))
    vs.get_variable("w", (4, 2), initializer={"name": "zeros"})
    vs.get_variable("b", (2,), initializer={"name": "zeros"})
    services = [ParameterService(i, holds_global_step=i == 0) for i in range(2)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    client = ParameterClient(cluster, vs.placements(), client_name="/job:worker/task:0", channels=channels, sync=sync)
    client.register(OptimizerSpec("sgd", {"learning_rate": 0.1}), chief=True)
    return client


def _notice_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "psflow-save-notice"]


def _lines(caplog: pytest.LogCaptureFixture, what: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if what in r.getMessage()]


def test_a_failing_sync_save_is_told_begun_and_ended_to_every_ps_task_and_leaves_no_thread(
        caplog: pytest.LogCaptureFixture) -> None:
    client = _client(SyncConfig(mode="sync", replicas_to_aggregate=2, total_num_replicas=2, timeout=8.0))
    caplog.set_level(logging.INFO, logger="psflow.ps.sync")
    with pytest.raises(OSError, match="disk full"), notify_save(client, CKPT):
        assert _notice_threads()  # (in-process channels: the first notices are sent by the time it is seen)
        raise OSError("disk full")
    assert not _notice_threads()
    begun = _lines(caplog, f"/job:worker/task:0 is saving a checkpoint into {CKPT} at global_step 0")
    ended = _lines(caplog, f"/job:worker/task:0 saved a checkpoint into {CKPT} at global_step 0")
    assert sorted(line.split(":")[2] for line in begun) == ["0", "1"], begun  # each ps task once
    assert sorted(line.split(":")[2] for line in ended) == ["0", "1"], ended


@pytest.mark.parametrize("mode", ["async", "ssp"])
def test_no_notice_and_no_thread_outside_sync_mode(mode: str, caplog: pytest.LogCaptureFixture) -> None:
    client = _client(SyncConfig(mode=mode, total_num_replicas=2, staleness=1 if mode == "ssp" else 0))
    caplog.set_level(logging.INFO, logger="psflow.ps.sync")
    with notify_save(client, CKPT):
        assert not _notice_threads()
    assert not _lines(caplog, "a checkpoint into")
