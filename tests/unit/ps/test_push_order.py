"""A worker process's numbered pushes (``seq``) are applied by a ps task in the order made, whatever the
order they arrive in; after a gap or a refusal none of the later ones is (psflow.ps.push_order)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from support import registered_ps_task as registered

from psflow.ps.protocol import PullRequest, PushPullReply, PushPullRequest, PushRequest
from psflow.ps.push_order import PushOrder
from psflow.ps.service import ParameterService
from psflow.rpc.api import InvalidRequest, PreconditionFailed
from psflow.rpc.framing import Frame

pytestmark = pytest.mark.timeout(60)


def push_frame(seq: int | None, position: str, *, incarnation: int = 100, rows: int = 1,
               generation: int | None = None, stream: int = 7) -> Frame:
    meta: dict[str, object] = {"grads": [["w/part_0", "sparse"]], "step": True, "examples": 4, "worker": "w1",
                               "incarnation": incarnation, "position": position}
    if seq is not None:
        meta.update(seq=seq, stream=stream)
    if generation is not None:
        meta["generation"] = generation
    return Frame(meta, {"g/w/part_0": np.ones((rows, 2), np.float32), "i/w/part_0": np.array([3] * rows)})


class Sent(threading.Thread):
    """One push in a thread of its own (as a server's handler thread runs it): its reply or its error."""

    def __init__(self, svc: ParameterService, frame: Frame) -> None:
        super().__init__(daemon=True)
        self.svc, self.frame = svc, frame
        self.reply: dict[str, object] | None = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.reply = self.svc.push(self.frame)[0]
        except BaseException as e:  # noqa: BLE001 -- reported to the test
            self.error = e


def waiting(order: ParameterService | PushOrder, n: int, timeout: float = 10.0) -> None:
    """Blocks until ``n`` pushes wait for their turn in ``order`` (a service's: its ``order``); deterministic:
    no sleep stands for an order."""
    if isinstance(order, ParameterService):
        order = order.order
    deadline = time.monotonic() + timeout
    while order.waiting() < n:
        if time.monotonic() > deadline:
            raise AssertionError(f"{order.waiting()} pushes wait, expected {n}")
        time.sleep(0.001)


def test_pushes_arriving_out_of_order_are_applied_in_the_order_made() -> None:
    svc = registered()
    late = [Sent(svc, push_frame(2, "p2")), Sent(svc, push_frame(1, "p1"))]
    waiting(svc, 2)
    assert svc.global_step is not None and svc.global_step.value == 0  # nothing applied before seq 0
    first = svc.push(push_frame(0, "p0"))[0]
    for t in late:
        t.join(10)
    assert first["step"] == 1 and late[1].reply is not None and late[1].reply["step"] == 2
    assert late[0].reply is not None and late[0].reply["step"] == 3
    assert svc.workers.positions() == {"w1": "p2"}  # the position recorded is the last one made


def test_a_refused_push_refuses_every_later_one_of_that_process() -> None:
    svc = registered()
    svc.push(push_frame(0, "p0"))
    later = Sent(svc, push_frame(2, "p2"))
    waiting(svc, 1)
    wrong_width = push_frame(1, "p1")
    wrong_width.arrays["g/w/part_0"] = np.ones((1, 3), np.float32)
    with pytest.raises(InvalidRequest):
        svc.push(wrong_width)
    later.join(10)
    assert isinstance(later.error, PreconditionFailed)
    assert "w1" in str(later.error) and "push 1" in str(later.error)
    with pytest.raises(PreconditionFailed, match="push 1"):
        svc.push(push_frame(3, "p3"))
    assert svc.global_step is not None and svc.global_step.value == 1
    assert svc.workers.positions() == {"w1": "p0"}


def test_a_push_whose_predecessor_never_arrives_is_refused_and_so_is_the_predecessor_later() -> None:
    svc = registered()
    svc.order.timeout = 0.2
    with pytest.raises(PreconditionFailed, match=r"w1.*push 0 .*never arrived"):
        svc.push(push_frame(1, "p1"))
    with pytest.raises(PreconditionFailed, match="push 0"):
        svc.push(push_frame(0, "p0"))  # too late: a later push was already refused
    assert svc.global_step is not None and svc.global_step.value == 0
    assert svc.workers.positions() == {}


def test_a_repeated_push_is_refused_not_applied_twice() -> None:
    svc = registered()
    svc.push(push_frame(0, "p0"))
    with pytest.raises(PreconditionFailed, match="already"):
        svc.push(push_frame(0, "p0"))
    svc.push(push_frame(1, "p1"))
    assert svc.global_step is not None and svc.global_step.value == 2


def test_a_new_process_of_the_worker_numbers_from_zero_and_the_old_ones_pushes_are_refused() -> None:
    svc = registered()
    svc.push(push_frame(0, "a0"))
    svc.push(push_frame(1, "a1"))
    svc.push(push_frame(0, "b0", incarnation=200))
    with pytest.raises(PreconditionFailed, match="earlier process"):
        svc.push(push_frame(2, "a2"))
    svc.push(push_frame(1, "b1", incarnation=200))
    assert svc.global_step is not None and svc.global_step.value == 4
    assert svc.workers.positions() == {"w1": "b1"}


def test_unnumbered_pushes_are_applied_on_arrival_as_before() -> None:
    svc = registered()
    svc.push(push_frame(None, "p0"))
    svc.push(push_frame(None, "p1"))
    assert svc.global_step is not None and svc.global_step.value == 2 and svc.order.waiting() == 0


def push_pull_frame(seq: int, position: str) -> Frame:
    return PushPullRequest(PushRequest.from_frame(push_frame(seq, position)),
                           PullRequest((("w/part_0", np.array([3])),), create=True)).to_frame()


def test_a_push_pull_is_ordered_as_a_push_and_its_pull_reads_after_it() -> None:
    svc = registered()
    late = threading.Thread(target=svc.push_pull, args=(push_pull_frame(1, "p1"),), daemon=True)
    late.start()
    waiting(svc, 1)
    reply = PushPullReply.from_frame(Frame(*svc.push_pull(push_pull_frame(0, "p0"))))
    late.join(10)
    assert reply.push.step == 1
    np.testing.assert_allclose(reply.pull.values["w/part_0"], [[0.5, 0.5]])  # after push 0 only: 1 - 0.5 x 1
    assert svc.global_step is not None and svc.global_step.value == 2


def test_seq_travels_with_the_push_and_a_bad_one_is_refused() -> None:
    request = PushRequest.from_frame(push_frame(7, "p"))
    assert request.worker.seq == 7
    assert PushRequest.from_frame(request.to_frame()).worker.seq == 7
    assert request.worker.stream == 7
    for key in ("seq", "stream"):
        for bad in (-1, "1", 1.5, True, None):
            frame = push_frame(0, "p")
            frame.meta[key] = bad
            with pytest.raises(InvalidRequest, match="seq"):
                PushRequest.from_frame(frame)
    without = push_frame(0, "p")
    del without.meta["incarnation"]
    with pytest.raises(InvalidRequest, match="seq"):
        PushRequest.from_frame(without)


def test_a_new_process_refuses_the_old_ones_waiting_pushes_and_the_old_ones_pass_through_unordered() -> None:
    order = PushOrder("/job:ps/task:0", timeout=30.0)
    refused: list[BaseException] = []

    def old_push() -> None:
        try:
            order.enter("w", 100, 7, 1)  # waits for push 0 of process 100, which never comes
        except PreconditionFailed as e:
            refused.append(e)

    waiter = threading.Thread(target=old_push, daemon=True)
    waiter.start()
    waiting(order, 1)
    assert order.enter("w", 200, 7, 0) is True  # the new process: its own sequence, no wait
    waiter.join(10)
    assert len(refused) == 1 and "later process" in str(refused[0])
    order.leave("w", 200, 7, 0, ok=True)
    assert order.enter("w", 100, 7, 5) is False  # the old process's push: the ledger refuses it, not the order
    assert order.waiting() == 0


def test_a_new_sequence_of_the_same_process_starts_at_zero_and_refuses_the_older_ones_pushes() -> None:
    svc = registered()
    svc.push(push_frame(0, "a0", stream=1))
    stale = Sent(svc, push_frame(2, "a2", stream=1))  # waits for push 1 of sequence 1, which never comes
    waiting(svc, 1)
    svc.push(push_frame(0, "b0", stream=2))  # e.g. the worker's loop started again after a recovery
    stale.join(10)
    assert isinstance(stale.error, PreconditionFailed) and "later sequence" in str(stale.error)
    with pytest.raises(PreconditionFailed, match="earlier sequence"):
        svc.push(push_frame(1, "a1", stream=1))
    svc.push(push_frame(1, "b1", stream=2))
    assert svc.global_step is not None and svc.global_step.value == 3
    assert svc.workers.positions() == {"w1": "b1"}
