"""How one ps task applies pushes, by the registered update mode (:class:`~psflow.ps.sync.SyncConfig`).

* ``async``: each push is applied on arrival (the service does it).
* ``sync``: pushes are handed to a :class:`~psflow.ps.sync.SyncAggregator`,
  which applies each step once, when enough workers contributed; after each
  applied step this task's sync count moves on and the moving averages move at
  it (every task counts its own steps: ps task 0's count is global_step).
* ``ssp``: on the task holding global_step a
  :class:`~psflow.ps.staleness.StalenessClock` holds back a worker that is too far
  ahead of the slowest live one.

A restore aborts the step being collected (its pushes fail; their workers
recover) and starts the sync count over at the restored step. The chief's notices of a
checkpoint save it is making (``SaveNotice``) hold a sync step it is missing from
without timing out, and in ssp the others' wait for its clock (:mod:`psflow.ps.save_hold`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from psflow.ps.protocol import SaveNoticeRequest
from psflow.ps.staleness import StalenessClock
from psflow.ps.step_clock import StepClock
from psflow.ps.sync import AppliedStep, SyncAggregator, SyncConfig
from psflow.ps.variable_store import VariableStore

__all__ = ["UpdateMode"]

log = logging.getLogger("psflow.ps.sync")


class UpdateMode:
    """The sync aggregator or ssp clock of one ps task (neither in async mode)."""

    def __init__(self, task_name: str, clock: StepClock, variables: VariableStore) -> None:
        self.task_name = task_name
        self._clock, self._variables = clock, variables
        self.config = SyncConfig()
        #: The step's aggregation (sync mode).
        self.aggregator: SyncAggregator | None = None
        #: The workers' clocks (ssp mode, on the task holding global_step).
        self.staleness: StalenessClock | None = None
        #: (a replicated shard's primary) called with what each applied sync step wrote and whose pushes it
        #: applied; it records those pushes too (the service then does not, :attr:`counts_at_step`).
        self.on_step_applied: Callable[[AppliedStep], None] | None = None
        self._saving: set[str] = set()  # the workers whose save is under way (for the log lines)

    def configure(self, config: SyncConfig) -> None:
        """The variables were (re)created with update mode ``config`` (called inside the registration)."""
        self.config = config
        if config.mode == "sync":
            self.aggregator = SyncAggregator(config, self._variables.partitions, task_name=self.task_name,
                                             advance=self._advance, current=self._clock.sync_step,
                                             on_applied=self._step_applied if self.on_step_applied else None)
        elif config.mode == "ssp" and self._clock.global_step is not None:
            self.staleness = StalenessClock(config, task_name=self.task_name)

    def _advance(self) -> int:
        """A sync step was applied (every partition's update of it): the step advances, then the moving
        averages move at the new step (called by the aggregator, under its lock)."""
        step = self._clock.advance_sync()
        self._variables.averages.move(self._variables.partitions.partitions(), step)
        return step

    @property
    def counts_at_step(self) -> bool:
        """Whether a sync step's pushes are counted (examples, reader positions, counters) when the step is
        applied, by :attr:`on_step_applied`, rather than by each push as its wait ends."""
        return self.on_step_applied is not None and self.aggregator is not None

    def _step_applied(self, applied: AppliedStep) -> None:
        if self.on_step_applied is not None:
            self.on_step_applied(applied)

    def schedule_step(self) -> int:
        """The step a learning-rate schedule reads for the next update applied here."""
        return self._clock.sync_step() if self.aggregator is not None else self._clock.table_step()

    def leave(self, worker: str) -> None:
        """``worker`` finished its data: the step and the clock stop waiting for it."""
        if self.aggregator is not None:
            self.aggregator.leave(worker)
        if self.staleness is not None:
            self.staleness.leave(worker)

    def save_notice(self, notice: SaveNoticeRequest) -> float | None:
        """A worker's checkpoint save started, goes on or ended (:mod:`psflow.ps.save_hold`); returns the seconds
        within which to renew the notice, or None: send no more (nothing here waits for anyone: async, ssp off the
        task holding global_step; or the notice is of an earlier process of the writer than one heard of)."""
        coordinator = self.aggregator or self.staleness
        if coordinator is None:
            return None
        renew = coordinator.save_notice(notice.writer, notice.directory, notice.step, notice.active,
                                        bound=notice.bound, incarnation=notice.incarnation, save_id=notice.save_id)
        where = f"a checkpoint into {notice.directory}" + (f" at global_step {notice.step}" if notice.step is not None
                                                           else "")  # (a first notice may not know it)
        if renew is None:  # (answered "send no more": its sender stops; one line per process and task)
            log.warning("%s: %s's notice of %s ignored: it is of process %s, earlier than one of that worker heard "
                        "of since (a killed process's late notice; or, if that process is the live one, its clock "
                        "is behind the other's: its saves hold no sync step)", self.task_name, notice.writer, where,
                        notice.incarnation)
        elif notice.active and notice.writer not in self._saving:
            self._saving.add(notice.writer)
            log.info("%s: %s is saving %s; a sync step waits for it without timing out", self.task_name,
                     notice.writer, where)  # (ssp: the others wait for its clock, not declaring it lost)
        elif not notice.active:
            self._saving.discard(notice.writer)
            log.info("%s: %s saved %s; its sync steps' timeout runs again", self.task_name, notice.writer, where)
        return renew

    def registered(self, worker: str, incarnation: int | None = None) -> None:
        """A process of ``worker`` registered (``incarnation``: that process, when known): a save an earlier
        process told of is over (its chief is gone)."""
        coordinator = self.aggregator or self.staleness
        if coordinator is not None:
            coordinator.registered(worker, incarnation)

    def abort(self, reason: str) -> None:
        """A restore begins: sync pushes waiting for a step give up with ``reason``."""
        if self.aggregator is not None:
            self.aggregator.abort(reason)

    def restored_at(self, step: int | None) -> None:
        """A checkpoint of global step ``step`` was loaded here: off the step task the sync count starts over
        there (ps task 0's is global_step itself, which the load set), so the workers' gradients of step
        ``step`` are this task's too."""
        if step is not None and self.aggregator is not None and self._clock.global_step is None:
            self._clock.restart_sync(step)
            self.aggregator.reset()

    def restart(self, step: int | None) -> None:
        """The restore is complete (``SetReady`` of a generation): the sync step starts over at ``step``."""
        if step is not None and self.aggregator is not None:
            self._clock.restart_sync(step)
            self.aggregator.reset()

    def stats(self) -> dict[str, Any]:
        """The aggregator's and the ssp clock's counters."""
        out: dict[str, Any] = {}
        if self.aggregator is not None:
            out.update(self.aggregator.stats())
        if self.staleness is not None:
            out.update(self.staleness.stats())
        return out
