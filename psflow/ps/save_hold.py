"""A chief's checkpoint save as a ps task's sync steps see it: a save under way holds a step, it does not time out.

The chief's saver runs in its training loop, between two of its pushes (TF's CheckpointSaverHook does too), so
in sync mode (:mod:`psflow.ps.sync`) the other workers' gradients for the next step wait for the chief's while it
saves. TF's SyncReplicas waits for ever; psflow's sync step has a deadline (``--sync-timeout``, a dead or stalled
worker must not hang the run). A save slower than that deadline (a big model, an object store answering slowly
for a while) must not fail the run by itself, so the chief tells every ps task that it saves
(:class:`~psflow.ps.protocol.SaveNoticeRequest`, :mod:`psflow.checkpoint.save_notice`), at the save's start, then
every ``renew_every`` seconds while it lasts (a quarter of the sync timeout), and at its end.

Rule (:meth:`SaveHold.heard`): a missing worker heard saving counts as heard from; a step's deadline is
``timeout`` seconds after the later of its first contribution and the newest notice of a worker it waits for
(the end notice included). So a step does not time out while its missing chief saves and renews its notice,
and gets its whole timeout again once the save ended. A chief that dies while saving sends no more notices:
the step times out ``timeout`` seconds after the last one, as it would have for a silent worker, and the error
names the save (:meth:`SaveHold.describe`: directory, global_step, how long it lasted, when it was last heard
of). The same notices count as signs of life for the rule that backups absorb dead workers.

A held step may outlast the waiting workers' own push deadline (``--rpc-timeout`` + ``--sync-timeout``): a push
that waited ``timeout`` seconds while a save holds its step is answered *held*
(:attr:`~psflow.ps.sync.SyncResult.held`: its gradient stays in the step, and the push is counted then: its
examples and its worker's reader position, as a push applied is, so a worker killed before it sends it again
does not train that batch twice), and the client sends the same push again
(:meth:`psflow.ps.task_calls.TaskCalls.collect`), which waits on and is not counted again (a PushPull's pull is
read only then). A restarted worker's push of the batch its killed process contributed is answered held too.

Guarantees: nothing is applied or dropped for a notice; a notice of a worker the step does not wait for changes
nothing. Thread-safety: the caller (the :class:`~psflow.ps.sync.SyncAggregator`) holds its lock around every
method.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["ChiefSave", "SaveHold"]


@dataclass
class ChiefSave:
    """One worker's save, as its notices told it (times on the ps task's clock)."""

    worker: str
    directory: str
    step: int | None
    started: float
    heard: float  # the newest notice
    ended: float | None = None  # its end notice, if one came


class SaveHold:
    """The saves the workers of this task's sync steps told it of (see the module docstring)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._saves: dict[str, ChiefSave] = {}

    def notice(self, worker: str, directory: str, step: int | None, active: bool) -> ChiefSave:
        """Records a notice of ``worker``'s save; returns the save as now known."""
        now = self._clock()
        save = self._saves.get(worker)
        if save is None or save.ended is not None or (save.directory, save.step) != (directory, step):
            if not active and save is not None and save.ended is None:
                save.heard = save.ended = now  # the end of the save under way (its step hint may differ)
                return save
            save = self._saves[worker] = ChiefSave(worker, directory, step, now, now)
        save.heard = now
        if not active:
            save.ended = now
        return save

    def heard(self, missing: Iterable[str]) -> float | None:
        """The newest notice of a save by any of ``missing`` (the workers a step waits for), or None."""
        times = [self._saves[w].heard for w in missing if w in self._saves]
        return max(times) if times else None

    def describe(self, missing: Iterable[str]) -> str:
        """``"; /job:worker/task:0 was saving checkpoint into DIR at global_step 130 (for 41.2 s, last heard of
        30.1 s ago)"``, for each of ``missing`` that told of a save, or ``""``."""
        now = self._clock()
        parts = []
        for worker in missing:
            save = self._saves.get(worker)
            if save is None:
                continue
            where = f"into {save.directory} at global_step {save.step if save.step is not None else '?'}"
            if save.ended is None:
                parts.append(f"{worker} was saving a checkpoint {where} (for {now - save.started:.1f} s, its save "
                             f"last heard of {now - save.heard:.1f} s ago: the chief died or hung while saving?)")
            else:
                parts.append(f"{worker} saved a checkpoint {where} in {save.ended - save.started:.1f} s, which ended "
                             f"{now - save.ended:.1f} s ago")
        return "".join(f"; {p}" for p in parts)

    def forget(self) -> None:
        """Drops every save (a restore starts over)."""
        self._saves.clear()
