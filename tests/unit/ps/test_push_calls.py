"""A push as calls (psflow/ps/push_calls.py): each task's request and tags, a push and a pull in one call per
task, the replies read back, the numbers of ordered pushes, the pending handle collected once. Messages only,
no service and no sockets."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from psflow.ps.plans import ClientError
from psflow.ps.protocol import (
    GradPart,
    PullReply,
    PullRequest,
    PushPullAckLater,
    PushPullReply,
    PushPullRequest,
    PushReply,
    PushRequest,
    Request,
    StepTag,
    WorkerTag,
)
from psflow.ps.push_calls import (
    OrderedPushes,
    PendingPushPull,
    PushResult,
    acks_later,
    push_pull_calls,
    push_pull_replies,
    push_requests,
)
from psflow.ps.push_numbers import at_epoch

pytestmark = pytest.mark.timeout(30)

W0 = "/job:worker/task:0"


def _grad(key: str) -> list[GradPart]:
    return [(key, np.ones(2, np.float32), None)]


def test_only_the_task_holding_global_step_counts_the_step_and_gets_the_reader_position() -> None:
    worker = WorkerTag(W0, incarnation=7, generation=2, position='{"file": 3}')
    step = StepTag(read_step=10, clock=4, sync_tag=10, step_hint=11)
    out = push_requests({0: _grad("a/part_0"), 1: _grad("a/part_1")}, 0, worker, step, 32, 0.5)
    assert (out[0].worker, out[0].steps, out[0].step, out[0].examples, out[0].loss) == (worker, step, True, 32, 0.5)
    assert out[1].worker == WorkerTag(W0, incarnation=7, generation=2)  # no reader position
    assert out[1].steps == StepTag(sync_tag=10, step_hint=11)  # no read step, no clock
    assert (out[1].step, out[1].examples, out[1].loss) == (False, 0, None)
    assert [key for key, _, _ in out[1].grads] == ["a/part_1"]


def test_a_push_without_a_part_on_the_step_task_does_not_count_a_step() -> None:
    out = push_requests({1: _grad("b")}, 0, WorkerTag(W0), StepTag(step_hint=3), 8, None)
    assert list(out) == [1] and out[1].step is False


def test_a_push_and_a_pull_go_as_one_call_per_task_in_task_order() -> None:
    pushes = {2: PushRequest(_grad("x"), WorkerTag(W0)), 0: PushRequest(_grad("y"), WorkerTag(W0))}
    pulls = {1: [("z", np.array([4], np.int64))], 2: [("x", None)]}
    calls = push_pull_calls(pushes, pulls, step_hint=5, client_name=W0, replicated=False)
    assert list(calls) == [0, 1, 2]
    assert all(isinstance(c, PushPullRequest) for c in calls.values())
    first, only_pulled, last = (calls[0], calls[1], calls[2])
    assert isinstance(first, PushPullRequest) and first.push is pushes[0] and list(first.pull.parts) == []
    assert isinstance(only_pulled, PushPullRequest) and list(only_pulled.push.grads) == []  # an empty push
    assert only_pulled.push.worker == WorkerTag(W0)
    assert isinstance(last, PushPullRequest) and last.push is pushes[2]
    assert all(isinstance(c, PushPullRequest) and c.pull.create and c.pull.step_hint == 5 for c in calls.values())


def test_a_replicated_shard_pushed_nothing_gets_a_plain_pull() -> None:
    calls = push_pull_calls({0: PushRequest(_grad("y"))}, {1: [("z", None)]}, step_hint=None, client_name=W0,
                            replicated=True)
    assert isinstance(calls[0], PushPullRequest)
    assert calls[1] == PullRequest([("z", None)], create=True, step_hint=None)


def test_replies_are_read_as_their_calls_were_sent() -> None:
    pushed = PushReply(6)
    pull = PullReply(6, {"v": np.zeros(1, np.float32)})
    calls: dict[int, Request] = {0: PushPullRequest(PushRequest(_grad("a")), PullRequest(())),
                                 1: PushPullRequest(PushRequest(()), PullRequest([("v", None)])),
                                 2: PullRequest([("v", None)])}
    frames = {0: PushPullReply(pushed, pull).to_frame(), 1: PushPullReply(PushReply(None), pull).to_frame(),
              2: pull.to_frame()}
    pushes, pulls = push_pull_replies(calls, {0}, frames)
    assert list(pushes) == [0] and pushes[0].step == 6  # the empty push's reply is no push result
    assert sorted(pulls) == [0, 1, 2] and all(r.step == 6 for r in pulls.values())
    only_pushes, none_pulled = push_pull_replies({3: PushRequest(_grad("a"))}, {3}, {3: PushReply(9).to_frame()})
    assert only_pushes[3].step == 9 and none_pulled == {}


def test_ordered_pushes_are_numbered_per_task_without_a_gap_and_a_new_sequence_starts_at_zero() -> None:
    ordered = OrderedPushes(W0)
    assert not ordered.started
    ordered.start()
    first = ordered.stream
    push = PushRequest(_grad("a"), WorkerTag(W0))
    seqs = []
    for calls in ({0: push, 1: push}, {0: push}, {0: PushPullRequest(push, PullRequest(())), 1: push}):
        numbered = ordered.number(calls, 42)
        seqs.append({t: (c.push if isinstance(c, PushPullRequest) else c).worker.seq for t, c in numbered.items()})
    assert seqs == [{0: 0, 1: 0}, {0: 1}, {0: 2, 1: 1}]
    with pytest.raises(ClientError, match="only pushes are numbered"):
        ordered.number({0: push, 1: PullRequest(())}, 42)
    tag = ordered.number({0: push}, 42)[0]
    assert isinstance(tag, PushRequest) and tag.worker.seq == 3  # the refused call took no number
    assert (tag.worker.incarnation, tag.worker.stream) == (42, first)
    ordered.start()
    assert ordered.stream > first
    again = ordered.number({0: push}, 42)[0]
    assert isinstance(again, PushRequest) and (again.worker.seq, again.worker.stream) == (0, ordered.stream)


def test_a_pending_push_is_collected_once() -> None:
    finished: list[int] = []

    def finish() -> tuple[PushResult, dict[str, np.ndarray] | None]:
        finished.append(1)
        return PushResult(3), None

    pending = PendingPushPull(W0, finish)
    assert pending.result() == (PushResult(3), None)
    with pytest.raises(ClientError, match="collected already"):
        pending.result()
    assert finished == [1]


def test_a_pending_push_with_its_rows_first_waits_for_its_acknowledgement_once_after_them() -> None:
    """``rows`` (a PushPullAckLater's): the rows come first, each stage runs once, in order; result() after them."""
    stages: list[str] = []
    values = {"w": np.zeros(1, np.float32)}

    def acked() -> PushResult:
        stages.append("acked")
        return PushResult(5)

    def rows() -> tuple[dict[str, np.ndarray] | None, Callable[[], PushResult]]:
        stages.append("rows")
        return values, acked

    pending = PendingPushPull(W0, rows=rows)
    assert pending.rows() is values and pending.rows() is values and stages == ["rows"]  # no wait for the ack
    assert pending.result() == (PushResult(5), values) and stages == ["rows", "acked"]
    with pytest.raises(ClientError, match="collected already"):
        pending.result()
    alone = PendingPushPull(W0, rows=rows)
    assert alone.result() == (PushResult(5), values)  # result() alone runs both stages
    assert stages == ["rows", "acked", "rows", "acked"]


def test_acks_later_sends_each_push_pull_as_a_push_pull_ack_later_and_the_rest_as_they_are() -> None:
    pushes = push_requests({0: _grad("w/part_0")}, 0, WorkerTag(W0), StepTag(), 1, None)
    calls = push_pull_calls(pushes, {0: [("w/part_0", None)], 1: [("v/part_0", None)]}, step_hint=None,
                            client_name=W0, replicated=True)
    later = acks_later(calls)
    assert isinstance(later[0], PushPullAckLater) and later[0].METHOD == "PushPullAckLater"
    assert later[0].push == calls[0].push and later[1] is calls[1]  # type: ignore[attr-defined]
    assert isinstance(at_epoch(later[0], 3), PushPullAckLater)  # routed at an epoch, still sent as one
