"""Rows first: a ``PushPullAckLater``'s replies read before its push is acknowledged (issue 28).

:meth:`ParameterClient.send_push_pull(ack_later=True) <psflow.ps.client.ParameterClient.send_push_pull>`
(replicated shards, async) gets each shard's rows while its backups still acknowledge the push
(:mod:`psflow.ps.replication.data_calls`). :func:`read_rows` waits for those replies
(:meth:`~psflow.ps.task_calls.TaskCalls.collect_rows`), reads them, and sends each pushed shard its ``Acked``
call (:meth:`~psflow.ps.task_calls.TaskCalls.send_acked`), whose replies the step's result waits for.

Guarantee: every shard that applied the push and replied gets its ``Acked`` call, waited for and counted
acknowledged, also when its reply cannot be read (a frame that does not decode, a partition's rows missing):
the error is raised after that, as one :class:`~psflow.ps.plans.ClientError` naming the ps task, or the
variable whose rows are at fault. A reply left unread without its ``Acked`` kept the push applied on the
primary and never counted acknowledged (``pushes_applied`` above ``pushes_acknowledged`` in metrics.json,
no process killed).

Not thread-safe: the client's training thread.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

import numpy as np

from psflow.errors import PsflowError
from psflow.ps.plans import ClientError
from psflow.ps.protocol import PullReply, PushReply, Request
from psflow.ps.push_calls import PushResult, push_pull_replies
from psflow.ps.task_calls import TaskCalls
from psflow.rpc.api import PendingReply
from psflow.rpc.framing import Frame

__all__ = ["READ_ERRORS", "read_rows"]

#: What reading a reply may raise: a field of the wrong type or range (FrameError, InvalidRequest), a reply short
#: of what was asked (ClientError, KeyError), an array that does not fit where its rows go (numpy's ValueError).
READ_ERRORS: tuple[type[Exception], ...] = (PsflowError, LookupError, ValueError, TypeError)

Values = dict[str, np.ndarray] | None


def read_rows(calls: Mapping[int, Request], sent: Mapping[int, PendingReply], pushes: Collection[int],
              task_calls: TaskCalls, *, read: Callable[[dict[int, PushReply], dict[int, PullReply]], Values],
              result: Callable[[Mapping[int, PushReply]], PushResult], timeout: float | None, client_name: str
              ) -> tuple[Values, Callable[[], PushResult]]:
    """Blocks until every call of ``calls`` (sent as ``sent``; ``pushes``: the shards pushed to) replied with its
    rows, reads them (``read``: the push and pull replies -> the pulled values) and sends each pushed shard whose
    acknowledgement is pending its ``Acked`` call.

    Returns:
        The values, and the wait for the acknowledgements (call it once): ``result`` of every shard's push reply.

    Raises:
        RpcError: a shard's call failed (as :meth:`~psflow.ps.task_calls.TaskCalls.collect_rows`).
        ClientError: a reply could not be read (raised once the pushed shards' ``Acked`` calls replied).
    """
    frames = task_calls.collect_rows(calls, sent, pushes, timeout=timeout)  # not acknowledged yet
    try:
        pushed, pulled = _replies(calls, pushes, frames, task_calls, client_name)
        values = read(pushed, pulled)
        # Every reply's ack_pending is read before an Acked call goes out: one that cannot be read leaves them all to
        # acknowledge_applied below.
        acks = task_calls.send_acked(calls, {t: frames[t] for t in pushes}, timeout=timeout)
    except READ_ERRORS as e:
        task_calls.acknowledge_applied(calls, [t for t in sorted(frames) if t in pushes], timeout=timeout)
        if isinstance(e, ClientError):
            raise
        tasks = ", ".join(_name(task_calls, t) for t in sorted(frames))
        raise ClientError(f"{client_name}: the rows from {tasks} cannot be read: {e}") from e
    return values, lambda: result({**pushed, **{t: PushReply.from_frame(frame) for t, frame in acks().items()}})


def _replies(calls: Mapping[int, Request], pushes: Collection[int], frames: Mapping[int, Frame],
             task_calls: TaskCalls, client_name: str) -> tuple[dict[int, PushReply], dict[int, PullReply]]:
    """The replies read back, one shard at a time, so that an error names the shard whose reply it was."""
    pushed: dict[int, PushReply] = {}
    pulled: dict[int, PullReply] = {}
    for task in sorted(frames):
        try:
            one_pushed, one_pulled = push_pull_replies(calls, pushes, {task: frames[task]})
        except READ_ERRORS as e:
            raise ClientError(f"{client_name}: the reply of {_name(task_calls, task)} to {calls[task].METHOD} "
                              f"cannot be read: {e}") from e
        pushed.update(one_pushed)
        pulled.update(one_pulled)
    return pushed, pulled


def _name(task_calls: TaskCalls, task: int) -> str:
    return f"{task_calls.channels[task].task} (ps shard {task})"
