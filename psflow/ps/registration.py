"""Registration: a client's layout, optimizer and update mode on every ps task, and the wait for the chief.

:func:`register_layout` sends the ``Register`` call (:class:`~psflow.ps.protocol.RegisterRequest`)
to the task holding global_step first, which decides whether this client's
layout agrees with the registered one (so two clients never split the tasks
between them), then to the others. Only the chief's call initializes (see
:mod:`psflow.ps.service`, ``Register``); any other client asks again until every
task is ready (:func:`ready_waits`: every 0.02 s for about the first second, when
a starting chief usually makes them ready, then with exponential backoff,
``backoff_initial`` .. ``backoff_max``): it never sleeps a fixed time. Idempotent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping

from psflow.ps.protocol import RegisterReply, RegisterRequest
from psflow.rpc.api import Channel, ConnectConfig, PendingReply, TaskUnavailableError, gather

__all__ = ["register_layout", "ready_waits"]

log = logging.getLogger("psflow.ps.client")

#: A non-chief's asks while the chief initializes: every ``_FAST_POLL`` s, ``_FAST_ASKS`` times (about a second).
_FAST_POLL, _FAST_ASKS = 0.02, 50


def ready_waits(config: ConnectConfig) -> Iterator[float]:
    """The pauses of a non-chief between two asks whether every ps task is ready; endless, pure.

    ``_FAST_ASKS`` pauses of ``_FAST_POLL`` s (at most ``backoff_initial``) first: a run's workers start together and
    the chief makes the tasks ready a fraction of a second after the others first ask (doubling from 0.05 s, a worker
    started its first step up to 0.35 s after the chief's initialization, every run). Then exponential backoff from
    ``backoff_initial`` to ``backoff_max``, for a chief that restores a checkpoint or is slow to start. A Register call
    that finds the tasks not ready is cheap on the ps (a layout compared).
    """
    fast = min(_FAST_POLL, config.backoff_initial)
    for _ in range(_FAST_ASKS):
        yield fast
    wait = config.backoff_initial
    while True:
        yield wait
        wait = min(wait * 2, config.backoff_max)


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
    deadline, waits, attempt = time.monotonic() + limit, ready_waits(config), 0
    while True:
        first = RegisterReply.from_frame(send(step_task, request).result())
        others = {i: send(i, request) for i in channels if i != step_task}
        ready = {step_task: first.ready}
        ready.update({i: RegisterReply.from_frame(reply).ready for i, reply in gather(others).items()})
        if request.chief or all(ready.values()):
            return first.created
        waiting = [channels[i].task for i, ok in sorted(ready.items()) if not ok]
        attempt += 1
        wait = next(waits)
        if time.monotonic() + wait > deadline:
            raise TaskUnavailableError(f"{request.client}: {', '.join(waiting)} not initialized by the chief "
                                       f"after {limit:.1f} s ({attempt} attempts)")
        if attempt % 10 == 0 and attempt >= _FAST_ASKS:
            log.info("%s: waiting for the chief to initialize %s (attempt %d)", request.client, ", ".join(waiting),
                     attempt)
        time.sleep(wait)
