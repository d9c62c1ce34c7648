"""A replicated shard's view as one member sees it: the epoch, the primary, the backups, and this member's role.

Rules (issue 28's design, :mod:`psflow.ps.replication`):

* The epoch only grows. A member refuses entries (``Replicate``) of an epoch older than its own with ABORTED
  (:class:`~psflow.rpc.api.FencedOff`: the epoch is the shard's fencing token) starting ``deposed``, naming the
  primary and epoch it knows: the sender tells by that status that it may be deposed
  (:mod:`psflow.ps.replication.forwarder`), never by the text.
* ``Promote(expected_epoch)`` is a compare-and-set: accepted by a member with state whose epoch equals
  ``expected_epoch``; it becomes primary at ``expected_epoch + 1``. Asked again, a member already primary at
  ``expected_epoch + 1`` answers its status (idempotent). Anything else: FAILED_PRECONDITION naming the
  member's epoch and primary.
* A primary that learns of a higher epoch is deposed (:mod:`psflow.ps.replication.deposed`).
* Roles: ``primary``, ``backup`` (in the primary's view, holding every acknowledged entry), ``joining``
  (rebuilding from the primary's snapshot), ``deposed``.
* A member rebuilding from a primary (``Join``) takes that primary's entries only from the sender its newest
  Join started (:meth:`ViewState.check_sender`): a call of an older sender (to this member's earlier process,
  started before the Join, or started by an earlier Join of this process whose reply was lost) can be held up
  in the network and served after the new sender's, and its view ("not in the view", or "in it" before the
  Join took the member out) would override the newer one. Each Join a process sends has a new, higher id
  (:meth:`ViewState.next_join_id`), which its sender's calls carry.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace

from psflow.rpc.api import FencedOff, PreconditionFailed

__all__ = ["PRIMARY", "BACKUP", "JOINING", "DEPOSED", "View", "ViewState"]

PRIMARY, BACKUP, JOINING, DEPOSED = "primary", "backup", "joining", "deposed"


@dataclass(frozen=True)
class View:
    """One member's view: ``epoch`` (0: none yet), ``primary`` (None: unknown), ``backups``, its ``role``."""

    epoch: int
    primary: str | None
    backups: tuple[str, ...]
    role: str

    def describe(self) -> str:
        return f"primary {self.primary or 'unknown'} at epoch {self.epoch}"


