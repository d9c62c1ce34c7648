"""A chief's save hold and the chief's processes (psflow.ps.save_hold): notices of an older process of the chief
(a killed chief's late call, a notice thread that outlived its process) change nothing of a newer process's save
and hold nothing once a newer process is known; the saving process's own re-registration ends nothing, so its
hold stays bounded by its --save-timeout from its start. The hold's own rules run on the test's clock; the
service's, on in-process ps tasks and the real client."""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np
import pytest
from test_save_hold import Clock

from psflow.cluster import ClusterSpec
from psflow.errors import PsflowError
from psflow.gradients import DenseGradient
from psflow.optim import OptimizerSpec
from psflow.placement import VariableSet, replica_device_setter
from psflow.ps.client import ParameterClient
from psflow.ps.protocol import SaveNoticeReply, SaveNoticeRequest
from psflow.ps.save_hold import SaveHold
from psflow.ps.service import ParameterService
from psflow.ps.sync import SyncConfig
from psflow.rpc.api import ConnectConfig
from psflow.rpc.inprocess import InProcessChannel

CHIEF, OTHER = "/job:worker/task:0", "/job:worker/task:1"
CKPT = "gs://bucket/ckpt"
SGD = OptimizerSpec("sgd", {"learning_rate": 0.1})


def test_an_older_processs_late_notices_leave_the_newer_processs_save_under_way() -> None:
    """The restarted chief (process 2) saves; its killed process's (1) late notices arrive, active, then its end.
    Before, the active one ended process 2's save ('its process ended (a later one of ... saves)') and put
    process 1's in its place, and the end notice ended that: nothing held the step while process 2 saved, and its
    next notice started a save over, its --save-timeout counted again from then."""
    clock = Clock()
    hold = SaveHold(clock)
    hold.notice(CHIEF, CKPT, 150, True, bound=20.0, incarnation=2)
    clock.now = 3.0
    hold.notice(CHIEF, CKPT, 130, True, bound=20.0, incarnation=1)
    clock.now = 4.0
    hold.notice(CHIEF, CKPT, 130, False, bound=20.0, incarnation=1)
    described = hold.describe([CHIEF])
    assert f"{CHIEF} was saving a checkpoint into {CKPT} at global_step 150 (for 4.0 s" in described, described
    assert hold.heard([CHIEF]) == 0.0
    clock.now = 5.0
    hold.notice(CHIEF, CKPT, 150, True, bound=20.0, incarnation=2)
    clock.now = 30.0
    hold.notice(CHIEF, CKPT, 150, True, bound=20.0, incarnation=2)
    assert hold.heard([CHIEF]) == 20.0  # its bound, from its own start
    assert "for 30.0 s, longer than its --save-timeout (20 s)" in hold.describe([CHIEF])


def test_an_older_processs_notice_after_the_newer_one_registered_holds_nothing() -> None:
    """Process 2 of the chief registered (process 1 killed): process 1's notice thread, outliving it, or its late
    call, tells of a save. Before, that save held the step, for up to its --save-timeout, for a dead process."""
    clock = Clock()
    hold = SaveHold(clock)
    assert not hold.registered(CHIEF, 2)
    clock.now = 1.0
    hold.notice(CHIEF, CKPT, 130, True, bound=600.0, incarnation=1)
    assert hold.heard([CHIEF]) is None and hold.describe([CHIEF]) == ""
    hold.notice(CHIEF, CKPT, 150, True, bound=600.0, incarnation=2)  # its own: held
    assert hold.heard([CHIEF]) == 1.0


def _cluster(save_timeout: float) -> tuple[ParameterClient, ParameterClient]:
    """Two in-process ps tasks in sync mode (a 1 s --sync-timeout), the chief and the other worker registered."""
    cluster = ClusterSpec({"ps": ["127.0.0.1:1", "127.0.0.1:2"]})
    vs = VariableSet(replica_device_setter(cluster=cluster))
    vs.get_variable("w", (4, 2), initializer={"name": "zeros"})
    services = [ParameterService(i, holds_global_step=i == 0) for i in range(2)]
    channels = {i: InProcessChannel(f"/job:ps/task:{i}", s.handlers()) for i, s in enumerate(services)}
    sync = SyncConfig(mode="sync", replicas_to_aggregate=2, total_num_replicas=2, timeout=1.0)
    chief = ParameterClient(cluster, vs.placements(), client_name=CHIEF, channels=channels, sync=sync,
                            config=ConnectConfig(save_timeout=save_timeout))
    chief.register(SGD, chief=True)
    other = ParameterClient(cluster, vs.placements(), client_name=OTHER, channels=channels, sync=sync)
    other.register(SGD)
    return chief, other


