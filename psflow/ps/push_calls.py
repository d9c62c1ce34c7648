"""A push as calls to the ps tasks: each task's request, a push and a pull combined into one call per task,
the numbers that order a worker's pushes when several are in flight, the handle the calls are collected
with, and the replies read back.

:meth:`psflow.ps.client.ParameterClient.send_push_pull` builds its calls here (:func:`push_requests`,
:func:`push_pull_calls`), sends them and returns a :class:`PendingPushPull` at once; its
:meth:`~PendingPushPull.result` reads the replies (:func:`push_pull_replies`) into a :class:`PushResult`.
With ``ordered=True`` every call to a ps task carries the next number of this process's sequence to that
task (:class:`OrderedPushes`), and the ps task applies them in that order (:mod:`psflow.ps.push_order`).

Guarantees:
    * One request per ps task: only the task holding global_step counts the step (``counts``, the batch's
      examples and loss, the reader position, the read step and clock); every other task gets the same
      worker and step tags without them.
    * A push and a pull go as one call per task, the push applied before the pull is read; on a replicated
      shard a task pushed nothing gets a plain pull (no empty push to count), otherwise an empty push (so an
      ordered sequence numbers it too).
    * A :class:`PendingPushPull` is collected exactly once: a second :meth:`~PendingPushPull.result` raises
      :class:`~psflow.ps.plans.ClientError` and waits for nothing.
    * :class:`OrderedPushes` numbers each ps task's calls 0, 1, 2, ... with no gap and no repeat within a
      sequence (a number is taken only once every call of a push is built); :meth:`OrderedPushes.start`
      begins a new sequence whose ``stream`` is larger than every earlier one of this process, so the ps
      tasks refuse the older sequence's pushes from then on.

Not thread-safe: the client's training thread.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

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
from psflow.rpc.framing import Frame

__all__ = ["PushResult", "PendingPushPull", "OrderedPushes", "push_requests", "push_pull_calls", "push_pull_replies",
           "acks_later"]


@dataclass(frozen=True)
class PushResult:
    """What a push produced.

    Attributes:
        step: the global_step value this push produced (async, ssp), or the
            step its aggregated update produced (sync).
        accepted: False when the gradient was stale and dropped (sync).
        completed: True for the one push per step that owns ``step`` (in sync
            mode: the push that completed the aggregation; otherwise always).
        min_clock: the slowest live worker's clock when this one was let go (ssp).
    """

    step: int
    accepted: bool = True
    completed: bool = True
    min_clock: int | None = None


class PendingPushPull:
    """A push (and pull) :meth:`~psflow.ps.client.ParameterClient.send_push_pull` sent: :meth:`result` waits
    for it; sent with ``ack_later``, :meth:`rows` first waits for the pulled rows alone.

    Not thread-safe; collected once (a second :meth:`result` raises ClientError).
    """

    def __init__(self, client_name: str,
                 finish: Callable[[], tuple[PushResult, dict[str, np.ndarray] | None]] | None = None, *,
                 rows: Callable[[], tuple[dict[str, np.ndarray] | None, Callable[[], PushResult]]] | None = None
                 ) -> None:
        """``finish``: waits for the calls sent and reads their replies (called by the first :meth:`result`);
        or ``rows``: waits for the rows (called by the first :meth:`rows` or :meth:`result`), and returns them
        with the wait for the push's acknowledgement, which returns its result (called by :meth:`result`)."""
        self._client_name = client_name
        self._finish = finish
        self._rows = rows
        self._values: dict[str, np.ndarray] | None = None
        self._fetched = False

    def rows(self) -> dict[str, np.ndarray] | None:
        """Blocks until the pulled rows are in (sent with ``ack_later``: before the push is acknowledged; else
        with :meth:`result`'s wait) and returns them (None: nothing was pulled). Raises as :meth:`result`."""
        if self._rows is not None:
            rows, self._rows = self._rows, None
            self._values, acked = rows()
            self._finish = lambda: (acked(), self._values)
        elif not self._fetched and self._finish is not None:
            result, self._values = self._finish()
            self._finish = lambda: (result, self._values)
        self._fetched = True
        return self._values

    def result(self) -> tuple[PushResult, dict[str, np.ndarray] | None]:
        """Blocks until every ps task replied (and acknowledged the push); returns the push's result and the pulled
        values (None when nothing was pulled). Raises as :meth:`~psflow.ps.client.ParameterClient.push_pull` does
        (after every call finished)."""
        if self._rows is not None:
            self.rows()
        if self._finish is None:
            raise ClientError(f"{self._client_name}: this push's reply was collected already")
        finish, self._finish = self._finish, None
        return finish()


