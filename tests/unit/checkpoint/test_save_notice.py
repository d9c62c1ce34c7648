"""The chief's save notices (psflow.checkpoint.save_notice) on in-process ps services: every ps task hears a sync
save begin and end, also a save that fails, and the notice thread is gone when the save is; async and ssp send
nothing and start no thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from support import wait_until

from psflow.checkpoint.save_notice import notify_save
from psflow.cluster import ClusterSpec
from psflow.gradients import DenseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SaveNoticeRequest
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import ConnectConfig, Handler, Reply
from psflow.rpc.framing import Frame
from psflow.rpc.inprocess import InProcessChannel

CKPT = "/tmp/ckpt-of-the-test"


def _client(sync: SyncConfig, wrap: dict[str, Callable[[int, Handler], Handler]] | None = None, *,
            save_timeout: float = 600.0) -> ParameterClient:
    """The chief's client of two in-process ps tasks (``w`` on ps task 0, ``b`` on 1), registered; the handlers of
    the methods ``wrap`` names are wrapped (method -> (task, handler) -> handler)."""
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
    vs = VariableSet(replica_device_setter(cluster=cluster))
    vs.get_variable("w", (4, 2), initializer={"name": "zeros"})
    vs.get_variable("b", (2,), initializer={"name": "zeros"})
    services = [ParameterService(i, holds_global_step=i == 0) for i in range(2)]
    wrap = wrap or {}
    tables = [{m: wrap[m](i, h) if m in wrap else h for m, h in s.handlers().items()} for i, s in enumerate(services)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", t) for i, t in enumerate(tables)}
    client = ParameterClient(cluster, vs.placements(), client_name="/job:worker/task:0", channels=channels, sync=sync,
                             config=ConnectConfig(save_timeout=save_timeout))
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
        assert _notice_threads()
        # The save fails once every ps task heard it begin: a save over before the thread's first notice holds
        # nothing and is told nothing (the thread, seen started, may not have sent yet).
        wait_until(lambda: len(_lines(caplog, "is saving a checkpoint")) == 2, "both ps tasks told the save began")
        raise OSError("disk full")
    assert not _notice_threads()
    begun = _lines(caplog, f"/job:worker/task:0 is saving a checkpoint into {CKPT}")
    ended = _lines(caplog, f"/job:worker/task:0 saved a checkpoint into {CKPT} at global_step 0")
    assert sorted(line.split(":")[2] for line in begun) == ["0", "1"], begun  # each ps task once
    assert sorted(line.split(":")[2] for line in ended) == ["0", "1"], ended


def test_no_notice_and_no_thread_in_async_mode(caplog: pytest.LogCaptureFixture) -> None:
    client = _client(SyncConfig(mode="async", total_num_replicas=2))
    caplog.set_level(logging.INFO, logger="psflow.ps.sync")
    with notify_save(client, CKPT):
        assert not _notice_threads()
    assert not _lines(caplog, "a checkpoint into")


def test_an_ssp_save_is_told_to_the_task_holding_global_step_only(caplog: pytest.LogCaptureFixture) -> None:
    """In ssp mode the workers' clocks live on ps task 0 (psflow.ps.staleness), where a saving chief's clock holds
    the others back: it hears the save begin and end; ps task 1 (nothing to hold) replies None, and hears no more."""
    client = _client(SyncConfig(mode="ssp", total_num_replicas=2, staleness=1, timeout=8.0))
    caplog.set_level(logging.INFO, logger="psflow.ps.sync")
    with notify_save(client, CKPT):
        pass
    assert not _notice_threads()
    assert [line.split(":")[2] for line in _lines(caplog, "/job:worker/task:0 is saving a checkpoint")] == ["0"]
    assert [line.split(":")[2] for line in _lines(caplog, "/job:worker/task:0 saved a checkpoint")] == ["0"]


def _recorded(notices: list[SaveNoticeRequest]) -> Callable[[int, Handler], Handler]:
    """A wrapper of the SaveNotice handlers that appends each notice ps task 1 gets to ``notices``."""
    def wrap(task: int, handler: Handler) -> Handler:
        def call(frame: Frame) -> Reply:
            if task == 1:
                notices.append(SaveNoticeRequest.from_frame(frame))
            return handler(frame)
        return call
    return wrap


def test_the_notices_do_not_wait_for_a_slow_stats(caplog: pytest.LogCaptureFixture) -> None:
    """ps task 0 answers Stats only when the test lets it: every ps task hears the save begin, and the notice is
    renewed, all the same (before, the notice thread asked Stats first, so a save that began while Stats was slow
    was told to nobody for up to 5 s, past a short --sync-timeout). The notices after Stats answered carry its
    global_step."""
    release = threading.Event()
    notices: list[SaveNoticeRequest] = []

    def slow_stats(task: int, handler: Handler) -> Handler:
        def call(frame: Frame) -> Reply:
            release.wait(30)
            return handler(frame)
        return call

    client = _client(SyncConfig(mode="sync", replicas_to_aggregate=2, total_num_replicas=2, timeout=1.0),
                          {"Stats": slow_stats, "SaveNotice": _recorded(notices)})
    caplog.set_level(logging.INFO, logger="psflow.ps.sync")
    try:
        with notify_save(client, CKPT):
            wait_until(lambda: len(_lines(caplog, "/job:worker/task:0 is saving a checkpoint into")) == 2,
                       "both ps tasks told of the save while Stats does not answer", limit=20)
            wait_until(lambda: len(notices) >= 3, "the notice renewed while Stats does not answer", limit=20)
            release.set()
            wait_until(lambda: notices[-1].step == 0, "a notice carrying Stats' global_step", limit=20)
    finally:
        release.set()
    assert len(_lines(caplog, f"/job:worker/task:0 saved a checkpoint into {CKPT} at global_step 0")) == 2


def test_no_notice_past_the_save_timeout(caplog: pytest.LogCaptureFixture) -> None:
    """A save stuck past --save-timeout (0.5 s here, notices renewed every 0.25 s) is told of no more: at most the
    notices sent within the bound reach a ps task, however long the save goes on (before, they came as long as
    it lasted, and a stuck save held the run for ever); each carries the bound. The end notice still comes."""
    notices: list[SaveNoticeRequest] = []

    client = _client(SyncConfig(mode="sync", replicas_to_aggregate=2, total_num_replicas=2, timeout=1.0),
                          {"SaveNotice": _recorded(notices)}, save_timeout=0.5)
    caplog.set_level(logging.WARNING, logger="psflow.checkpoint.save_notice")
    with notify_save(client, CKPT):
        wait_until(lambda: _lines(caplog, "has lasted longer than --save-timeout (0.5 s)"),
                   "the notice thread giving up at the bound", limit=60)
        time.sleep(1.0)  # the save goes on: no notice more (a late one would show in the count below)
    active = [n for n in notices if n.active]
    assert 1 <= len(active) <= 3, notices  # sent at 0, 0.25 and (at most) just before 0.5 s
    assert all(n.bound == 0.5 and n.incarnation == client.incarnation for n in notices), notices
    assert not notices[-1].active, notices


def test_an_ssp_push_held_by_a_saving_chief_is_applied_and_counted_once() -> None:
    """In-process ps tasks, ssp with staleness 0 and a 2 s --sync-timeout: the other worker's push waits for the
    chief's clock while the chief saves (its notices renewed every 0.5 s) until it has been answered held at least
    twice and sent again by its client; the chief's push then lets it go. Its gradient and examples counted once,
    global_step moved once per push."""
    sync = SyncConfig(mode="ssp", total_num_replicas=2, staleness=0, timeout=2.0)
    held: list[bool] = []

    def seen(task: int, handler: Handler) -> Handler:
        def call(frame: Frame) -> Reply:
            meta, arrays = handler(frame)
            if task == 0:
                held.append(meta.get("held") is True or meta.get("push", {}).get("held") is True)
            return meta, arrays
        return call

    chief = _client(sync, {"Push": seen, "PushPull": seen})
    other = ParameterClient(chief.cluster, list(chief.layout.values()), client_name="/job:worker/task:1",
                            channels=chief.channels, sync=sync)
    other.register(OptimizerSpec("sgd", {"learning_rate": 0.1}))
    out: dict[str, object] = {}
    grads = {"w": DenseGradient(np.ones((4, 2), np.float32))}
    with notify_save(chief, CKPT):
        pushing = threading.Thread(target=lambda: out.setdefault("step", other.push_detailed(
            grads, examples=8, clock=1).step), daemon=True)
        pushing.start()
        wait_until(lambda: held.count(True) >= 2, "the other worker's push answered held twice", limit=60)
    assert pushing.is_alive(), out
    chief.push_detailed(grads, examples=8, clock=1)
    pushing.join(30)
    stats = chief.stats()
    assert out["step"] == 1 and stats["global_step"] == 2, (out, stats)
    assert stats["examples"] == 16, stats  # each push's 8 once
