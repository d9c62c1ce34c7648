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

Ends (a save holds nothing for ever, and an error names only a save somebody is or was doing for this step):

* its end notice;
* its bound: a notice carries the save's ``--save-timeout`` (``bound``); a save longer than that holds no step
  past ``bound`` seconds after its start, even if notices still came (the chief stops sending them then:
  :mod:`psflow.checkpoint.save_notice`), so a save stuck in storage fails the step ``timeout`` seconds later,
  and the error names the save and the flag instead of the run hanging;
* its chief gone: a registration of a later process of the writer (:meth:`SaveHold.registered`: its restarted
  process; on a replicated shard's backup, which sees no ``Register``, a newer process of the writer in the
  primary's entries, :mod:`psflow.ps.replication.snapshot`) or a notice of a later process of it or of another
  worker (a new chief) ends it at once, as an end notice would (a sign of life: the step's timeout runs again
  from then);
* a restore (:meth:`SaveHold.forget`).

Processes: a notice and a ``Register`` carry the writer's process (``incarnation``, its client's start time in
ns, as its pushes do). A notice of a process of the writer earlier than one heard of (a notice or a registration
of a later one: the killed chief's late call, or its notice thread outliving it) changes nothing: it ends no
save, starts none, and is answered "send no more" (:meth:`SaveNotices.save_notice` returns None). The saving
process's own ``Register`` (its client registering again mid-save) ends nothing either, so its save keeps its
start and its bound; a registration without a process (a client older than this field) ends the save as before.

Saves: a notice also names its save among its process's (``save_id``, a counter per process). A notice of a save
of that process whose end was heard, or older than one heard ending, changes nothing: a renewal sent before the end
notice but arriving after it (the notice thread's call in flight as the save ended,
:mod:`psflow.checkpoint.save_notice`) used to reopen the save, which then held the steps up to its bound; and an
end notice of the previous save arriving once the next is under way ends nothing. A notice without an id (a client
older than the field) follows the rules above as before.

:meth:`SaveHold.describe` names a save under way, and one that ended after the step began collecting (it held
that step); an older one held nothing of it and is not named.

Guarantees: nothing is applied or dropped for a notice; a notice of a worker the step does not wait for changes
nothing. Thread-safety: the caller (the :class:`~psflow.ps.sync.SyncAggregator`, or in ssp mode the
:class:`~psflow.ps.staleness.StalenessClock`, which holds a saving slowest worker's clock the same way) holds
its lock around every method.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from psflow.ps.sync import SyncConfig

__all__ = ["ChiefSave", "SaveHold", "SaveNotices"]


@dataclass
class ChiefSave:
    """One worker's save, as its notices told it (times on the ps task's clock)."""

    worker: str
    directory: str
    step: int | None
    started: float
    heard: float  # the newest notice
    ended: float | None = None  # its end notice (or its chief gone), if one came
    bound: float | None = None  # its --save-timeout: it holds nothing past started + bound
    incarnation: int | None = None  # the writer's process
    save_id: int | None = None  # which save of that process (None: a client that does not say)
    why: str = ""  # how it ended, when not by its end notice

    def held_until(self) -> float:
        """The newest time it holds a step from (its newest notice, at most its bound)."""
        return self.heard if self.bound is None else min(self.heard, self.started + self.bound)


class SaveHold:
    """The saves the workers of this task's sync steps told it of (see the module docstring)."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._saves: dict[str, ChiefSave] = {}
        self._newest: dict[str, int] = {}  # each worker's latest process heard of (a notice or a registration)
        self._ended: dict[str, tuple[int | None, int]] = {}  # each worker's (process, newest save id) heard ending

    def notice(self, worker: str, directory: str, step: int | None, active: bool, *, bound: float | None = None,
               incarnation: int | None = None, save_id: int | None = None) -> ChiefSave | None:
        """Records a notice of ``worker``'s save; returns the save as now known, or None: the notice is of a process
        of ``worker`` earlier than one heard of, and changes nothing. An active one ends every other save under
        way: an earlier process's of ``worker`` or another worker's (a new chief). A notice of a save (``save_id``)
        of this process whose end was heard already, or that is older than one heard ending, changes nothing either
        (a renewal overtaken by its save's end notice; a late end of the save before): the save as known is
        returned."""
        if self._earlier(worker, incarnation):
            return None
        now = self._clock()
        save = self._saves.get(worker)
        if self._ended_already(worker, incarnation, save_id):
            return save if save is not None and save.save_id == save_id else ChiefSave(
                worker, directory, step, now, now, ended=now, bound=bound, incarnation=incarnation, save_id=save_id)
        if not active and save_id is not None:
            self._ended[worker] = (incarnation, save_id)
        if (not active and save is not None and save.ended is None and save_id is not None
                and save.save_id is not None and save.incarnation == incarnation and save_id < save.save_id):
            return save  # the end of an earlier save of this process: the one under way goes on
        if active:
            for other in self._saves.values():
                if other.ended is None and (other.worker != worker or other.incarnation != incarnation):
                    other.heard = other.ended = now
                    other.why = (f"its process ended (a later one of {worker} saves)" if other.worker == worker
                                 else f"{worker} saves now")
        if save is None or save.ended is not None or save.directory != directory or save.save_id != save_id:
            if not active and save is not None and save.ended is None:
                save.heard = save.ended = now  # the end of the save under way (its step hint may differ)
                return save
            save = self._saves[worker] = ChiefSave(worker, directory, step, now, now, bound=bound,
                                                   incarnation=incarnation, save_id=save_id)
        save.heard = now
        save.step = step if step is not None else save.step  # (its first notice may not know it yet)
        save.bound = bound if bound is not None else save.bound
        if not active:
            save.ended = now
        return save

    def registered(self, worker: str, incarnation: int | None = None) -> bool:
        """A process of ``worker`` registered (``incarnation``: that process, None from a client that does not say),
        or a backup learnt of it from its primary: a save of its under way by an earlier process (or, None, by
        any) is over, its process gone; the saving process's own registration ends nothing. Returns whether one
        was."""
        if self._earlier(worker, incarnation):
            return False  # (a backup learning late of a process it has heard a later one of)
        save = self._saves.get(worker)
        if save is None or save.ended is not None:
            return False
        if incarnation is not None and save.incarnation is not None and save.incarnation >= incarnation:
            return False  # that process's own save (its notice reached this member before its incarnation)
        save.heard = save.ended = self._clock()
        save.why = "its process ended (a new one registered)"
        return True

    def _ended_already(self, worker: str, incarnation: int | None, save_id: int | None) -> bool:
        """Whether save ``save_id`` of process ``incarnation`` of ``worker`` is one heard ending, or older."""
        if save_id is None or worker not in self._ended:
            return False
        process, newest = self._ended[worker]
        return process == incarnation and save_id <= newest

    def _earlier(self, worker: str, incarnation: int | None) -> bool:
        """Whether ``incarnation`` is a process of ``worker`` earlier than one heard of; else records it as the
        latest (None: unknown, never earlier)."""
        if incarnation is None:
            return False
        if incarnation < self._newest.get(worker, incarnation):
            return True
        self._newest[worker] = incarnation
        return False

    def heard(self, missing: Iterable[str]) -> float | None:
        """The newest notice of a save by any of ``missing`` (the workers a step waits for), at most each save's
        bound after its start, or None."""
        times = [self._saves[w].held_until() for w in missing if w in self._saves]
        return max(times) if times else None

    def describe(self, missing: Iterable[str], since: float | None = None) -> str:
        """``"; /job:worker/task:0 was saving checkpoint into DIR at global_step 130 (for 41.2 s, last heard of
        30.1 s ago)"``, for each of ``missing`` whose save is under way, or ended after ``since`` (the step's
        first contribution: it held that step), or ``""``."""
        now = self._clock()
        parts = []
        for worker in missing:
            save = self._saves.get(worker)
            if save is None or (save.ended is not None and since is not None and save.ended < since):
                continue
            where = f"into {save.directory} at global_step {save.step if save.step is not None else '?'}"
            if save.ended is None and save.bound is not None and now - save.started >= save.bound:
                parts.append(f"{worker} was saving a checkpoint {where} for {now - save.started:.1f} s, longer than "
                             f"its --save-timeout ({save.bound:g} s): not waited for past that (stuck in storage?)")
            elif save.ended is None:
                parts.append(f"{worker} was saving a checkpoint {where} (for {now - save.started:.1f} s, its save "
                             f"last heard of {now - save.heard:.1f} s ago: the chief died or hung while saving?)")
            elif save.why:
                parts.append(f"{worker}'s checkpoint save {where} ended unfinished {now - save.ended:.1f} s ago: "
                             f"{save.why}")
            else:
                parts.append(f"{worker} saved a checkpoint {where} in {save.ended - save.started:.1f} s, which ended "
                             f"{now - save.ended:.1f} s ago")
        return "".join(f"; {p}" for p in parts)

    def forget(self) -> None:
        """Drops every save (a restore starts over); the processes heard of are kept (a process does not
        become newer by a restore)."""
        self._saves.clear()


class SaveNotices:
    """The save-notice calls of a coordinator that keeps a :class:`SaveHold` under its lock (the sync step,
    :class:`~psflow.ps.sync.SyncAggregator`, and the ssp clock, :class:`~psflow.ps.staleness.StalenessClock`):
    one place for both modes."""

    config: SyncConfig
    _cond: threading.Condition
    _hold: SaveHold

    def save_notice(self, worker: str, directory: str, step: int | None, active: bool, *,
                    bound: float | None = None, incarnation: int | None = None,
                    save_id: int | None = None) -> float | None:
        """``worker``'s checkpoint save started, goes on or (not ``active``) ended: while it lasts, up to ``bound`` s
        after its start, a step or wait held up by it does not time out. Returns the seconds within which to renew
        the notice, or None: the notice is of an earlier process of ``worker`` than one heard of, ignored (send
        no more)."""
        with self._cond:
            if self._hold.notice(worker, directory, step, active, bound=bound, incarnation=incarnation,
                                 save_id=save_id) is None:
                return None
            self._heard_from(worker)
            self._cond.notify_all()
        return self.config.timeout / 4

    def registered(self, worker: str, incarnation: int | None = None) -> None:
        """A process of ``worker`` (``incarnation``) registered: a save of an earlier one holds nothing."""
        with self._cond:
            if self._hold.registered(worker, incarnation):
                self._cond.notify_all()

    def _heard_from(self, worker: str) -> None:
        """A notice of ``worker`` came (under the lock): what else the coordinator counts as its sign of life."""