class OrderedPushes:
    """A client process's sequence of ordered pushes: its ``stream`` and, per ps task, the next ``seq``."""

    def __init__(self, client_name: str) -> None:
        """``client_name``: the client's task name, for errors. No sequence is started (:attr:`started`)."""
        self._client_name = client_name
        #: The current sequence (0: none started); a :func:`time.time_ns` value, larger than every earlier one.
        self.stream = 0
        self._next: dict[int, int] = {}

    @property
    def started(self) -> bool:
        """Whether :meth:`start` was called (ordered pushes may be numbered)."""
        return self.stream != 0

    def check(self, *, replicated: bool) -> None:
        """Raises ClientError, saying why, unless ordered pushes may be sent now (``replicated``: the client's
        ps shards are)."""
        if replicated:
            raise ClientError(f"{self._client_name}: ordered pushes (several in flight) are not supported with "
                              "replicated ps shards")
        if not self.started:
            raise ClientError(f"{self._client_name}: ordered pushes (several in flight) need start_ordered() first")

    def start(self) -> None:
        """Starts a new sequence: every ps task's numbers begin at 0 again, under a larger ``stream``."""
        self.stream = max(time.time_ns(), self.stream + 1)
        self._next = {}

    def number(self, calls: Mapping[int, Request], incarnation: int) -> dict[int, Request]:
        """``calls`` (pushes and push-pulls), each tagged with this process's ``incarnation``, the sequence and
        the next ``seq`` of its ps task; takes those numbers.

        Raises:
            ClientError: a call carries no push (nothing is numbered then).
        """
        out: dict[int, Request] = {}
        for task, call in calls.items():
            push = call.push if isinstance(call, PushPullRequest) else call
            if not isinstance(push, PushRequest):
                raise ClientError(f"{self._client_name}: only pushes are numbered, not {call.METHOD}")
            tag = dataclasses.replace(push.worker, incarnation=incarnation, stream=self.stream,
                                      seq=self._next.get(task, 0))
            numbered = dataclasses.replace(push, worker=tag)
            out[task] = dataclasses.replace(call, push=numbered) if isinstance(call, PushPullRequest) else numbered
        for task in out:  # (only once every request is built: a number is never skipped)
            self._next[task] = self._next.get(task, 0) + 1
        return out


def push_requests(per_task: Mapping[int, list[GradPart]], step_task: int, worker: WorkerTag, step: StepTag,
                  examples: int, loss: float | None, *, stack: bool = False) -> dict[int, PushRequest]:
    """Each ps task's push: its partitions' gradients (``per_task``) and the tags.

    ``step_task`` (the task holding global_step) gets ``worker`` and ``step`` whole and counts the step: the
    batch's ``examples`` and ``loss``; every other task gets the worker's name, process and generation (no
    reader position) and the step's ``sync_tag`` and ``step_hint`` (no read step, no clock). ``stack``: their
    sparse gradients travel stacked (:attr:`~psflow.ps.protocol.PushRequest.stack`).
    """
    out: dict[int, PushRequest] = {}
    others = [task for task in per_task if task != step_task]
    if others:  # sync mode, or variables on other tasks: the same tags for each
        tag = WorkerTag(worker.worker, worker.incarnation, worker.generation)
        steps = StepTag(sync_tag=step.sync_tag, step_hint=step.step_hint)
        out.update({task: PushRequest(per_task[task], tag, steps, stack=stack) for task in others})
    if step_task in per_task:  # it counts the step: the batch, and the reader position after it
        out[step_task] = PushRequest(per_task[step_task], worker, step, True, int(examples),
                                     None if loss is None else float(loss), stack=stack)
    return out


def push_pull_calls(pushes: Mapping[int, PushRequest], pulls: Mapping[int, Sequence[tuple[str, np.ndarray | None]]],
                    *, step_hint: int | None, client_name: str, replicated: bool, stack: bool = False
                    ) -> dict[int, Request]:
    """One call per ps task pushed to or pulled from (in task order): a push and its task's pull (a training
    lookup, ``create=True``; no rows: an empty pull) as one ``PushPull``; a task pushed nothing gets an
    empty push with its pull, or (``replicated``) a plain ``Pull``. ``stack``: the pulls' rows and their
    replies' values travel stacked (:attr:`~psflow.ps.protocol.PullRequest.stack`)."""
    calls: dict[int, Request] = {}
    for task in sorted(set(pulls) | set(pushes)):
        pull = PullRequest(pulls.get(task, ()), create=True, step_hint=step_hint, stack=stack)
        if task not in pushes and replicated:
            calls[task] = pull  # replicated: a shard pushed nothing gets a plain pull, no empty push to count
        else:
            calls[task] = PushPullRequest(pushes.get(task) or PushRequest((), WorkerTag(client_name)), pull)
    return calls


def push_pull_replies(calls: Mapping[int, Request], pushes: Collection[int], frames: Mapping[int, Frame]
                      ) -> tuple[dict[int, PushReply], dict[int, PullReply]]:
    """The replies ``frames`` to ``calls`` (plain pushes, or :func:`push_pull_calls`' calls) read back: the push
    replies of the tasks in ``pushes``, and the pull reply of every task that was asked to pull."""
    pushed: dict[int, PushReply] = {}
    pulled: dict[int, PullReply] = {}
    for task, frame in frames.items():
        call = calls[task]
        if isinstance(call, PushPullRequest):
            reply = PushPullReply.from_frame(frame)
            if task in pushes:
                pushed[task] = reply.push
            pulled[task] = reply.pull
        elif isinstance(call, PushRequest):
            pushed[task] = PushReply.from_frame(frame)
        else:
            pulled[task] = PullReply.from_frame(frame)
    return pushed, pulled


def acks_later(calls: Mapping[int, Request]) -> dict[int, Request]:
    """``calls`` with each PushPull sent as a ``PushPullAckLater`` (its reply may come before the backups
    acknowledged the push: :meth:`PendingPushPull.rows`)."""
    return {t: PushPullAckLater(c.push, c.pull) if isinstance(c, PushPullRequest) else c for t, c in calls.items()}
