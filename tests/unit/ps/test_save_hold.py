"""A sync step waiting for a chief that saves a checkpoint (psflow.ps.save_hold): it does not time out while the
chief's notices come, and an error after they stopped names the save. Threads stand in for workers; the
aggregator's clock is the test's, moved by hand, so nothing depends on how fast the machine is."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from psflow.optim import OptimizerSpec
from psflow.ps.global_step import GlobalStep
from psflow.ps.optimizers import make_optimizer
from psflow.ps.save_hold import SaveHold
from psflow.ps.staleness import StalenessClock, Waited
from psflow.ps.store import ParameterStore, PartitionState
from psflow.ps.sync import Contribution, SyncAggregator, SyncConfig, SyncResult
from psflow.rpc.api import PreconditionFailed, refusal

CHIEF, OTHER = "/job:worker/task:0", "/job:worker/task:1"
CKPT = "gs://bucket/ckpt"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.read: dict[int | None, float] = {}  # thread id -> the time it last read

    def __call__(self) -> float:
        self.read[threading.get_ident()] = self.now
        return self.now


def _setup(clock: Clock) -> tuple[SyncAggregator, PartitionState, GlobalStep]:
    store = ParameterStore()
    part = store.create("w", 0, (3, 1), 0, 3, "float32", {"name": "zeros"},
                        make_optimizer(OptimizerSpec("sgd", {"learning_rate": 1.0})))
    step = GlobalStep()
    config = SyncConfig(mode="sync", replicas_to_aggregate=2, total_num_replicas=2, timeout=10.0, on_timeout="fail")
    return SyncAggregator(config, store, task_name="/job:ps/task:0", advance=step.increment,
                          current=lambda: step.value, clock=clock), part, step


def _grad(part: PartitionState, worker: str) -> Contribution:
    return Contribution(worker, [(part, np.array([0], np.int64), np.array([[2.0]], np.float32))])


def _pushing(push: Callable[[], Any], *, resent: bool = True) -> tuple[threading.Thread, dict[str, Any]]:
    """``push`` in a thread of its own, started: sent again after each held answer, as a worker's client does
    (psflow.ps.task_calls; ``out["held"]`` counts them), or (not ``resent``) once, its process killed while it
    waited; then ``out["result"]`` its answer, or ``out["error"]`` the PreconditionFailed it raised."""
    out: dict[str, Any] = {"held": 0} if resent else {}

    def run() -> None:
        try:
            result = push()
            while resent and result.held:
                out["held"] += 1
                result = push()
            out["result"] = result
        except PreconditionFailed as e:
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _until_answered(thread: threading.Thread, clock: Clock, lock: threading.Condition, notice: Callable[[], object],
                    *, limit: float = 100.0) -> None:
    """Moves ``clock`` 2 s at a time, calling ``notice`` (which wakes the waiting push) after each, until ``thread``'s
    push is answered or the clock reaches ``limit``; then waits for the thread. Each move is made under ``lock`` (the
    coordinator's) and waits for the push to read the clock at it: the push sees every time, the one it is answered
    at included, and its error names that time, however late the machine runs the thread."""
    while thread.is_alive() and clock.now < limit:
        with lock:
            clock.now += 2.0
            notice()
        for _ in range(1000):  # (a generous bound: 10 s)
            if not thread.is_alive() or clock.read.get(thread.ident) == clock.now:
                break
            thread.join(0.01)
    thread.join(10)


def _saving_40_s(thread: threading.Thread, out: dict[str, Any], clock: Clock, notice: Callable[[], object]) -> None:
    """The chief's save renewed (``notice``) every 4 s for 40 s: after each, ``thread``'s push still waits, only
    ever answered held (and sent again)."""
    for _ in range(10):
        clock.now += 4.0
        notice()
        thread.join(0.02)
        assert thread.is_alive() and set(out) == {"held"}, out


def _ssp(clock: Clock, *, staleness: int) -> StalenessClock:
    """The ssp clock of two workers on the test's ``clock``, a 10 s timeout that fails the push."""
    return StalenessClock(SyncConfig(mode="ssp", total_num_replicas=2, staleness=staleness, timeout=10.0,
                                     on_timeout="fail"), task_name="/job:ps/task:0", clock=clock)


def _waiting(agg: SyncAggregator, part: PartitionState, tag: int = 0, *,
             resent: bool = True) -> tuple[threading.Thread, dict[str, Any]]:
    """The other worker's push of step ``tag`` (:func:`_pushing`)."""
    return _pushing(lambda: agg.contribute(tag, _grad(part, OTHER)), resent=resent)


def test_a_step_waits_for_a_saving_chief_past_its_timeout_then_applies_with_its_gradient() -> None:
    """The chief's save lasts 40 s of a 10 s sync timeout, renewing its notice every 4 s: the other worker's
    gradient waits (before, the step failed after 10 s naming only the chief), its push answered held every 10 s
    of its own wait (before its caller's deadline) and sent again, its gradient counted once; the end notice gives
    the step its whole timeout again, and the chief's gradient completes it."""
    clock = Clock()
    agg, part, step = _setup(clock)
    thread, out = _waiting(agg, part)
    assert agg.save_notice(CHIEF, CKPT, 1, True) == 2.5  # renew within a quarter of the timeout
    _saving_40_s(thread, out, clock, lambda: agg.save_notice(CHIEF, CKPT, 1, True))
    clock.now += 1.0
    agg.save_notice(CHIEF, CKPT, 1, False)  # the save is over at 41 s
    clock.now += 9.0  # 9 s later: within the step's timeout again
    agg.save_notice("/job:worker/task:7", CKPT, None, False)  # wakes the waiting push; no worker of the step
    thread.join(0.05)
    assert thread.is_alive() and set(out) == {"held"}, out
    assert agg.contribute(0, _grad(part, CHIEF)) == SyncResult(1, accepted=True, completed=True)
    thread.join(10)
    # counted at its first held answer, not again
    assert out["result"] == SyncResult(1, accepted=True, completed=False, counted=True) and out["held"] >= 1, out
    assert step.value == 1 and part.value[0, 0] == -2.0 and agg.timeouts == 0  # (2 + 2) / 2: each gradient once
    assert agg.stale_dropped == 0


def test_a_chief_that_stops_noticing_its_save_times_the_step_out_and_the_error_names_the_save() -> None:
    """The chief's notices stop at 20 s (it died or hung while saving): the step times out 10 s after the last one,
    and every waiting push's error names the missing chief and its save: directory, global_step, how long."""
    clock = Clock()
    agg, part, step = _setup(clock)
    thread, out = _waiting(agg, part)
    agg.save_notice(CHIEF, CKPT, 130, True)
    for _ in range(5):
        clock.now += 4.0
        agg.save_notice(CHIEF, CKPT, 130, True)
    clock.now = 29.0
    agg.save_notice("/job:worker/task:7", CKPT, None, False)  # wakes it: 9 s after the last notice, still waiting
    thread.join(0.05)
    assert thread.is_alive() and "error" not in out, out
    clock.now = 31.0
    agg.save_notice("/job:worker/task:7", CKPT, None, False)
    thread.join(10)
    message = str(out["error"])
    assert "sync step 0 timed out" in message and "missing: /job:worker/task:0; " in message, message
    assert (f"/job:worker/task:0 was saving a checkpoint into {CKPT} at global_step 130 (for 31.0 s, its save last "
            "heard of 11.0 s ago") in message, message
    assert step.value == 0 and part.value[0, 0] == 0.0


def test_a_restarted_workers_redo_during_a_save_is_held_too_and_its_batch_counted_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """The other worker's process is killed while its push waits for the saving chief, and its restarted process
    pushes the same batch again (restart policy on-failure) before the first push is answered held. The first
    push's gradient is in the step; that push is answered held to a client that is gone. Before, a held push was
    counted only when sent again, so that batch was counted by no push (nor its reader position recorded: the
    restarted worker trains it again), and the redo waited without held answers (past its own deadline if the
    save lasted longer). Now a held answer counts its push, and the redo is answered held too, counted by
    neither it nor its resend."""
    clock = Clock()
    agg, part, step = _setup(clock)
    agg.save_notice(CHIEF, CKPT, 0, True)
    first, killed = _waiting(agg, part, resent=False)  # its client never sends it again
    while agg.stats()["sync_contributed"] != [OTHER]:
        first.join(0.01)
    clock.now += 4.0
    agg.save_notice(CHIEF, CKPT, 0, True)
    caplog.set_level(logging.INFO, logger="psflow.ps.sync")
    thread, out = _waiting(agg, part)  # the restarted process's push (it sends again after a held answer)
    while not any("contributed to step 0 already" in r.getMessage() for r in caplog.records):
        thread.join(0.01)  # it waits, before the first push's held answer (at 10 s)
    for _ in range(3000):  # a poll with a generous bound: the save goes on, renewed, while the threads run
        if "result" in killed and out["held"] >= 1:
            break
        clock.now += 4.0
        agg.save_notice(CHIEF, CKPT, 0, True)
        thread.join(0.01)
    # answered to a client that is gone, and counted then: its batch (examples, reader position) is the step's
    assert killed["result"].held and not killed["result"].counted, killed
    assert thread.is_alive() and out["held"] >= 1, out  # the redo is held as well: within its own deadline
    agg.save_notice(CHIEF, CKPT, 0, False)
    assert agg.contribute(0, _grad(part, CHIEF)) == SyncResult(1, accepted=True, completed=True)
    thread.join(10)
    assert out["result"] == SyncResult(1, accepted=True, completed=False, counted=True), out  # not counted again
    assert step.value == 1 and part.value[0, 0] == -2.0 and agg.stale_dropped == 0  # its gradient applied once


def test_a_save_past_its_save_timeout_holds_the_step_no_longer_and_the_error_names_the_flag() -> None:
    """The chief's save is stuck in storage: its notices, carrying its --save-timeout of 30 s, come on for ever
    (before, the step waited as long as they came: the run hung). The step waits for it up to 30 s after the
    save's start, then times out 10 s later, and the error names the save and the flag."""
    clock = Clock()
    agg, part, step = _setup(clock)
    thread, out = _waiting(agg, part)
    agg.save_notice(CHIEF, CKPT, 130, True, bound=30.0)
    _until_answered(thread, clock, agg._cond, lambda: agg.save_notice(CHIEF, CKPT, 130, True, bound=30.0), limit=200.0)
    assert clock.now <= 42.0, clock.now  # 30 s of the save, then the step's 10 s
    message = str(out["error"])
    assert "sync step 0 timed out" in message, message
    assert (f"/job:worker/task:0 was saving a checkpoint into {CKPT} at global_step 130 for 40.0 s, longer than its "
            "--save-timeout (30 s)") in message, message
    assert step.value == 0 and part.value[0, 0] == 0.0


def test_a_timed_out_steps_refusal_names_the_ps_task_once() -> None:
    """The refusal a worker gets (psflow.rpc.api.refusal adds the serving task and the method) named the task
    twice: '/job:ps/task:0: PushPull: /job:ps/task:0: sync step ...'."""
    clock = Clock()
    agg, part, _ = _setup(clock)
    thread, out = _waiting(agg, part)
    _until_answered(thread, clock, agg._cond, lambda: agg.save_notice("/job:worker/task:7", CKPT, None, False))  # (wakes it)
    text = refusal("/job:ps/task:0", "PushPull", out["error"]).text
    assert text.startswith("/job:ps/task:0: PushPull: sync step 0 timed out after 10.0 s"), text
    assert text.count("/job:ps/task:0") == 1, text


def test_a_restarted_chief_ends_its_save_and_a_later_timeout_names_no_save() -> None:
    """The chief dies while saving (its notices stop at 8 s) and its new process registers at 9 s: the save is
    over (the hold ends with its chief, the step's timeout runs from the registration); the new process's
    gradient completes the step. A later step that times out waiting for the chief names no save: before, it
    said the chief 'was saving' the dead process's checkpoint, which nobody was doing."""
    clock = Clock()
    agg, part, step = _setup(clock)
    thread, out = _waiting(agg, part)
    agg.save_notice(CHIEF, CKPT, 130, True, incarnation=1)
    clock.now = 8.0
    agg.save_notice(CHIEF, CKPT, 130, True, incarnation=1)
    clock.now = 9.0
    agg.registered(CHIEF)
    clock.now = 18.5  # within 10 s of the registration
    agg.save_notice("/job:worker/task:7", CKPT, None, False)  # wakes the waiting push; no worker of the step
    thread.join(0.05)
    assert thread.is_alive() and "error" not in out, out
    assert agg.contribute(0, _grad(part, CHIEF)).completed
    thread.join(10)
    assert out["result"].accepted and step.value == 1, out
    later, late = _waiting(agg, part, 1, resent=False)
    while agg.stats()["sync_contributed"] != [OTHER]:
        later.join(0.01)
    clock.now = 30.0
    agg.save_notice("/job:worker/task:7", CKPT, None, False)
    later.join(10)
    message = str(late["error"])
    assert "sync step 1 timed out" in message and "missing: /job:worker/task:0" in message, message
    assert "sav" not in message.split("missing:")[1], message


def test_another_chiefs_save_ends_the_dead_chiefs_and_the_message_says_it_ended() -> None:
    """Worker 0 (the chief) dies while saving; worker 1, elected, starts saving: worker 0's save is over, not 'under
    way', in what a step names; so is a save of an earlier process of the same worker when a later one saves."""
    clock = Clock()
    hold = SaveHold(clock)
    hold.notice(CHIEF, CKPT, 130, True, incarnation=1)
    clock.now = 5.0
    hold.notice(OTHER, CKPT, 140, True, incarnation=2)
    clock.now = 7.0
    described = hold.describe([CHIEF, OTHER], since=1.0)
    assert "task:0 was saving" not in described and f"{CHIEF}'s checkpoint save into {CKPT} at global_step 130 " \
        f"ended unfinished 2.0 s ago: {OTHER} saves now" in described, described
    assert f"{OTHER} was saving a checkpoint into {CKPT} at global_step 140" in described, described
    assert hold.heard([CHIEF]) == 5.0
    hold.notice(OTHER, CKPT, 150, True, incarnation=3)  # a later process of worker 1: its save, not the earlier
    assert "global_step 140" not in hold.describe([OTHER]) and "global_step 150" in hold.describe([OTHER])
    assert hold.describe([CHIEF], since=6.0) == ""  # ended before the step began: it held nothing of it


def test_an_ssp_worker_waits_for_a_saving_chief_answered_held_and_never_declares_it_lost() -> None:
    """ssp, staleness 0: the other worker's push waits for the chief's clock while the chief saves for 40 s of a
    10 s timeout, renewing its notice every 4 s. Before, the chief was declared lost after 10 s (on_timeout=fail:
    the run failed with 'made no progress', naming nothing of the save). Now the wait is answered held every 10 s
    (before its caller's deadline), and the resend only waits; the chief's next clock lets it go."""
    clock = Clock()
    ssp = _ssp(clock, staleness=0)
    thread, out = _pushing(lambda: ssp.advance(OTHER, 1))
    assert ssp.save_notice(CHIEF, CKPT, 1, True) == 2.5
    _saving_40_s(thread, out, clock, lambda: ssp.save_notice(CHIEF, CKPT, 1, True))
    ssp.save_notice(CHIEF, CKPT, 1, False)
    assert ssp.advance(CHIEF, 1).min_clock == 1
    thread.join(10)
    assert out["result"].min_clock == 1 and not out["result"].held and out["held"] >= 1, out
    assert ssp.stats()["ssp_lost"] == []
    ssp.held(OTHER, 2, 7, incarnation=1)
    assert ssp.resent(OTHER, 2, 1) == (True, 7) and ssp.resent(OTHER, 2, 1) == (False, None)  # once: the resend
    ssp.held(OTHER, 3, 8, incarnation=1)
    assert ssp.resent(OTHER, 3, 2) == (False, None)  # a restarted process's push of that clock: applied


def test_an_ssp_chief_past_its_save_timeout_is_declared_lost_naming_the_save() -> None:
    clock = Clock()
    ssp = _ssp(clock, staleness=0)
    thread, out = _pushing(lambda: ssp.advance(OTHER, 1))
    ssp.save_notice(CHIEF, CKPT, 1, True, bound=20.0)
    _until_answered(thread, clock, ssp._cond, lambda: ssp.save_notice(CHIEF, CKPT, 1, True, bound=20.0))
    message = str(out["error"])
    assert clock.now <= 32.0 and "/job:worker/task:0 made no progress for 10.0 s" in message, (clock.now, message)
    assert "was saving a checkpoint into gs://bucket/ckpt at global_step 1 for 30.0 s, longer than its " \
        "--save-timeout (20 s)" in message, message


def test_an_ssp_worker_waiting_for_the_chiefs_initial_checkpoint_is_not_lost_at_the_chiefs_first_wait() -> None:
    """The other worker starts only once the chief saved the initial checkpoint (30 s here, of a 10 s timeout);
    the chief then runs 2 clocks ahead and waits for it. Before, its clock had not moved for 30 s, so it was
    declared lost at once (a real ssp run failed so, 'task:1 made no progress for 2.0 s (clock 0)', its initial
    save slowed by the object store); now it gets the timeout from the start of the chief's wait."""
    clock = Clock()
    ssp = _ssp(clock, staleness=2)
    clock.now = 30.0
    assert ssp.advance(CHIEF, 1).min_clock == 0 and ssp.advance(CHIEF, 2).min_clock == 0
    thread, out = _pushing(lambda: ssp.advance(CHIEF, 3), resent=False)
    while ssp.stats()["ssp_waits"] == 0 and thread.is_alive() and ssp.stats()["ssp_clocks"][CHIEF] != 3:
        thread.join(0.01)
    clock.now = 39.0
    ssp.save_notice("/job:worker/task:7", CKPT, None, False)  # wakes it: 9 s into its wait
    thread.join(0.05)
    assert thread.is_alive() and not out, out
    assert ssp.advance(OTHER, 1).min_clock == 1
    thread.join(10)
    assert out["result"] == Waited(1) and ssp.stats()["ssp_lost"] == [], out


def test_a_newer_process_ends_an_earlier_ones_save_but_not_its_own() -> None:
    """A backup learns of a chief's new process from its primary's entries (psflow.ps.replication.snapshot), which
    may reach it after that process's own first save notice (notices go to every member directly): the new
    process's save stays under way, the dead one's ends."""
    hold = SaveHold(lambda: 0.0)
    hold.notice(CHIEF, CKPT, 10, True, bound=600.0, incarnation=2)
    assert not hold.registered(CHIEF, 2) and "was saving" in hold.describe([CHIEF])  # its own: kept
    dead = SaveHold(lambda: 0.0)
    dead.notice(CHIEF, CKPT, 10, True, bound=600.0, incarnation=1)
    assert dead.registered(CHIEF, 2) and "its process ended" in dead.describe([CHIEF])


def test_an_ssp_chiefs_new_process_ends_its_save_and_the_wait_names_it_ended() -> None:
    """The ssp side of SaveNotices.registered (the sync side: the restarted-chief test above): the chief dies while
    saving and its new process registers at 9 s; its save holds the other worker's wait no more, and the chief,
    its clock unmoved, is declared lost 10 s later, the error naming the save as ended with its process."""
    clock = Clock()
    ssp = _ssp(clock, staleness=0)
    thread, out = _pushing(lambda: ssp.advance(OTHER, 1))
    ssp.save_notice(CHIEF, CKPT, 1, True, incarnation=1)
    clock.now = 9.0
    ssp.registered(CHIEF, 2)
    _until_answered(thread, clock, ssp._cond, lambda: ssp.save_notice("/job:worker/task:7", CKPT, None, False))
    message = str(out["error"])
    assert clock.now == 19.0 and "/job:worker/task:0 made no progress for 10.0 s" in message, (clock.now, message)
    assert "its process ended (a new one registered)" in message and "was saving" not in message, message
