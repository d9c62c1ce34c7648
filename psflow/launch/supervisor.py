"""Restart policy for task processes, as Kubernetes' ``restartPolicy`` has it.

:func:`decide` is the pure policy: given how a task ended and how often it
was restarted, restart it (after a backoff) or give up. :class:`Supervisor`
applies it for the local launcher's watch loop:

    1. the loop reports each task exit with :meth:`Supervisor.on_exit`, which
       logs the death (exit code or signal) and returns the decision;
    2. a task to restart is scheduled ``delay`` seconds later; the loop calls
       :meth:`Supervisor.restart_due` on every iteration, which restarts (same
       command, same port) the tasks whose time has come;
    3. a task that may not be restarted is the loop's to report:
       :meth:`Decision.reason` says why (policy, or the limit reached).

Policies:
    ``never``       a dead task stays dead (today's fail-fast default).
    ``on-failure``  restart after a non-zero exit or a signal; exit 0 is done.
    ``always``      restart after any exit (for tasks that serve forever).

Backoff: ``min(backoff_initial * backoff_factor ** n, backoff_max)`` before
restart number ``n + 1`` of a task (n = restarts so far), as Kubernetes'
CrashLoopBackOff grows and caps. At most ``max_restarts`` restarts per task.

Nothing here restores state: a restarted ps comes back empty (recovery
from checkpoints is the train package's job), a restarted worker re-registers.
A task that exits with :data:`STATE_LOST_EXIT_CODE` found a ps task's
variables lost with no checkpoint to restore them from
(:mod:`psflow.train.state_loss`): no policy restarts it, since its next
process would find the same cluster, and the run fails at once.

A member of a replicated ps shard (``--ps-replicas``) that is not restarted
(policy ``never``, or ``--max-restarts`` reached) is no loss while another
member of its shard runs: a backup holds every acknowledged update and is
promoted in its place (docs/replication.md), so the decision ``goes_on``
and the run goes on with one replica fewer. Only a shard with no member
left running lost its variables, and the run stops as for a ps task.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from psflow.cluster.replicas import BACKUP_JOB, PS_JOB

__all__ = ["RESTART_POLICIES", "STATE_LOST_EXIT_CODE", "RestartConfig", "Decision", "decide", "describe_exit",
           "Supervisor", "RestartEvent"]

log = logging.getLogger("psflow.launch")

RESTART_POLICIES = ("never", "on-failure", "always")

#: Exit status of a task that found a ps task's variables lost with no checkpoint to restore them
#: from (:class:`psflow.train.state_loss.StateLostError`); never restarted.
STATE_LOST_EXIT_CODE = 3


@dataclass(frozen=True)
class RestartConfig:
    """How dead tasks are treated.

    Attributes:
        policy: ``never`` (default: fail fast), ``on-failure`` or ``always``.
        max_restarts: restarts allowed per task over the whole run.
        backoff_initial: seconds before the first restart of a task.
        backoff_factor: growth of the wait per restart of the same task.
        backoff_max: cap of the wait, seconds.
    """

    policy: str = "never"
    max_restarts: int = 3
    backoff_initial: float = 0.5
    backoff_factor: float = 2.0
    backoff_max: float = 30.0

    def __post_init__(self) -> None:
        if self.policy not in RESTART_POLICIES:
            raise ValueError(f"restart policy must be one of {', '.join(RESTART_POLICIES)}, got {self.policy!r}")
        if self.max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.backoff_initial < 0 or self.backoff_max < self.backoff_initial or self.backoff_factor < 1:
            raise ValueError(f"backoff must satisfy 0 <= initial ({self.backoff_initial}) <= max ({self.backoff_max}) "
                             f"and factor ({self.backoff_factor}) >= 1")


@dataclass(frozen=True)
class Decision:
    """What to do with a task that exited. ``goes_on``: not restarted, but the run goes on without it (a
    replicated ps shard member whose shard has live members left)."""

    restart: bool
    delay: float
    reason: str
    goes_on: bool = False


def describe_exit(code: int) -> str:
    """``exited with code 3``, ``was killed by signal SIGKILL`` (for a negative Popen code), or
    ``exited on SIGTERM (code 143)``: a task stops in order on SIGTERM, SIGHUP or SIGINT and exits
    with ``128 + n`` (psflow.launch.lifeline)."""
    if code < 0:
        try:
            return f"was killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code - 128 in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        return f"exited on {signal.Signals(code - 128).name} (code {code})"
    return f"exited with code {code}"


def decide(config: RestartConfig, exit_code: int, restarts: int) -> Decision:
    """The restart decision for a task that exited with ``exit_code`` after ``restarts`` restarts.

    Pure: no clock, no I/O.
    """
    if config.policy == "never":
        return Decision(False, 0.0, "restart policy is 'never'")
    if exit_code == STATE_LOST_EXIT_CODE:
        return Decision(False, 0.0, "a ps task's variables are lost with no checkpoint: a restart cannot bring them back")
    if exit_code == 0 and config.policy == "on-failure":
        return Decision(False, 0.0, "exited cleanly")
    if restarts >= config.max_restarts:
        return Decision(False, 0.0, f"gave up after {restarts} restart(s) (--max-restarts {config.max_restarts})")
    delay = min(config.backoff_initial * config.backoff_factor ** restarts, config.backoff_max)
    return Decision(True, delay, f"restart {restarts + 1} of {config.max_restarts} in {delay:.1f} s")


@dataclass
class RestartEvent:
    """One death and what was done about it (for metrics.json)."""

    task: str
    pid: int
    exit: str
    decision: str
    restarted: bool
    time: float = field(default_factory=time.time)
    new_pid: int | None = None
    restarted_at: float | None = None    # wall-clock time of the restart

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


class Supervisor:
    """Applies a :class:`RestartConfig` to the tasks of one launcher; not thread-safe."""

    def __init__(self, config: RestartConfig, restart: Callable[[Any], Any], *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """Creates a supervisor.

        Args:
            config: the policy.
            restart: starts a task again (same command, same port) and returns
                the new task object; called from :meth:`restart_due` only.
                Task objects need ``name`` and ``pid`` attributes.
            clock: monotonic seconds (tests pass a fake one).
        """
        self.config = config
        self._restart = restart
        self._clock = clock
        self.restarts: dict[str, int] = {}
        self._due: list[tuple[float, Any, RestartEvent]] = []
        self.events: list[RestartEvent] = []

    def on_exit(self, task: Any, exit_code: int, *, refuse: str | None = None,
                shard_live: Callable[[], tuple[int, Sequence[str]]] | None = None,
                holds_nothing: bool = False) -> Decision:
        """Logs the death of ``task`` and decides; schedules a restart if allowed. A ps task that is
        not restarted lost its variables: the reason says so (and what would have restored them).
        ``refuse``: the policy would restart it, but the run must stop; the reason says why.
        ``shard_live``: (a member of a replicated ps shard) returns its shard and the shard's other members still
        running, called only where it is not restarted; with any, it is no loss: the decision ``goes_on`` and
        says with whom. ``holds_nothing``: a ps task the placement gives no variable (idle: lost none, still one the
        run stops without)."""
        count = self.restarts.get(task.name, 0)
        decision = decide(self.config, exit_code, count)
        if decision.restart and refuse is not None:
            decision = Decision(False, 0.0, refuse)
        elif not decision.restart and exit_code not in (0, STATE_LOST_EXIT_CODE) and shard_live is not None:
            shard, live = shard_live()
            if live:
                hint = ": --restart-policy on-failure restarts it as a backup" if self.config.policy == "never" else ""
                decision = Decision(False, 0.0, f"{decision.reason}; ps shard {shard} goes on with {', '.join(live)} "
                                    f"(not restarted{hint})", goes_on=True)
        if not decision.restart and not decision.goes_on and exit_code != 0 and getattr(task, "job", None) in (PS_JOB, BACKUP_JOB):
            if holds_nothing:
                hint = " (--restart-policy on-failure restarts it; nothing is restored)" if self.config.policy == "never" \
                    else ""
                reason = (f"{decision.reason}; it held none of the variables (idle), but a ps task of the cluster is "
                          f"gone, so the run stops{hint}")
            else:
                hint = " (--restart-policy on-failure restores them from a checkpoint)" if self.config.policy == "never" \
                    else ""
                reason = f"{decision.reason}; the variables it held are lost, so the run stops{hint}"
            decision = dataclasses.replace(decision, reason=reason)
        event = RestartEvent(task.name, task.pid, describe_exit(exit_code), decision.reason, decision.restart)
        self.events.append(event)
        level = logging.WARNING if exit_code != 0 else logging.INFO
        log.log(level, "%s (pid %d) %s: %s", task.name, task.pid, event.exit, decision.reason)
        if decision.restart:
            self.restarts[task.name] = count + 1
            self._due.append((self._clock() + decision.delay, task, event))
        return decision

    def pending(self) -> int:
        """Restarts scheduled and not yet done."""
        return len(self._due)

    def scheduled(self, name: str) -> bool:
        """Whether a restart of task ``name`` is scheduled and not yet done (safe from another thread)."""
        return any(task.name == name for _, task, _ in list(self._due))

    def cancel_pending(self, why: str) -> list[RestartEvent]:
        """Drops every restart still in its backoff (the launcher's watch returned: nothing restarts a task now), each
        event then ``restarted`` False and its ``decision`` ending ``; not made: WHY``, so metrics.json, status.json
        (the task ``dead``, not ``restarting``, its :attr:`restarts` count the restarts made) and the end's lines
        never report a restart that never happened. Returns those events."""
        cancelled = list(self._due)
        self._due.clear()
        for _, task, event in cancelled:
            event.restarted, event.decision = False, f"{event.decision}; not made: {why}"
            self.restarts[task.name] -= 1  # counted when it was scheduled (on_exit)
        return [event for _, _, event in cancelled]

    def restart_due(self) -> list[Any]:
        """Restarts every task whose backoff has passed; returns the new task objects.

        The restart callback runs on the calling thread (the local launcher's main thread), so a
        restarted task's parent-death signal is tied to a thread that lives as long as the launcher
        (psflow.launch.lifeline); a task started from another thread relies on its lifeline pipe only.
        """
        now, started = self._clock(), []
        for entry in sorted((e for e in self._due if e[0] <= now), key=lambda e: e[0]):
            self._due.remove(entry)
            _, task, event = entry
            new = self._restart(task)
            event.new_pid, event.restarted_at = new.pid, time.time()
            log.warning("restarted %s as pid %d (%s)", task.name, new.pid, event.decision)
            started.append(new)
        return started