def _push(client: ParameterClient) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["step"] = client.push_detailed({"w": DenseGradient(np.ones((4, 2), np.float32))}, examples=8,
                                            read_step=0).step
        except Exception as e:  # the step's refusal, as the client raises it
            out["error"] = str(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_the_saving_chief_re_registering_keeps_its_save_bounded_by_its_save_timeout() -> None:
    """The chief saves (its notices renewed every 0.2 s, --save-timeout 1.5 s) and registers again while it does
    (as a chief's client does after a ps task restarted). Before, Register carried no process, so each ended the
    chief's own save and the next notice began it anew: the step was held for as long as that went on, past the
    bound. Now the step times out --sync-timeout after the bound and the error names the flag."""
    chief, other = _cluster(save_timeout=1.5)
    notice = SaveNoticeRequest(CHIEF, CKPT, 0, True, 1.5, chief.incarnation)
    replies: list[SaveNoticeReply] = []
    thread: threading.Thread | None = None
    for _ in range(300):  # 60 s: far past the bound and the timeout, however loaded the machine
        replies += [SaveNoticeReply.from_frame(c.call(notice.METHOD, notice.to_frame().meta))
                    for c in chief.channels.values()]
        chief.register(SGD, chief=True)
        if thread is None:  # once every task heard of the save
            thread, out = _push(other)
        thread.join(0.2)
        if not thread.is_alive():
            break
    assert thread is not None
    assert not thread.is_alive(), "the step was still held after 60 s of re-registrations"
    assert "sync step 0 timed out" in out["error"] and "longer than its --save-timeout (1.5 s)" in out["error"], out
    assert all(r.renew_every is not None for r in replies)


def test_an_older_processs_notice_is_answered_send_no_more() -> None:
    """A notice of a process older than the one that registered last is answered None (the ps task holds nothing
    for it), so a notice thread that outlived its process stops sending."""
    chief, _ = _cluster(save_timeout=600.0)
    stale = SaveNoticeRequest(CHIEF, CKPT, 0, True, 600.0, chief.incarnation - 1)
    reply = SaveNoticeReply.from_frame(chief.channels[0].call(stale.METHOD, stale.to_frame().meta))
    assert reply.renew_every is None
    own = SaveNoticeRequest(CHIEF, CKPT, 0, True, 600.0, chief.incarnation)
    assert SaveNoticeReply.from_frame(chief.channels[0].call(own.METHOD, own.to_frame().meta)).renew_every == 0.25


def test_a_notice_ignored_as_an_earlier_processs_is_a_warning_naming_the_worker_and_the_process(
        caplog: pytest.LogCaptureFixture) -> None:
    """A process's identity is its start time (ns): a restarted chief on a host whose clock is behind its killed
    process's (a clock stepped back, another host) is taken for the earlier one, and its save holds no step. The
    ps task's line saying so was INFO, which nobody reads by default; it is a WARNING naming the worker, the
    process and what may be wrong."""
    chief, _ = _cluster(save_timeout=600.0)
    behind = chief.incarnation - 5_000_000_000  # started 5 s "before" the registered process, by its clock
    stale = SaveNoticeRequest(CHIEF, CKPT, 0, True, 600.0, behind)
    with caplog.at_level(logging.WARNING, logger="psflow"):
        chief.channels[0].call(stale.METHOD, stale.to_frame().meta)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1, lines
    assert CHIEF in lines[0] and f"process {behind}" in lines[0] and "clock" in lines[0], lines[0]
    chief.reader_positions()  # the registered process claims its reader position: the latest process
    restarted = ParameterClient(chief.cluster, list(chief.layout.values()), client_name=CHIEF, channels=chief.channels,
                                sync=chief.sync)
    restarted.incarnation = behind
    with pytest.raises(PsflowError, match=f"earlier process of {CHIEF}.*its host's clock is behind"):
        restarted.reader_positions()  # its first call refused, saying why it may be wrong
