"""Registration: a client's layout, optimizer and update mode on every ps task, and the wait for the chief.

:func:`register_layout` sends the ``Register`` call (:class:`~psflow.ps.protocol.RegisterRequest`)
to the task holding global_step first, which decides whether this client's
layout agrees with the registered one (so two clients never split the tasks
between them), then to the others. Only the chief's call initializes (see
:mod:`psflow.ps.service`, ``Register``); any other client asks again, with
exponential backoff (``backoff_initial`` .. ``backoff_max``), until every task
is ready: it never sleeps a fixed time. Idempotent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from psflow.ps.protocol import RegisterReply, RegisterRequest
from psflow.rpc.api import Channel, ConnectConfig, PendingReply, TaskUnavailableError, gather

__all__ = ["register_layout"]

log = logging.getLogger("psflow.ps.client")


def register_layout(channels: Mapping[int, Channel], step_task: int, request: RegisterRequest,
                    config: ConnectConfig, limit: float,
                    call: Callable[[int, RegisterRequest], PendingReply] | None = None) -> bool:
    """Registers ``request`` on every ps task (``step_task`` first); a non-chief waits for the chief.

    Blocks for one round of calls (the chief), or until every task is ready (at most ``limit`` s).
    ``call(task, request)`` sends a call (default: on ``channels[task]``; a replicated client's follows a
    shard to its new primary: Register is idempotent).

    Returns:
        True if this call created the variables on ``step_task``.

    Raises:
        FailedPreconditionError: another client registered a different layout.
        TaskUnavailableError: (non-chief) the ps tasks were not ready within ``limit`` s (names them).
    """
    meta = request.to_frame().meta
    send = call or (lambda task, r: channels[task].call_async(r.METHOD, meta))
    deadline, wait, attempt = time.monotonic() + limit, config.backoff_initial, 0
    while True:
        first = RegisterReply.from_frame(send(step_task, request).result())
        others = {i: send(i, request) for i in channels if i != step_task}
        ready = {step_task: first.ready}
        ready.update({i: RegisterReply.from_frame(reply).ready for i, reply in gather(others).items()})
        if request.chief or all(ready.values()):
            return first.created
        waiting = [channels[i].task for i, ok in sorted(ready.items()) if not ok]
        attempt += 1
        if time.monotonic() + wait > deadline:
            raise TaskUnavailableError(f"{request.client}: {', '.join(waiting)} not initialized by the chief "
                                       f"after {limit:.1f} s ({attempt} attempts)")
        if attempt % 10 == 0:
            log.info("%s: waiting for the chief to initialize %s (attempt %d)", request.client, ", ".join(waiting),
                     attempt)
        time.sleep(wait)
        wait = min(wait * 2, config.backoff_max)
