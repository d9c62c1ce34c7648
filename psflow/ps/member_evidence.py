"""What one client knows of a replicated shard's members' liveness: who answered, who fell silent, who refused.

:class:`~psflow.ps.failover.ShardRouter` promotes a backup over a primary (or drops a backup) only once that member
is *provably gone*; :class:`MemberEvidence` keeps the evidence and says (:meth:`MemberEvidence.gone`) whether it
proves that:

* the member refused the connection after this client had reached it once (nothing listens at its address: the
  process died). A refusal by a member this client never reached proves nothing (a channel may keep the refusal of
  a connection tried before the task listened: a worker starting beside its ps tasks once promoted a backup that
  way, the primary alive);
* or it answered *nothing*, no status and no call, for ``failover_timeout`` seconds, counted from the first call
  left unanswered after its latest answer (idle time between calls is no silence);
* or, a member that never answered this client (nor anything it inherited, :meth:`MemberEvidence.inherit`): it is
  *not yet up*, not silent, and counts as gone only after ``start_timeout`` seconds without an answer (the client's
  ``connect_timeout``, which covers a slow start of a whole cluster), counted from the first call left unanswered.
  Silence before a member's first answer never counts against ``failover_timeout``: beside CPU hogs ps tasks took
  11.5-12 s to serve, and the launcher, asking from its start, promoted ps:0's backup over a primary that had just
  taken the fresh shard (``--ps-failover-timeout`` 10 s);
* unless a backup holding the shard's variables names it its primary (:meth:`MemberEvidence.named`): then it was
  up (a backup holds the variables only once its primary started the shard, or a view, and sent them), and its
  silence counts against ``failover_timeout`` from the first call left unanswered once this client saw that. A
  worker restarted after its shard's primary died (nobody promoted yet) waits ``failover_timeout``, not
  ``start_timeout``; a primary slow to start is still not promoted over: no backup holds anything under it before
  it started the shard. (Not a primary's backups: a fresh shard's primary lists every member it waited for, up or
  not.)

Guarantees: an answer of any kind (a reply, or an error its process gave, e.g. FAILED_PRECONDITION) clears the
member's silence and refusal at once; a call sent before the member's latest answer never starts a silence (an
answer may overtake a late reply); nothing here ever sends a call or sleeps. A router started at another's view
(a save's client beginning where the data client routes) inherits that one's evidence: a member the data client
reached is reached for it too, so a refusal of its dead process is proof at once.

Not thread-safe by itself: its router's (one thread, or :func:`~psflow.ps.failover.resolve_all`'s distinct shards,
whose members are distinct).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from psflow.rpc.api import DeadlineExceededError, RpcError, TaskUnavailableError

__all__ = ["MemberEvidence", "refused"]


class MemberEvidence:
    """One client's record of which shard members answered, fell silent or refused; see the module docstring."""

    def __init__(self, failover_timeout: float, start_timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``failover_timeout``: seconds of silence that prove a member that had answered gone; ``start_timeout``:
        those that prove one that never answered gone; ``clock``: what silences are measured by."""
        self.failover_timeout = failover_timeout
        self.start_timeout = start_timeout
        self._clock = clock
        # Per member: when it last answered anything; since when it has answered nothing (the first call left
        # unanswered after that); whether it refused a connection after it had answered (its process is gone).
        self._answered: dict[str, float] = {}
        self._silent_since: dict[str, float] = {}
        self._refused: set[str] = set()
        # Per member that never answered: since when it is known to have been up, and who said so (named()).
        self._named: dict[str, tuple[float, str]] = {}

    @property
    def any_silent(self) -> bool:
        """Whether some member's silence is being counted (an answer from it would end it)."""
        return bool(self._silent_since)

    def reached(self, task: str) -> None:
        """Member ``task``'s process answered this client through another service at its address: from now on a
        refused connection proves it gone, as after a status it answered. A silence counted before its first
        answer ends here (it was not up yet)."""
        if task not in self._answered:
            self._answered[task] = self._clock()
            self._silent_since.pop(task, None)

    def first_answers(self, tasks: Iterable[str]) -> None:
        """Each of ``tasks`` answered a call just now: recorded where it is the member's first answer (the calls a
        client makes while nothing is silent are not recorded one by one: only a first answer changes what proves
        a member gone)."""
        for task in tasks:
            if task not in self._answered:
                self.reached(task)

    def named(self, task: str, at: float, by: str) -> None:
        """Member ``by``'s status, asked at ``at``, says it is a backup holding the shard's variables under primary
        ``task``: ``task`` was up. Where it never answered this client, its silence counts against ``failover_timeout``
        from the first call left unanswered at or after ``at`` (the earliest such naming kept)."""
        if task not in self._answered and task not in self._named:
            self._named[task] = (at, by)

    def inherit(self, other: MemberEvidence) -> None:
        """Starts from what ``other`` (another client's router's evidence, e.g. the data client's) knows: per member,
        the record of whichever of the two heard it last (when it answered, the silence counted since, a refusal held
        as proof); of a member neither ever heard, the earlier start of its silence."""
        for task in other._answered.keys() | other._silent_since.keys():
            mine, theirs = self._answered.get(task), other._answered.get(task)
            if theirs is None:
                if mine is None and (since := other._silent_since.get(task)) is not None:
                    self._silent_since[task] = min(since, self._silent_since.get(task, since))
                continue
            if mine is not None and mine > theirs:
                continue  # this one heard it later: its own record stands
            self._answered[task] = theirs
            if (since := other._silent_since.get(task)) is not None:
                self._silent_since[task] = since
            else:
                self._silent_since.pop(task, None)
            if task in other._refused:
                self._refused.add(task)
            else:
                self._refused.discard(task)
        for task, (at, by) in other._named.items():
            mine_named = self._named.get(task)
            if task not in self._answered and (mine_named is None or at < mine_named[0]):
                self._named[task] = (at, by)

    def heard(self, task: str) -> None:
        """``task`` answered (a reply, or a refusal its process gave): it is not gone."""
        self._answered[task] = self._clock()
        self._silent_since.pop(task, None)
        self._refused.discard(task)

    def unanswered(self, task: str, sent: float, error: RpcError) -> None:
        """A call to ``task`` sent at ``sent`` failed: unanswered (unreachable, late), or answered (refused)."""
        if not isinstance(error, TaskUnavailableError | DeadlineExceededError):
            self.heard(task)  # its process refused the call: it is there
            return
        answered = self._answered.get(task)
        if answered is not None and sent < answered:
            return  # it answered after this call was sent
        self._silent_since.setdefault(task, sent)
        # A refused connection proves the process gone only once this client had reached it: a channel may hold
        # the refusal of a connection tried before the task listened (a worker starting beside its ps tasks).
        if answered is not None and refused(error):
            self._refused.add(task)

    def gone(self, task: str) -> str | None:
        """Why member ``task`` counts as gone (a refused connection after it had answered, nothing answered for
        ``failover_timeout`` s, or never an answer for ``start_timeout`` s), or None: it answered, or is only slow
        (or not up) so far."""
        if task in self._refused:
            return "refused the connection"
        since = self._silent_since.get(task)
        if since is None:
            return None
        silent = self._clock() - since
        if task not in self._answered:
            if (named := self._named.get(task)) is not None:
                up = self._clock() - max(since, named[0])
                if up >= self.failover_timeout:
                    return f"answered nothing for {up:.1f} s since {named[1]}'s view named it (it never answered here)"
            return f"never answered in {silent:.1f} s" if silent >= self.start_timeout else None
        return f"answered nothing for {silent:.1f} s" if silent >= self.failover_timeout else None


def refused(error: RpcError) -> bool:
    """Whether ``error`` says the task's host refused the connection: nothing listens at its address, so
    its process is gone (gRPC's and the tcp carrier's words for ECONNREFUSED)."""
    return isinstance(error, TaskUnavailableError) and "connection refused" in str(error).lower()
