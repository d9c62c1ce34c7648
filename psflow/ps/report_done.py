"""The ``Done`` call of a worker whose session ended normally, to every ps task, retried while unreachable.

:func:`send_done` is :meth:`psflow.ps.client.ParameterClient.report_done`'s loop: a ps task of ``psflow
server`` exits once every training worker said it is done (:mod:`psflow.ps.run_end`), so a task that could
not be reached is asked again; one that refused is not (asking again gets the same answer), unless its shard
failed over meanwhile (a replicated shard: ``reroute`` follows it to its new primary, which is asked).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from psflow.ps.protocol import DoneRequest
from psflow.rpc.api import Channel, DeadlineExceededError, RpcError, TaskUnavailableError

__all__ = ["send_done"]

log = logging.getLogger("psflow.ps.client")


def send_done(client_name: str, channels: Mapping[int, Channel], meta: Mapping[str, Any], *, attempts: int,
              reroute: Callable[[Mapping[int, RpcError]], set[int]] | None = None) -> list[str]:
    """Sends ``Done`` (``meta``) to every ps task of ``channels`` (task -> channel, read anew each round).

    Blocks for at most ``attempts`` rounds of 5 s calls, 0.5 s, 1 s, ... apart. Never raises.

    Args:
        client_name: the sender, in log lines.
        channels: ps task -> the channel its calls go to.
        meta: the ``Done`` request's meta.
        attempts: rounds of calls at most.
        reroute: (replicated shards) follows the failed tasks' shards to their primaries now; returns the
            shards whose route changed (asked again even after a refusal).

    Returns:
        The ps tasks that did not hear it, each logged as a WARNING (they keep serving until stopped).
    """
    pending = set(channels)  # ps task indices not yet answered
    errors: dict[int, RpcError] = {}
    for attempt in range(attempts):
        if attempt:
            time.sleep(0.5 * 2 ** (attempt - 1))
            if reroute is not None:
                pending |= reroute(errors)
        calls = {t: channels[t].call_async(DoneRequest.METHOD, meta, timeout=5.0) for t in sorted(pending)}
        for t, call in calls.items():
            try:
                call.result()
                errors.pop(t, None)
                pending.discard(t)
            except (TaskUnavailableError, DeadlineExceededError) as e:  # asked again
                errors[t] = e
            except RpcError as e:  # refused: asking again gets the same answer
                errors[t] = e
                pending.discard(t)
        if not pending:
            break
    for t, error in sorted(errors.items()):
        log.warning("%s: %s did not hear that this worker is done (%s); it serves until stopped "
                    "(psflow shutdown)", client_name, channels[t].task, error)
    return [channels[t].task for t in sorted(errors)]
