"""The end of a save's notices (psflow.checkpoint.save_notice) when the notice thread outlives the save: every ps
task told of the save still hears its end, so no step stays held by a save that is over. In-process ps tasks
whose SaveNotice handler the test holds (test_save_notice's client, its handler wrapped)."""

from __future__ import annotations

import logging
import threading

import pytest
from support import wait_until
from test_save_notice import CKPT, _client

import psflow.checkpoint.save_notice as save_notice
from psflow.checkpoint.save_notice import notify_save
from psflow.ps.protocol import SaveNoticeRequest
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import Handler, Reply
from psflow.rpc.framing import Frame

SYNC = SyncConfig(mode="sync", replicas_to_aggregate=2, total_num_replicas=2, timeout=0.8)


def test_a_notice_thread_that_outlives_the_save_still_ends_the_save_on_every_task(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """ps task 1 does not answer the notice's renewal until the test lets it (a call stuck past its deadline), so
    the notice thread outlives the save's end (its join's bound shortened here). Before, no end notice was sent
    then: both tasks kept the save under way, holding the next sync steps until its --save-timeout. Now both hear
    its end, and the stuck thread, once let go, sends no more."""
    monkeypatch.setattr(save_notice, "_CALL_TIMEOUT", 0.2)  # the join waits 2 * 0.2 + 1 s
    release, stuck = threading.Event(), threading.Event()
    notices: list[SaveNoticeRequest] = []

    def held_renewal(task: int, handler: Handler) -> Handler:
        def call(frame: Frame) -> Reply:
            notice = SaveNoticeRequest.from_frame(frame)
            reply = handler(frame)  # applied, its answer held back
            if task == 1:
                notices.append(notice)
                if notice.active and len(notices) >= 2:
                    stuck.set()
                    release.wait(60)
            return reply
        return call

    client = _client(SYNC, {"SaveNotice": held_renewal})
    caplog.set_level(logging.INFO, logger="psflow.ps.sync")
    try:
        with notify_save(client, CKPT):
            assert stuck.wait(60), "the notice never renewed"
        thread = [t for t in threading.enumerate() if t.name == "psflow-save-notice"]
        assert thread, "the notice thread ended in time: nothing of this test ran"
        ended = [r.getMessage() for r in caplog.records if f"saved a checkpoint into {CKPT}" in r.getMessage()]
        assert sorted(line.split(":")[2] for line in ended) == ["0", "1"], ended
    finally:
        release.set()
    wait_until(lambda: not thread[0].is_alive(), "the notice thread gone once let go", limit=60)
    assert not notices[-1].active, notices  # nothing active after the end


def test_a_task_that_answers_no_notice_at_all_does_not_hold_the_save_past_the_join(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """ps task 1 (in process: its calls run in the caller's thread, their deadline unheeded) answers no notice from
    its second on, the end notice included, until the test lets it. Before, once the notice thread outlived the
    save, the end notice was sent to it in the save's own thread and the save's end waited for that answer: the
    save never ended while the task did not answer. Now the save ends once the join's bound is over, task 0
    having heard the end; task 1 hears it when it answers again."""
    monkeypatch.setattr(save_notice, "_CALL_TIMEOUT", 0.2)  # the join waits 2 * 0.2 + 1 s
    release, stuck = threading.Event(), threading.Event()
    heard: list[SaveNoticeRequest] = []

    def unanswered(task: int, handler: Handler) -> Handler:
        def call(frame: Frame) -> Reply:
            if task == 1:
                heard.append(SaveNoticeRequest.from_frame(frame))
                if len(heard) >= 2:
                    stuck.set()
                    assert release.wait(120), "the test never let ps task 1 answer"
            return handler(frame)
        return call

    client = _client(SYNC, {"SaveNotice": unanswered})
    caplog.set_level(logging.INFO, logger="psflow.ps.sync")
    ended = threading.Event()

    def save() -> None:
        with notify_save(client, CKPT):
            assert stuck.wait(60), "the notice never renewed"
        ended.set()
    saving = threading.Thread(target=save, daemon=True)
    try:
        saving.start()
        assert ended.wait(60), "the save did not end while ps task 1 answered nothing"
        lines = [r.getMessage() for r in caplog.records if f"saved a checkpoint into {CKPT}" in r.getMessage()]
        assert [line.split(":")[2] for line in lines] == ["0"], lines
    finally:
        release.set()
    wait_until(lambda: any(n.active is False for n in heard), "ps task 1 given the end notice", limit=60)
    saving.join(60)
