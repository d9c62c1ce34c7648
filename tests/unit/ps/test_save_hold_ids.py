"""A chief's save hold and its saves' ids (psflow.ps.save_hold): a notice names its save (a counter per chief
process), so a renewal of a save overtaken by that save's end notice (the notice thread outlived the save's end:
psflow.checkpoint.save_notice sends the end from another thread) changes nothing, nor does a late end notice of
an earlier save once the next one is under way. The hold's rules run on the test's clock; the wire and the
service's, on in-process ps tasks and the real client."""

from __future__ import annotations

from typing import Any

from support import wait_until
from test_save_hold import Clock
from test_save_hold_processes import CHIEF, CKPT, _cluster

from psflow.checkpoint.save_notice import notify_save
from psflow.ps.protocol import SaveNoticeRequest
from psflow.ps.save_hold import SaveHold
from psflow.rpc.framing import Frame


def test_a_renewal_that_arrives_after_its_saves_end_does_not_reopen_the_save() -> None:
    """Save 1 starts, its end notice arrives, then its renewal sent before the end (the out-of-order pair). Before,
    the renewal started the save over: the chief's step was held up to its --save-timeout (600 s) for a save that
    was over, and a timed-out step named it as under way ('was saving ... the chief died or hung while saving?')."""
    clock = Clock()
    hold = SaveHold(clock)
    hold.notice(CHIEF, CKPT, 150, True, bound=600.0, incarnation=7, save_id=1)
    clock.now = 2.0
    hold.notice(CHIEF, CKPT, 150, False, bound=600.0, incarnation=7, save_id=1)
    clock.now = 3.0
    late = hold.notice(CHIEF, CKPT, 150, True, bound=600.0, incarnation=7, save_id=1)
    assert late is not None and late.ended == 2.0  # the save as known: over, not reopened
    clock.now = 50.0
    assert hold.heard([CHIEF]) == 2.0  # its end notice: the step's timeout runs from there, not from the renewal
    assert "was saving" not in hold.describe([CHIEF]) and "saved a checkpoint" in hold.describe([CHIEF])
    hold.notice(CHIEF, CKPT, 200, True, bound=600.0, incarnation=7, save_id=2)  # the next save is a save
    assert hold.heard([CHIEF]) == 50.0 and "was saving" in hold.describe([CHIEF])


def test_a_late_end_notice_of_the_previous_save_leaves_the_next_one_under_way() -> None:
    clock = Clock()
    hold = SaveHold(clock)
    hold.notice(CHIEF, CKPT, 150, True, bound=600.0, incarnation=7, save_id=1)
    clock.now = 5.0
    hold.notice(CHIEF, CKPT, 200, True, bound=600.0, incarnation=7, save_id=2)  # save 1's end notice was lost
    clock.now = 6.0
    hold.notice(CHIEF, CKPT, 150, False, bound=600.0, incarnation=7, save_id=1)  # ... or late
    described = hold.describe([CHIEF])
    assert f"{CHIEF} was saving a checkpoint into {CKPT} at global_step 200 (for 1.0 s" in described, described


def test_notices_without_a_save_id_keep_the_old_rule() -> None:
    """A client older than the field sends none: its renewal after the end starts a save, as before."""
    clock = Clock()
    hold = SaveHold(clock)
    hold.notice(CHIEF, CKPT, 150, True, bound=600.0, incarnation=7)
    hold.notice(CHIEF, CKPT, 150, False, bound=600.0, incarnation=7)
    clock.now = 1.0
    hold.notice(CHIEF, CKPT, 150, True, bound=600.0, incarnation=7)
    assert "was saving" in hold.describe([CHIEF])


def test_the_save_id_crosses_the_wire_and_each_save_of_a_process_gets_a_new_one() -> None:
    request = SaveNoticeRequest(CHIEF, CKPT, 3, True, 60.0, 7, save_id=4)
    assert SaveNoticeRequest.from_frame(request.to_frame()) == request
    chief, _ = _cluster(save_timeout=600.0)
    heard: list[SaveNoticeRequest] = []
    for channel in chief.channels.values():
        def recording(method: str, meta: dict[str, Any], *args: Any, _call: Any = channel.call_async,
                      **kwargs: Any) -> Any:
            if method == SaveNoticeRequest.METHOD:
                heard.append(SaveNoticeRequest.from_frame(Frame(dict(meta))))
            return _call(method, meta, *args, **kwargs)
        channel.call_async = recording  # type: ignore[method-assign]
    for _ in range(2):
        before = len(heard)
        with notify_save(chief, CKPT):  # the save lasts until its first notice went out (ended before, none is sent)
            wait_until(lambda b=before: any(n.active for n in heard[b:]), "the save's first notice", limit=60)
    ids = [(n.save_id, n.active) for n in heard]
    first, second = ids[0][0], ids[-1][0]
    assert first is not None and second is not None and second > first, ids
    assert {i for i, _ in ids} == {first, second} and (first, False) in ids and (second, False) in ids, ids


def test_a_restarted_chiefs_saves_count_from_1_again_and_are_saves() -> None:
    """Each process counts its saves from 1 (psflow.checkpoint.save_notice's counter): the restarted chief's save 1
    (a new process) is a save under way though save 1 and 2 of the process before ended; that process's late
    notices change nothing."""
    clock = Clock()
    hold = SaveHold(clock)
    for save_id in (1, 2):
        hold.notice(CHIEF, CKPT, 50 * save_id, True, bound=600.0, incarnation=7, save_id=save_id)
        hold.notice(CHIEF, CKPT, 50 * save_id, False, bound=600.0, incarnation=7, save_id=save_id)
    clock.now = 10.0
    save = hold.notice(CHIEF, CKPT, 150, True, bound=600.0, incarnation=9, save_id=1)
    assert save is not None and save.ended is None and save.incarnation == 9, save
    clock.now = 11.0
    assert hold.notice(CHIEF, CKPT, 100, False, bound=600.0, incarnation=7, save_id=2) is None  # the process before
    described = hold.describe([CHIEF])
    assert f"{CHIEF} was saving a checkpoint into {CKPT} at global_step 150 (for 1.0 s" in described, described
    clock.now = 12.0
    hold.notice(CHIEF, CKPT, 150, False, bound=600.0, incarnation=9, save_id=1)
    clock.now = 13.0
    late = hold.notice(CHIEF, CKPT, 150, True, bound=600.0, incarnation=9, save_id=1)  # its renewal, overtaken
    assert late is not None and late.ended == 12.0 and "was saving" not in hold.describe([CHIEF]), late
