"""Registration: a client's layout, optimizer and update mode on every ps task, and the wait for the chief.

:func:`register_layout` sends the ``Register`` call (:class:`~psflow.ps.protocol.RegisterRequest`)
to the task holding global_step first, which decides whether this client's
layout agrees with the registered one (so two clients never split the tasks
between them), then to the others. Only the chief's call initializes (see
:mod:`psflow.ps.service`, ``Register``); any other client asks again until every
task is ready (:func:`ready_waits`: for about the first second, when a starting
chief usually makes them ready, every 0.02 s times the number of workers that
wait, then with exponential backoff, ``backoff_initial`` .. ``backoff_max``): it
never sleeps a fixed time. Idempotent.

A client whose call meets a ps task that is unreachable (:class:`~psflow.rpc.api.TaskUnavailableError`: the
task died, and its supervisor restarts it) asks again with the same pauses, within the same limit, as a non-chief
waits while training; a refusal (another layout: ``FailedPreconditionError``) still fails at once. The chief asks
again too: :func:`register_tasks` tells it which tasks its call created the variables on, and on which of them as a
new process's first (:class:`Registration`), so :mod:`psflow.train.chief` sees a task that restarted empty beside
ready ones however late it restarted. :func:`ask_until_reachable` asks one other call again the same way (the
reader positions and global_step a client reads right after it registered).

A chief's call names its ``attempt`` (:func:`next_attempt`, growing within the process; each round of one call
resends the same): a copy of a round that reaches a task late, once the chief's restore at start loaded it, creates
nothing there (:meth:`~psflow.ps.restore_gate.RestoreGate.superseded`).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from psflow.ps.protocol import RegisterReply, RegisterRequest
from psflow.rpc.api import Channel, ConnectConfig, PendingReply, RpcError, TaskUnavailableError

__all__ = ["register_layout", "register_tasks", "Registration", "ready_waits", "ask_until_reachable", "next_attempt"]

log = logging.getLogger("psflow.ps.client")

#: The non-chiefs' asks while the chief initializes, all of them together: one every ``_FAST_POLL`` s at each ps
#: task, ``_FAST_ASKS`` in all (about a second).
_FAST_POLL, _FAST_ASKS = 0.02, 50

_T = TypeVar("_T")

_attempts = itertools.count(1)


def next_attempt() -> int:
    """A chief's next registration call's ``attempt`` (:class:`~psflow.ps.protocol.RegisterRequest`): greater than
    every one this process handed out before."""
    return next(_attempts)


@dataclass(frozen=True)
class Registration:
    """What one :func:`register_tasks` call found, by ps task index (a chief's; a non-chief's creates nothing).

    Attributes:
        created: the tasks this call created the variables on (each was not ready), in any of its rounds.
        new: of those, the tasks where that was the first creation of their process (it held no variables: a
            new cluster's task, or one that died and came back empty); the others held variables that were never
            made ready (a chief died while initializing), which are created again.
        kept: the tasks that were ready: their variables (trained ones, for all the chief knows) were kept.

    A task in neither ``created`` nor ``kept`` was being restored (``BeginRestore`` until ``SetReady``,
    :attr:`~psflow.ps.restore_gate.RestoreGate.restoring`): its Register created nothing (``created: false,
    ready: false``) and the values loaded so far stayed.
    """

    created: frozenset[int]
    new: frozenset[int]
    kept: frozenset[int]


def ready_waits(config: ConnectConfig, *, askers: int = 1) -> Iterator[float]:
    """The pauses of a non-chief between two asks whether every ps task is ready; endless, pure.

    ``_FAST_ASKS // askers`` pauses of ``_FAST_POLL * askers`` s (at most ``backoff_initial``) first: a run's workers
    start together and the chief makes the tasks ready a fraction of a second after the others first ask (doubling
    from 0.05 s, a worker started its first step up to 0.35 s after the chief's initialization, every run). Then
    exponential backoff from ``backoff_initial`` to ``backoff_max``, for a chief that restores a checkpoint or is slow
    to start.

    Args:
        askers: the workers that wait together (all but the chief). The fast pause grows with them, so that each ps
            task gets at most ``1 / _FAST_POLL`` asks a second from all of them (or as many as their backoff's first
            pauses make): a Register call that finds the tasks not ready costs the ps 0.16-0.55 ms (2-30 variables;
            4.5 ms at 300), and ps task 0 also serves the chief's initialization meanwhile.
    """
    spread = max(1, askers)
    fast = min(_FAST_POLL * spread, config.backoff_initial)
    for _ in range(_FAST_ASKS // spread):
        yield fast
    wait = config.backoff_initial
    while True:
        yield wait
        wait = min(wait * 2, config.backoff_max)


def _limits(limit: float, config: ConnectConfig, initialized: bool) -> str:
    """The limits a non-chief's wait for the ready tasks ran out of, with their flags (``limit`` is
    ``--connect-timeout`` unless a caller chose another)."""
    wait = f"--connect-timeout, {limit:g} s" if limit == config.connect_timeout else f"{limit:g} s"
    if not initialized:
        return f"the limit: {wait}"
    return (f"the limit: {wait}, then --save-timeout, {config.save_timeout:g} s, for the chief's restore or initial "
            "checkpoint: raise --save-timeout for a bigger model or slower storage")


def register_layout(channels: Mapping[int, Channel], step_task: int, request: RegisterRequest,
                    config: ConnectConfig, limit: float,
                    call: Callable[[int, RegisterRequest], PendingReply] | None = None, *, askers: int = 1) -> bool:
    """:func:`register_tasks`; True if the call created the variables on ``step_task``."""
    return step_task in register_tasks(channels, step_task, request, config, limit, call, askers=askers).created


def register_tasks(channels: Mapping[int, Channel], step_task: int, request: RegisterRequest,
                   config: ConnectConfig, limit: float,
                   call: Callable[[int, RegisterRequest], PendingReply] | None = None, *,
                   askers: int = 1) -> Registration:
    """Registers ``request`` on every ps task (``step_task`` first); a non-chief waits for the chief.

    Blocks until every task answered (the chief), or until every task is ready: ``limit`` s (the last pause is cut to
    end there, and a last round asked then), and once the
    chief has created the variables on every task (it then restores a checkpoint or writes the initial one before
    making them ready, which takes as long as the model is big) ``config.save_timeout`` s more (``--save-timeout``,
    the deadline of that save's or restore's calls), counted from then (and ``limit`` s at least).
    ``call(task, request)`` sends a call (default: on ``channels[task]``; a replicated client's follows a
    shard to its new primary: Register is idempotent). ``askers``: the non-chiefs that wait together
    (:func:`ready_waits`).

    An unreachable task is asked again within the same limit (the chief's too: a round with one asks every task
    again; what earlier rounds created is counted in the result).

    Returns:
        The tasks the call created the variables on, and which held none before (:class:`Registration`).

    Raises:
        FailedPreconditionError: another client registered a different layout.
        TaskUnavailableError: the ps tasks were not ready in time (non-chief), or one stayed unreachable that long
            (names them, how long it waited and the limit).
    """
    meta = request.to_frame().meta
    send = call or (lambda task, r: channels[task].call_async(r.METHOD, meta))
    start = time.monotonic()
    deadline, waits, attempt, initialized = start + limit, ready_waits(config, askers=askers), 0, False
    created: set[int] = set()
    new: set[int] = set()
    while True:
        replies, gone = _ask(send, channels, step_task, request)
        created |= {i for i, reply in replies.items() if reply.created}
        new |= {i for i, reply in replies.items() if reply.created and reply.init_count == 1}
        if not gone and (request.chief or all(reply.ready for reply in replies.values())):
            kept = frozenset(i for i, reply in replies.items() if not reply.created and reply.ready) - created
            return Registration(frozenset(created), frozenset(new), kept)
        waiting = [channels[i].task for i, reply in sorted(replies.items()) if not reply.ready]
        if not gone and not initialized and all(reply.init_count > 0 for reply in replies.values()):
            # The chief created the variables: it now restores a checkpoint or writes the initial one before making
            # the tasks ready, as long as the model is big; that save's own deadline comes on top of the limit.
            initialized, deadline = True, max(deadline, time.monotonic() + limit) + config.save_timeout
        attempt += 1
        wait = next(waits)
        left = deadline - time.monotonic()  # the last pause ends at the limit, and one more ask is made there
        if gone:
            _unreachable(request.client, ", ".join(channels[i].task for i in sorted(gone)), gone[min(gone)],
                         time.monotonic() - start, attempt, left, _limits(limit, config, initialized))
            time.sleep(min(wait, left))
            continue
        doing = "made ready by the chief (it created the variables; its restore or initial checkpoint went on)" \
            if initialized else "initialized by the chief"
        if left <= 0:
            raise TaskUnavailableError(f"{request.client}: {', '.join(waiting)} not {doing} after "
                                       f"{time.monotonic() - start:.1f} s ({attempt} attempts; "
                                       f"{_limits(limit, config, initialized)})")
        if attempt % 10 == 0 and attempt >= _FAST_ASKS:
            log.info("%s: waiting for the chief to %s %s (attempt %d)", request.client,
                     "restore or save the initial checkpoint of" if initialized else "initialize",
                     ", ".join(waiting), attempt)
        time.sleep(min(wait, left))


def _unreachable(client: str, tasks: str, error: TaskUnavailableError, waited: float, attempt: int, left: float,
                 limits: str) -> None:
    """After ``attempt`` calls met ``tasks`` unreachable: logs one INFO line every 10 attempts, or raises at the limit.

    Raises:
        TaskUnavailableError: ``left <= 0`` (one line: the tasks, how long, the limit, the channel's last error).
    """
    if left <= 0:
        raise TaskUnavailableError(f"{client}: {tasks} unreachable after {waited:.1f} s ({attempt} attempts; "
                                   f"{limits}): {error}")
    if attempt % 10 == 0:
        log.info("%s: %s unreachable (a ps task restarting?); asking again for %.0f s more (attempt %d)",
                 client, tasks, left, attempt)


def ask_until_reachable(ask: Callable[[], _T], *, client: str, task: str, config: ConnectConfig,
                        limit: float) -> _T:
    """``ask()``, asked again while it raises :class:`~psflow.rpc.api.TaskUnavailableError` (``task``, e.g. ps
    task 0, restarting), with :func:`ready_waits`' pauses and log lines, for at most ``limit`` s; ``client`` names
    the asker in them. Any other error propagates at once.

    Raises:
        TaskUnavailableError: still unreachable after ``limit`` s (one line, as :func:`register_tasks`').
    """
    start, waits, attempt = time.monotonic(), ready_waits(config), 0
    while True:
        try:
            return ask()
        except TaskUnavailableError as e:
            attempt += 1
            left = start + limit - time.monotonic()
            _unreachable(client, task, e, time.monotonic() - start, attempt, left, _limits(limit, config, False))
            time.sleep(min(next(waits), left))


def _ask(send: Callable[[int, RegisterRequest], PendingReply], channels: Mapping[int, Channel], step_task: int,
         request: RegisterRequest) -> tuple[dict[int, RegisterReply], dict[int, TaskUnavailableError]]:
    """One round of Register calls: ``step_task`` first (it decides whether the layout agrees), then the others
    together, each collected. Returns the replies and the tasks found unreachable (none of the others is asked when
    ``step_task`` is one).

    Raises:
        RpcError: any other failure of a call (e.g. ``FailedPreconditionError``), once every call finished.
    """
    try:
        first = RegisterReply.from_frame(send(step_task, request).result())
    except TaskUnavailableError as e:
        return {}, {step_task: e}
    calls = {i: send(i, request) for i in channels if i != step_task}
    replies: dict[int, RegisterReply] = {step_task: first}
    gone: dict[int, TaskUnavailableError] = {}
    error: RpcError | None = None
    for i, pending in calls.items():
        try:
            replies[i] = RegisterReply.from_frame(pending.result())
        except TaskUnavailableError as e:
            gone[i] = e
        except RpcError as e:
            error = error or e
    if error is not None:
        raise error
    return replies, gone
