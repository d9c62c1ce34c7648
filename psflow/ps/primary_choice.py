"""Which member serves a replicated ps shard, decided from its members' ``ReplicaStatus``: a pure function.

:func:`decide` is the rule :class:`~psflow.ps.failover.ShardRouter` follows (its module docstring says
when it is asked): route to the primary holding the variables at the highest epoch; else promote the
first backup in member order holding them, only over a primary proven gone or one that answered it is
not the primary; drop a backup only when it is proven gone; wait for a member that is merely slow.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from psflow.ps.protocol.replication import ReplicaStatusReply

__all__ = ["Decision", "WAIT", "decide"]


@dataclass(frozen=True)
class Decision:
    """What :func:`decide` concludes from a shard's members' statuses.

    Attributes:
        action: ``route`` (requests go to ``task``, primary at ``epoch``), ``promote`` (send
            ``Promote`` to backup ``task`` at ``epoch``), ``drop`` (ask the primary ``primary`` to drop
            its unreachable backup ``task`` from its view at ``epoch``) or ``wait`` (no member can
            serve yet: ask again after a backoff).
        task: the member the action names ("" for ``wait``).
        epoch: the epoch the action is for (``route``: the primary's; else the expected one).
        primary: (``drop``) the primary the request goes to.
        has_state: (``route``) the primary holds the variables.
    """

    action: str
    task: str = ""
    epoch: int = 0
    primary: str = ""
    has_state: bool = True


WAIT = Decision("wait")


def decide(members: Sequence[str], statuses: Mapping[str, ReplicaStatusReply | None], *,
           known: tuple[str, int | None], unreachable_error: bool, gone: Collection[str] = ()) -> Decision:
    """Where a shard's requests go, from its members' ``ReplicaStatus`` (None: did not answer); pure.

    Args:
        members: the shard's members, in member order.
        statuses: member -> its status, or None.
        known: the primary and epoch the client routed by when its request failed.
        unreachable_error: the request failed as unreachable or late (not as refused): a backup the
            client cannot reach either is dropped from an unchanged primary's view.
        gone: the members that did not answer and are proven gone (:meth:`ShardRouter.gone`): only
            over such a primary (or one that answered that it is not primary) is a backup promoted, and
            only such a backup is dropped; a member that is merely slow to answer is waited for.

    Returns:
        See :class:`Decision` and the module docstring's rules.
    """
    answered = {t: s for t, s in statuses.items() if s is not None}
    holders = [s for s in answered.values() if s.has_state]
    if not holders:  # a fresh cluster, or every replica lost: the empty primary at the highest epoch
        empty = [s for s in answered.values() if s.role == "primary"]
        if not empty:
            return WAIT
        best = max(empty, key=lambda s: s.epoch)
        return Decision("route", best.task, best.epoch, has_state=False)
    top = max(s.epoch for s in holders)
    primaries = [s for s in holders if s.role == "primary" and s.epoch >= top]
    if primaries:
        best = max(primaries, key=lambda s: s.epoch)
        if (best.task, best.epoch) == known and unreachable_error:
            silent = [b for b in best.backups if statuses.get(b) is None]
            lost = [b for b in silent if b in gone]
            if lost:
                return Decision("drop", lost[0], best.epoch, primary=best.task)
            if silent:
                return WAIT  # slow, not proven gone: asked again until it answers or is
        return Decision("route", best.task, best.epoch)
    for task in members:
        s = answered.get(task)
        if s is not None and s.has_state and s.epoch == top and s.role == "backup":
            # Its primary answered, but not as the primary holding the state (else it was routed to above),
            # or it is proven gone: promote. A primary that merely did not answer yet is waited for.
            primary = s.primary
            if not primary or primary in gone or statuses.get(primary) is not None:
                return Decision("promote", task, top)
            return WAIT
    return WAIT