class ViewState:
    """The view of member ``task`` of shard ``shard``, and its transitions. Thread-safe."""

    def __init__(self, task: str, shard: int, members: tuple[str, ...]) -> None:
        self.task, self.shard, self.members = task, shard, members
        self._lock = threading.Lock()
        #: Held by the member while it becomes primary (:meth:`promote` or :meth:`start_primary`, then its
        #: forwarder made): its view says primary before it can serve as one; :meth:`settled` waits for it.
        self.becoming = threading.RLock()
        self._view = View(0, None, (), JOINING)
        #: The primary this member's latest Join went to, and the epoch of its reply (None: not answered yet).
        self._join: tuple[str, int | None] | None = None
        #: The id of the latest Join this process sent (0: none yet); only its sender's calls are taken.
        self._join_id = 0

    @property
    def view(self) -> View:
        return self._view

    def settled(self) -> View:
        """The view once no becoming primary of this member is under way (:attr:`becoming` waited for)."""
        with self.becoming:
            return self._view

    def set(self, view: View) -> View:
        with self._lock:
            self._view = view
        return view

    def start_primary(self, epoch: int, backups: tuple[str, ...]) -> View:
        """This member is the primary at ``epoch`` (a fresh cluster: epoch 1)."""
        return self.set(View(epoch, self.task, backups, PRIMARY))

    def promote(self, expected_epoch: int, has_state: bool) -> tuple[View, bool]:
        """The compare-and-set of ``Promote``: (the view after it, whether this call changed it).

        Raises:
            PreconditionFailed: this member has no state, or its epoch is not ``expected_epoch`` (and it is not
                primary at ``expected_epoch + 1`` already); names its epoch and primary.
        """
        with self._lock:
            view = self._view
            if view.role == PRIMARY and view.epoch == expected_epoch + 1:
                return view, False
            if not has_state or view.epoch != expected_epoch or view.role != BACKUP:
                raise PreconditionFailed(
                    f"{self.task}: cannot promote shard {self.shard} at epoch {expected_epoch}: this member is "
                    f"{view.role} at epoch {view.epoch}, {view.describe()}"
                    + ("" if has_state else ", and holds no state"))
            others = tuple(m for m in self.members if m not in (self.task, view.primary))
            self._view = View(expected_epoch + 1, self.task, others, PRIMARY)
            return self._view, True

    def drop_backup(self, expected_epoch: int, backup: str, checked: View | None = None) -> tuple[View, bool]:
        """``DropBackup`` on the primary: goes to ``expected_epoch + 1`` without ``backup``. A member that is no
        backup of the view at ``expected_epoch`` is not dropped (``(view, False)``): nothing waits for it, and a
        joining one (out of the backups until it caught up, at the same epoch: a restarted member's Join) keeps
        its Join's sender, else it would wait for entries for ever. Nor is one that was no backup of ``checked``
        (the view the caller read to ask the backup whether it answers): it caught up since, unasked, and
        dropping it would stop its sender before the entry telling it the view reached it (joining for good).

        Raises:
            PreconditionFailed: not the primary, or at another epoch (names both).
        """
        with self._lock:
            view = self._view
            if view.role == PRIMARY and view.epoch == expected_epoch + 1 and backup not in view.backups:
                return view, False
            if view.role != PRIMARY or view.epoch != expected_epoch:
                raise PreconditionFailed(f"{self.task}: cannot drop {backup} from shard {self.shard} at epoch "
                                         f"{expected_epoch}: this member is {view.role} at epoch {view.epoch}, "
                                         f"{view.describe()}")
            if backup not in view.backups or checked is not None and backup not in checked.backups:
                return view, False
            self._view = replace(view, epoch=view.epoch + 1, backups=tuple(b for b in view.backups if b != backup))
            return self._view, True

    @property
    def join_in_flight(self) -> bool:
        """Whether this member sent a Join not answered yet (:meth:`begin_join`, then :meth:`joined`)."""
        with self._lock:
            return self._join is not None and self._join[1] is None

    def begin_join(self, primary: str) -> None:
        """This member is about to send ``primary`` a Join: from now on it takes ``primary``'s entries only from
        the sender that Join starts (:meth:`check_sender`); a backup is joining (it holds no more than it did,
        and the primary will not wait for it until it caught up again)."""
        with self._lock:
            self._join = (primary, None)
            if self._view.role == BACKUP:
                self._view = replace(self._view, backups=(), role=JOINING)

    def next_join_id(self) -> int:
        """The id of the Join this member is about to send (each one higher); from now on only the sender that
        Join starts is taken (:meth:`check_sender`)."""
        with self._lock:
            self._join_id += 1
            return self._join_id

    def joined(self, epoch: int, primary: str) -> View:
        """``primary`` answered this member's Join at ``epoch``: the member is joining it, unless the Join's
        sender already told it a view of ``primary`` at that epoch (its calls may be served before the reply is
        read) or a newer epoch came meanwhile; those are newer than the reply and are kept."""
        with self._lock:
            self._join = (primary, epoch)
            view = self._view
            if view.epoch < epoch or (view.epoch == epoch and (view.primary != primary
                                                                or view.role not in (JOINING, BACKUP))):
                self._view = View(epoch, primary, (), JOINING)
            return self._view

    def check_sender(self, primary: str, epoch: int, incarnation: int | None, mine: int,
                     join_id: int | None = None) -> None:
        """``Replicate`` from ``primary`` at ``epoch``, for process ``incarnation`` of this member (None: a
        sender started without a Join) and its Join ``join_id`` (None: not sent); this process is ``mine``.

        Raises:
            PreconditionFailed: the entries are for another process of this member, or for a Join of this one
                other than its newest, or were sent without a Join by ``primary`` after this member sent it
                one, at the Join's epoch or before (all three: a sender the primary has replaced); names the
                member, the primary and the incarnations or Join ids.
        """
        if incarnation is not None and incarnation != mine:
            raise PreconditionFailed(f"{self.task}: entries of {primary} for process {incarnation} of this member "
                                     f"refused: this is process {mine} (a call of a replaced sender)")
        newest = self._join_id
        if incarnation is not None and join_id is not None and join_id != newest:
            raise PreconditionFailed(f"{self.task}: entries of {primary} for Join {join_id} of this process "
                                     f"refused: its newest Join is {newest} (a call of a replaced sender)")
        join = self._join
        if incarnation is None and join is not None and join[0] == primary and (join[1] is None or epoch <= join[1]):
            raise PreconditionFailed(f"{self.task}: entries of {primary} at epoch {epoch} sent without a Join "
                                     "refused: this member joined it since (a call of a replaced sender)")

    def check_entries(self, epoch: int, primary: str) -> View:
        """``Replicate`` from ``primary`` at ``epoch``: accepted at this member's epoch or a newer one (the view
        moves on to it).

        Raises:
            FencedOff: ``deposed: ...``: the entries are of an older epoch, or of this epoch while this member is its
                primary (ABORTED: the sender's epoch superseded here; it asks who is primary, deposed.py).
        """
        with self._lock:
            view = self._view
            if epoch < view.epoch or (epoch == view.epoch and view.role == PRIMARY and primary != self.task):
                raise FencedOff(f"deposed: shard {self.shard}'s primary is {view.primary} at epoch "
                                f"{view.epoch}; entries of {primary} at epoch {epoch} refused")
            if epoch > view.epoch or view.primary != primary:
                self._view = replace(view, epoch=epoch, primary=primary)
            return self._view

    def learn(self, epoch: int, primary: str | None, backups: tuple[str, ...], role: str) -> View:
        """Sets the view to what the primary said (a Join's or a Replicate's), epoch never going back."""
        with self._lock:
            if epoch >= self._view.epoch:
                self._view = View(epoch, primary, backups, role)
            return self._view
