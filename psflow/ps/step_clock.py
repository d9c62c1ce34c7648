"""The clocks of one ps task: global_step, the newest step the clients reported, the sync step.

* ``global_step`` lives on the task holding it (ps task 0), with its journal
  (:mod:`psflow.ps.global_step`): every push that steps it takes one value.
* Elsewhere the clock is the newest global_step a client reported with a
  request (its step hint): it may lag global_step by the pushes in flight, and
  is never ahead of it, so a dynamic table row's age is never over-estimated.
  A hint is taken without a lock: a concurrent smaller one may win, and the
  next one corrects it (it only ever lags).
* In sync mode every task counts the steps it applied (ps task 0's count is
  global_step itself); schedules and moving averages read that count there.

Which step a schedule reads when an update is applied (TF's order: the value
before the push's increment) is :meth:`StepClock.table_step` in async and ssp
mode, :meth:`StepClock.sync_step` in sync mode.
"""

from __future__ import annotations

from psflow.ps.global_step import GlobalStep, StepJournal

__all__ = ["StepClock"]


class StepClock:
    """global_step (or the newest step heard of) and the sync step count of one ps task. Thread-safe."""

    def __init__(self, *, holds_global_step: bool, journal: StepJournal | None = None) -> None:
        """Args:
            holds_global_step: global_step lives here (ps task 0).
            journal: where global_step's bound survives a restart of this task; ignored elsewhere.

        Raises:
            StepJournalError: the journal file is damaged.
        """
        #: global_step, on the task holding it (None elsewhere).
        self.global_step = GlobalStep(journal=journal) if holds_global_step else None
        # In sync mode every task counts its own applied steps (ps 0's counter is global_step).
        self._sync_step = self.global_step if self.global_step is not None else GlobalStep()
        self._heard = 0

    def hear(self, step: int | None) -> None:
        """A client reported ``step`` as the newest global_step it knows (None: it knows none)."""
        if step is not None and step > self._heard:
            self._heard = step  # a benign race: a concurrent smaller hint may win, the next one corrects it

    def table_step(self) -> int:
        """The dynamic tables' clock and an async update's schedule step: global_step here, else the newest
        step a client reported."""
        return self.global_step.value if self.global_step is not None else self._heard

    def sync_step(self) -> int:
        """The sync step this task is collecting (the steps it applied)."""
        return self._sync_step.value

    def advance_sync(self) -> int:
        """A sync step was applied here: the count moves on by one; returns the new value."""
        return self._sync_step.increment()

    def restart_sync(self, step: int) -> None:
        """(A restore) this task's sync count starts over at ``step``; on the task holding global_step the
        count is global_step itself, which the restore sets, so nothing changes there."""
        if self.global_step is None:
            self._sync_step.set(step)

    def replica_state(self) -> dict[str, int | str | None]:
        """What a replicated shard's backup needs to hold this clock (:mod:`psflow.ps.replication`): the counts,
        and ``journal_run``, the run global_step hands values out for (:attr:`~psflow.ps.global_step.GlobalStep.run`;
        None: none named, or not the task holding global_step)."""
        step = self.global_step
        return {"global_step": step.value if step is not None else None, "sync_step": self._sync_step.value,
                "heard": self._heard, "journal_run": step.run if step is not None else None}

    def load_replica_state(self, state: dict[str, int | str | None]) -> None:
        """Sets this clock to ``state`` (a :meth:`replica_state` of the shard's primary). global_step follows the
        primary's (:meth:`~psflow.ps.global_step.GlobalStep.follow`): its journal names the primary's run from
        then on, as the primary's does (a state without ``journal_run``, of an older primary: the journal's run is
        kept), and bounds the primary's values.

        Raises:
            StepJournalError: global_step's journal could not be written.
        """
        step, sync_step, heard = state.get("global_step"), state.get("sync_step"), state.get("heard")
        run = state.get("journal_run")
        if isinstance(step, int) and self.global_step is not None:  # its journal bounds the primary's values too
            self.global_step.follow(step, run=run if isinstance(run, str) else None)
        if isinstance(sync_step, int) and self._sync_step is not self.global_step:
            self._sync_step.set(sync_step)
        if isinstance(heard, int):
            self._heard = heard
